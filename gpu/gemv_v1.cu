// Matrix-vector products for decode steps of up to eight sequences, first
// generation (2026-11-30). Kept for A/B measurement; gemv.cu holds the kernel
// launched by default.
//
// Design note. At batch 1 to 4 a decode step is bound by reading the weights
// once, so the GEMV streams each weight row exactly once with 16-byte loads
// (several in flight per lane) and keeps the few input vectors in shared
// memory, staged once per block as bf16. Each warp owns a PAIR of output rows,
// which lets the epilogue combine them: RoPE rotates the pair (i, i + d/2) of
// one head, SwiGLU multiplies silu(gate_j) by up_j. The prologue can compute
// RMSNorm of the fp32 residual on the fly (each block recomputes the row's
// inverse RMS from L2, cheaper than a separate launch), and the epilogue can
// add into the residual, so a decoder layer needs four GEMVs and the
// attention kernel, with no other launches. The grid is persistent (blocks =
// SMs x occupancy), so staging is paid once per block.

#include <algorithm>
#include <map>
#include <mutex>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/kernel_util.cuh"
#include "gpu/kernels.hpp"
#include "gpu/gemv_common.cuh"
#include "gpu/kernels_v1.hpp"
#include "gpu/launch.cuh"

namespace metronome::gpu {

using namespace dev;
using namespace gemv_detail;

namespace {

constexpr int32_t smem_budget = 64 * 1024;
/// Bytes of each of a warp's first two rows prefetched before the PDL wait.
constexpr int32_t prefetch_bytes = 4096;

template <int M, gemv_epilogue Ep>
__global__ void __launch_bounds__(threads_per_block)
  gemv_kernel(const gemv_args a, int32_t kc) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* xs = reinterpret_cast<bf16*>(smem_raw);
  __shared__ float inv_rms[M];
  __shared__ float scratch[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // Weights are never written: start pulling this warp's first rows into L2
  // while the previous kernel drains, then wait for its outputs.
  {
    const int32_t p0 = blockIdx.x * warps_per_block + warp;
    if (p0 < num_pairs<Ep>(a)) {
      const pair_rows r = rows_of<Ep>(a, p0);
      const char* w0 = reinterpret_cast<const char*>(a.w + int64_t(r.r0) * a.k);
      const char* w1 = reinterpret_cast<const char*>(a.w + int64_t(r.has_r1 ? r.r1 : r.r0) * a.k);
      const int32_t bytes = min(a.k * 2, prefetch_bytes);
      for (int32_t off = lane * 128; off < bytes; off += 32 * 128) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(w0 + off));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(w1 + off));
      }
    }
  }
  pdl_wait();
  pdl_trigger();

  if (a.residual_in) {
    for (int m = 0; m < M; ++m) {
      float ss = 0;
      if (m < a.m) {
        const float* xr = a.residual_in + int64_t(m) * a.k;
        for (int32_t k = threadIdx.x * 4; k < a.k; k += blockDim.x * 4) {
          const float4 v = *reinterpret_cast<const float4*>(xr + k);
          ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
      }
      ss = block_sum(ss, scratch);
      if (threadIdx.x == 0)
        inv_rms[m] = rsqrtf(ss / float(a.k) + a.eps);
    }
    __syncthreads();
  }

  const int32_t pairs = num_pairs<Ep>(a);
  const bool single_chunk = kc >= a.k;
  if (single_chunk) {
    stage_x<M>(a, inv_rms, 0, a.k, xs);
    __syncthreads();
  }
  for (int32_t base = blockIdx.x * warps_per_block; base < pairs;
       base += gridDim.x * warps_per_block) {
    const int32_t p = base + warp;
    const bool active = p < pairs;
    const pair_rows rows = active ? rows_of<Ep>(a, p) : pair_rows{0, 0, false};
    const bf16* w0 = a.w + int64_t(rows.r0) * a.k;
    const bf16* w1 = a.w + int64_t(rows.has_r1 ? rows.r1 : rows.r0) * a.k;
    float acc0[M], acc1[M];
#pragma unroll
    for (int m = 0; m < M; ++m)
      acc0[m] = acc1[m] = 0.0f;

    for (int32_t k0 = 0; k0 < a.k; k0 += kc) {
      const int32_t len = min(kc, a.k - k0);
      if (!single_chunk) {
        __syncthreads();
        stage_x<M>(a, inv_rms, k0, len, xs);
        __syncthreads();
      }
      if (!active)
        continue;
      for (int32_t kk = lane * 8; kk < len; kk += 32 * 8 * unroll) {
        bf16x8 wa[unroll], wb[unroll];
#pragma unroll
        for (int u = 0; u < unroll; ++u) {
          const int32_t k = kk + u * 256;
          if (k < len) {
            wa[u] = load_stream(w0 + k0 + k);
            wb[u] = load_stream(w1 + k0 + k);
          }
        }
#pragma unroll
        for (int u = 0; u < unroll; ++u) {
          const int32_t k = kk + u * 256;
          if (k < len)
            fma_pair<M>(wa[u], wb[u], xs, len, k, acc0, acc1);
        }
      }
    }
    if (!active)
      continue;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      acc0[m] = warp_sum(acc0[m]);
      acc1[m] = warp_sum(acc1[m]);
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
      if (lane == m && m < a.m)
        epilogue<M, Ep>(a, p, rows, m, acc0[m], acc1[m]);
  }
}

// -- launch ----------------------------------------------------------------------------

struct launch_info {
  int32_t blocks_per_sm = 0;
  int32_t num_sms = 0;
};

template <int M, gemv_epilogue Ep>
void launch(const gemv_args& a, cudaStream_t stream) {
  int32_t kc = a.k;
  if (int64_t(M) * a.k * 2 > smem_budget)
    kc = (smem_budget / (M * 2)) / 256 * 256;
  const size_t smem = size_t(M) * size_t(kc) * 2;
  // Occupancy per (instantiation, shared memory size): computed once each.
  static std::mutex mtx;
  static std::map<size_t, launch_info> cache;
  launch_info info;
  {
    std::lock_guard guard{mtx};
    auto it = cache.find(smem);
    if (it == cache.end()) {
      METRONOME_CUDA(cudaFuncSetAttribute(gemv_kernel<M, Ep>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          int(smem_budget)));
      int blocks = 0;
      METRONOME_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, gemv_kernel<M, Ep>, threads_per_block, smem));
      it = cache.emplace(smem, launch_info{std::max(blocks, 1), 0}).first;
    }
    info = it->second;
  }
  info.num_sms = launch_sms(); // this thread's share of the device
  const int32_t pairs = num_pairs<Ep>(a);
  const int32_t wanted = (pairs + warps_per_block - 1) / warps_per_block;
  const int32_t grid = std::max(1, std::min(wanted, info.blocks_per_sm * info.num_sms));
  launch_kernel("gemv_kernel", gemv_kernel<M, Ep>, dim3(grid), dim3(threads_per_block), smem,
                stream, a, kc);
}

} // namespace

void launch_gemv_v1(gemv_epilogue epilogue, const gemv_args& a, cudaStream_t stream) {
  check_gemv_args(a);
  dispatch_gemv(epilogue, a.m, [&]<int M, gemv_epilogue Ep>() { launch<M, Ep>(a, stream); });
}

} // namespace metronome::gpu
