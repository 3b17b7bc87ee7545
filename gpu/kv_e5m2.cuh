#pragma once
// The fp8_e5m2 KV cache on the device: its element conversions, its window
// scales and its overflow counts (kv_view::e5m2).
//
// Design note. The cache keeps the fp8 form's layout (kv_view::k8: a byte
// an element, one float scale a row) and model/dtype.hpp's rule for the
// scales: each (layer, K or V, kv head) of a sequence has one power-of-two
// scale per window of kv_e5m2_window positions, fixed when the window's
// first row is written, from the largest finite |value| of that row (before
// rounding) and of the kv_e5m2_history windows before it as stored. Every
// row keeps its window's scale in its own scale slot, so the readers are the
// fp8 form's readers with another byte format, and a row after a window's
// first finds the scale in the first row's slot (through the page table:
// prefix reuse and chunking change nothing). A writer of one row (a decode)
// at a window's start reads the history from the cache's bytes: the largest
// finite code of a row times its scale is its largest stored |value|,
// because E5M2's codes of one sign order as their magnitudes. A prompt chunk
// can hold several window starts whose history lies partly in the chunk
// itself: e5m2_window_scales_kernel (elementwise.cu) fixes them in order
// before the chunk's rows are written, from each window's largest |value|
// in the chunk rounded as the format rounds it (rounding is monotone).
// Values that saturate (|value| / scale > 57344) or are not finite are
// counted per sequence of the step (kv_view::overflow), as the CPU
// reference counts them (model/cpu_ops.cpp, round_to_e5m2).

#include <cfloat>
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "gpu/kernel_util.cuh"
#include "gpu/kernels.hpp"
#include "model/dtype.hpp"

namespace metronome::gpu::dev {

/// One e5m2 byte of x: nearest even, saturating at +-57344, NaN to 0x7f
/// (model/dtype.hpp's f32_to_e5m2).
__device__ __forceinline__ uint8_t to_e5m2(float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
}

/// Whether an e5m2 code is finite (its exponent is not all ones).
__device__ __forceinline__ bool e5m2_finite(uint32_t code) {
  return (code & 0x7cu) != 0x7cu;
}

/// The magnitude of a finite e5m2 code (its low 7 bits): the upper byte of
/// an IEEE half, exactly.
__device__ __forceinline__ float e5m2_magnitude(uint32_t code) {
  return __half2float(__ushort_as_half(uint16_t((code & 0x7fu) << 8)));
}

/// model/dtype.hpp's e5m2_window_scale on the device: 2^clamp(ceil(log2
/// reference) - 8, -100, 100), or 1 for a reference of 0 or not finite.
__device__ __forceinline__ float e5m2_window_scale(float reference) {
  return __uint_as_float(e5m2_window_scale_bits(__float_as_uint(reference)));
}

/// |x| for a history maximum: infinity as the largest float (it is stored
/// saturated, so it counts as the format's largest value), NaN as 0.
__device__ __forceinline__ float e5m2_history_abs(float x) {
  return isnan(x) ? 0.0f : fminf(fabsf(x), FLT_MAX);
}

/// |x| for a window's first row: values that are not finite count as 0.
__device__ __forceinline__ float e5m2_first_abs(float x) {
  return isfinite(x) ? fabsf(x) : 0.0f;
}

/// The largest |value| the cache stores for values whose largest |value| is
/// m, written with `scale`: m rounded as the format rounds it.
__device__ __forceinline__ float e5m2_stored(float m, float scale) {
  return e5m2_magnitude(to_e5m2(m * (1.0f / scale))) * scale;
}

/// Position `pos`'s row index in the scale arrays for kv head h, through the
/// sequence's page table pt.
__device__ __forceinline__ int64_t e5m2_scale_row(const kv_view& kv, const int32_t* pt,
                                                  int32_t h, int32_t pos) {
  return (int64_t(pt[pos / kv.page_size]) * kv.kv_heads + h) * kv.page_size
         + pos % kv.page_size;
}

/// The largest finite |value| stored in positions [lo, hi) of kv head h's K
/// (out[0]) and V (out[1]) rows of one sequence. Every thread of the block
/// calls it (it has barriers); all get the result. red holds 2 words.
__device__ __forceinline__ void e5m2_cached_max(const kv_view& kv, const int32_t* pt, int32_t h,
                                                int32_t lo, int32_t hi, uint32_t* red,
                                                float (&out)[2]) {
  const int32_t d = kv.head_dim, words = d / 4;
  if (threadIdx.x < 2)
    red[threadIdx.x] = 0;
  __syncthreads();
  float mk = 0.0f, mv = 0.0f;
  for (int32_t i = threadIdx.x; i < (hi - lo) * words; i += blockDim.x) {
    const int32_t pos = lo + i / words, w = i % words;
    const int64_t row = e5m2_scale_row(kv, pt, h, pos);
    const uint32_t wk = __ldcg(reinterpret_cast<const uint32_t*>(kv.k8 + row * d) + w);
    const uint32_t wv = __ldcg(reinterpret_cast<const uint32_t*>(kv.v8 + row * d) + w);
    uint32_t ck = 0, cv = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t k = (wk >> (8 * b)) & 0x7fu, v = (wv >> (8 * b)) & 0x7fu;
      if (e5m2_finite(k))
        ck = max(ck, k);
      if (e5m2_finite(v))
        cv = max(cv, v);
    }
    mk = fmaxf(mk, e5m2_magnitude(ck) * __ldcg(kv.k_scale + row));
    mv = fmaxf(mv, e5m2_magnitude(cv) * __ldcg(kv.v_scale + row));
  }
  mk = warp_max(mk);
  mv = warp_max(mv);
  if ((threadIdx.x & 31) == 0) {
    atomicMax(red, __float_as_uint(mk)); // non-negative floats order as their bits
    atomicMax(red + 1, __float_as_uint(mv));
  }
  __syncthreads();
  out[0] = __uint_as_float(red[0]);
  out[1] = __uint_as_float(red[1]);
  __syncthreads();
}

/// A thread's count of the values it stored that saturated (|x| / scale
/// above 57344) or were not finite; add() takes x and 1 / scale.
struct e5m2_counts {
  uint32_t saturated = 0, non_finite = 0;
  __device__ __forceinline__ void add(float x, float inv) {
    if (!isfinite(x))
      ++non_finite;
    else if (fabsf(x * inv) > e5m2_max)
      ++saturated;
  }
};

/// Adds a warp's counts to the step's counters of batch row b (kv_view::
/// overflow: [rows][2], saturated then not finite). Every lane calls it.
__device__ __forceinline__ void e5m2_count_warp(const kv_view& kv, int32_t b, e5m2_counts c) {
  uint32_t s = c.saturated, n = c.non_finite;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(0xffffffffu, s, o);
    n += __shfl_xor_sync(0xffffffffu, n, o);
  }
  if ((threadIdx.x & 31) == 0 && kv.overflow && (s | n)) {
    if (s)
      atomicAdd(kv.overflow + 2 * b, s);
    if (n)
      atomicAdd(kv.overflow + 2 * b + 1, n);
  }
}

/// The same for a count that some threads of the block hold (any number of
/// whole warps).
__device__ __forceinline__ void e5m2_count_thread(const kv_view& kv, int32_t b, e5m2_counts c) {
  if (kv.overflow && c.saturated)
    atomicAdd(kv.overflow + 2 * b, c.saturated);
  if (kv.overflow && c.non_finite)
    atomicAdd(kv.overflow + 2 * b + 1, c.non_finite);
}

} // namespace metronome::gpu::dev
