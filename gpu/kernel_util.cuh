#pragma once
// Device helpers shared by the kernels of the GPU executor: bf16 vectors,
// streaming loads, warp and block reductions, tensor-core fragments.

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

namespace metronome::gpu::dev {

using bf16 = __nv_bfloat16;

// -- 16-byte vectors of bf16 ---------------------------------------------------

/// Eight bf16 values in one 16-byte register group.
struct alignas(16) bf16x8 {
  uint32_t w[4];
};

/// Loads 16 bytes that no kernel writes during this launch, bypassing L1
/// allocation (weights streamed once per step).
__device__ __forceinline__ bf16x8 load_stream(const void* p) {
  bf16x8 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.w[0]), "=r"(r.w[1]), "=r"(r.w[2]), "=r"(r.w[3])
               : "l"(p));
  return r;
}

/// load_stream with an L2 eviction policy (l2_policy()).
__device__ __forceinline__ bf16x8 load_stream(const void* p, uint64_t policy) {
  bf16x8 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(r.w[0]), "=r"(r.w[1]), "=r"(r.w[2]), "=r"(r.w[3])
               : "l"(p), "l"(policy));
  return r;
}

/// An L2 eviction policy for the loads of one kernel: evict-first for bytes
/// that a decode step reads once (weights, the KV cache), so that streaming
/// them does not push out of L2 what the step's kernels pass to each other;
/// evict-normal otherwise.
__device__ __forceinline__ uint64_t l2_policy(bool evict_first) {
  uint64_t policy;
  if (evict_first)
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  else
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

/// Loads 16 bytes through the read-only path (data reused by other warps).
__device__ __forceinline__ bf16x8 load_ro(const void* p) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  return bf16x8{{v.x, v.y, v.z, v.w}};
}

/// Loads 16 bytes with a plain global load (data written earlier in the step).
__device__ __forceinline__ bf16x8 load_global(const void* p) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  return bf16x8{{v.x, v.y, v.z, v.w}};
}

__device__ __forceinline__ void store16(void* p, const bf16x8& v) {
  *reinterpret_cast<uint4*>(p) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
}

/// The low and high bf16 of a packed pair as floats (exact).
__device__ __forceinline__ float bf16_lo(uint32_t v) {
  return __uint_as_float(v << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t v) {
  return __uint_as_float(v & 0xffff0000u);
}

/// Unpacks eight bf16 into floats.
__device__ __forceinline__ void unpack(const bf16x8& v, float (&f)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = bf16_lo(v.w[i]);
    f[2 * i + 1] = bf16_hi(v.w[i]);
  }
}

/// One e4m3 byte of x (round to nearest even, saturating at +-448): how the
/// fp8 KV cache's writers store a row's values divided by its scale
/// (kv_view::k8; model/dtype.hpp's f32_to_e4m3 on the host).
__device__ __forceinline__ uint8_t to_e4m3(float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

/// 448 / amax, what a row with that largest |value| is multiplied by before
/// to_e4m3; 0 for a row whose largest |value| is 0 or below 2^-100 (whose
/// inverse could overflow), stored as zeros. model/cpu_ops.cpp's
/// round_rows_to_e4m3 is the host's copy of this rule.
__device__ __forceinline__ float e4m3_inverse_scale(float amax) {
  return amax >= 0x1p-100f ? 448.0f / amax : 0.0f;
}

/// Packs two floats into a bf16 pair, round to nearest even.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

/// Packs two floats into an f16 pair, round to nearest even.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ float to_float(bf16 v) {
  return __bfloat162float(v);
}

// -- reductions ------------------------------------------------------------------

/// 2^x by the hardware's approximation (ex2.approx.ftz): 0 for -inf.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the block; every thread gets the result. `scratch` holds 32
/// floats; the block is a multiple of 32 threads.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

// -- asynchronous copies and tensor-core fragments (sm_80+) -----------------------

/// 16-byte global-to-shared copy; reads nothing and writes zeros when !valid.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(bytes));
}

/// cp_async16 of 4 bytes (through L1: the 16-byte form alone bypasses it).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(gmem), "r"(bytes));
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;");
}

template <int n>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(n));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* smem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(s));
}

// -- bulk copies and transaction barriers (sm_90) ----------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// Initialises a shared-memory barrier expecting `count` arrivals per phase.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

/// Makes barrier initialisation visible to the bulk-copy (async) proxy.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/// Arrives once and announces `bytes` of bulk copies completing on this phase.
__device__ __forceinline__ void mbar_arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

/// Waits until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t a = smem_addr(bar);
  uint32_t done = 0;
  do {
    asm volatile(
      "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, "
      "p; }"
      : "=r"(done)
      : "r"(a), "r"(parity)
      : "memory");
  } while (!done);
}

/// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from
/// global to shared memory on the async proxy; completion counts on `bar`.
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, uint32_t bytes,
                                              uint64_t* bar) {
  asm volatile(
    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
      "r"(smem_addr(smem)),
    "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
    : "memory");
}

/// bulk_copy_g2s with an L2 eviction policy (l2_policy()).
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, uint32_t bytes,
                                              uint64_t* bar, uint64_t policy) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
               " [%0], [%1], %2, [%3], %4;" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
               : "memory");
}

/// Orders this thread's earlier shared-memory accesses before later bulk
/// copies into the same memory (generic to async proxy).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/// D = A * B + D for one m16n8k16 tile: A row-major, B column-major, both
/// f16 (F16) or bf16, D fp32.
template <bool F16>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
#define METRONOME_MMA(T)                                                                        \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0, %1, %2, %3}, "      \
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                                 \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                 \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
  if constexpr (F16)
    METRONOME_MMA("f16");
  else
    METRONOME_MMA("bf16");
#undef METRONOME_MMA
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  mma<false>(d, a, b0, b1);
}

__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  mma<true>(d, a, b0, b1);
}

} // namespace metronome::gpu::dev
