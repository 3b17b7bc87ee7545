#pragma once
// Kernel launches with programmatic dependent launch (PDL, sm_90): a kernel
// launched this way may start while its predecessor in the stream finishes;
// it must call pdl_wait() before touching anything the predecessor writes
// (weights, which no kernel writes, may be loaded before; so may what the
// kernels before the predecessor wrote, since the predecessor itself waited
// for them before it triggered: the decode attention loads its cached keys
// early, the decode GEMV its epilogue's inputs). Every kernel of the decode
// path calls pdl_trigger() after its pdl_wait(): right after it or, with late
// triggers (late_triggers() in kernels.hpp, before the residual-adding
// GEMVs), at the end of its blocks' work; so the next kernel is scheduled
// only once this one's predecessor has finished: at most two grids overlap.
// (Triggering before the wait lets a chain of kernels become resident and
// spin, each holding registers and issuing its weight loads out of order:
// the 8B batch-1 step lost 7% on the H200.) Captured graphs keep these
// programmatic edges. Whether a launch uses it: pdl_active() (kernels.hpp;
// by default on for long prompt steps and chosen per decode graph by the engine,
// METRONOME_PDL=1 or 0 forces it), except that the residual-adding GEMVs
// (both generations; not the skinny GEMM, whose graphs auto never gives PDL)
// launch early only with late triggers (launch_gemv). Off, both calls are
// no-ops and launches serialise as usual.

#include <utility>

#include <cuda_runtime.h>

#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"

namespace metronome::gpu {

/// Waits until the predecessor grid has completed and its writes are visible.
__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

/// Lets the dependent grid be scheduled (once every block of this grid ran
/// it or exited); called after pdl_wait(), never before.
__device__ __forceinline__ void pdl_trigger() {
  asm volatile("griddepcontrol.launch_dependents;");
}

/// The streams of once-read bytes that carry the L2 evict-first hint
/// (l2_policy() in kernel_util.cuh).
enum stream_hint : unsigned {
  hint_gemv_weights = 1,   // the decode GEMV's weight rows
  hint_skinny_weights = 2, // the skinny GEMM's weight tiles
  hint_decode_kv = 4,      // the decode attention's keys and values
};

/// Whether `hint` is on: all are, unless a benchmark set another mask
/// (kernel_generations::stream_hints; METRONOME_STREAM_HINTS in gpu_bench).
inline bool stream_hint_on(stream_hint hint) {
  return (active_kernels().stream_hints & hint) != 0;
}

/// Launches `kernel` on `stream`, with PDL unless disabled or on the legacy
/// default stream; checks the launch.
template <class... Params, class... Args>
void launch_kernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                   size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = (stream != nullptr && pdl_active()) ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess)
    throw_cuda_error(err, name, __FILE__, __LINE__);
  METRONOME_CUDA_LAUNCHED(name);
}

} // namespace metronome::gpu
