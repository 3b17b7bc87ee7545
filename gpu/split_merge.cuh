#pragma once
// The split-merge epilogue of the decode attention, shared by both kernel
// generations (decode_attention.cu, decode_attention_v1.cu).
//
// Design note. A sequence's keys may be cut into `active` splits, each a
// block that leaves an unnormalised partial output with its running max m
// and sum l (log-sum-exp form, base 2). The last block to finish (a counter
// per sequence and kv head, threadfence reduction) merges them: each split
// weighs exp2(m_s - max m), splits that saw no key (l = 0) weigh nothing,
// and the sum of weighted partials over the sum of weighted l is the
// output. The functions keep the order of every floating-point operation
// of the kernels they came from, so the outputs' bits do not move; the
// generations differ only in the exp2 they use (the second generation's
// ex2.approx, the first's exp2f, with an explicit case for a warp that saw
// nothing), a template argument here. All are
// __forceinline__: the kernels' generated code is what it was inline.

#include <cstdint>

#include <cuda_bf16.h>

#include "gpu/kernel_util.cuh"

namespace metronome::gpu::dev {

/// 2^x as a generation computes it: fast_exp2 (FAST), or exp2f.
template <bool FAST>
__device__ __forceinline__ float exp2_of(float x) {
  if constexpr (FAST)
    return fast_exp2(x);
  else
    return exp2f(x);
}

/// A block's merged result for head `head`, dim d, after its warps are
/// merged: with one split (active == 1) the output itself, acc / lsum;
/// otherwise this split's partial (acc, and at d == 0 its max and sum) in
/// part_o [seqs][heads][splits][D] and part_ml [seqs][heads][splits][2].
template <int D>
__device__ __forceinline__ void write_split_result(bf16* __restrict__ out,
                                                   float* __restrict__ part_o,
                                                   float* __restrict__ part_ml, int num_heads,
                                                   int32_t qrow, int b, int head, int d,
                                                   int32_t splits, int split, int active,
                                                   float acc, float mm, float lsum) {
  if (active == 1) {
    out[(int64_t(qrow) * num_heads + head) * D + d] =
      __float2bfloat16_rn(lsum > 0.0f ? acc / lsum : 0.0f);
  } else {
    const int64_t idx = (int64_t(b) * num_heads + head) * splits + split;
    part_o[idx * D + d] = acc;
    if (d == 0) {
      part_ml[idx * 2] = mm;
      part_ml[idx * 2 + 1] = lsum;
    }
  }
}

/// The weight of a warp whose running max is m in the merge of a block's
/// warps, against the block's max mm (finite): FAST: fast_exp2(m - mm),
/// which is 0 on its own for a warp that saw nothing (m = -inf); else
/// exp2f, with that case explicit.
template <bool FAST>
__device__ __forceinline__ float warp_weight(float m, float mm) {
  if constexpr (FAST)
    return fast_exp2(m - mm);
  else
    return m == -INFINITY ? 0.0f : exp2f(m - mm);
}

/// Merges a block's warps and writes its result: for each of its nh heads
/// (from head h0) and D dims, strided over the block's T threads, mm is the
/// largest of the warps' maxima sm_m[w][h]; where it is finite, each warp
/// weighs warp_weight<FAST>(sm_m[w][h], mm) and acc and lsum sum its
/// sm_o[w][h][d] and sm_l[w][h] times that weight, in warp order (0 where
/// mm is not); write_split_result then writes the output (one split) or
/// this split's partial.
template <bool FAST, int T, int WARPS, int H, int D>
__device__ __forceinline__ void merge_warps(const float (&sm_m)[WARPS][H],
                                            const float (&sm_l)[WARPS][H],
                                            const float (&sm_o)[WARPS][H][D], int nh, int tid,
                                            bf16* __restrict__ out, float* __restrict__ part_o,
                                            float* __restrict__ part_ml, int num_heads,
                                            int32_t qrow, int b, int h0, int32_t splits,
                                            int split, int active) {
  for (int i = tid; i < nh * D; i += T) {
    const int h = i / D, d = i % D;
    float mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < WARPS; ++w)
      mm = fmaxf(mm, sm_m[w][h]);
    float acc = 0.0f, lsum = 0.0f;
    if (mm != -INFINITY)
#pragma unroll
      for (int w = 0; w < WARPS; ++w) {
        const float a = warp_weight<FAST>(sm_m[w][h], mm);
        acc += sm_o[w][h][d] * a;
        lsum += sm_l[w][h] * a;
      }
    write_split_result<D>(out, part_o, part_ml, num_heads, qrow, b, h0 + h, d, splits, split,
                          active, acc, mm, lsum);
  }
}

/// Whether this block is the last of `active` splits to finish: it counts
/// itself in *counter once its partial is written (every thread calls this;
/// `last` is a __shared__ flag). The last one then sees every partial; it
/// must reset *counter to 0 for the next step or graph replay.
__device__ __forceinline__ bool arrive_last(int32_t* counter, int active, int tid, bool& last) {
  __threadfence();
  __syncthreads();
  if (tid == 0)
    last = atomicAdd(counter, 1) == active - 1;
  __syncthreads();
  if (!last)
    return false;
  __threadfence();
  return true;
}

/// The last block's first pass: for each of its nh heads (warp-strided,
/// `warps` warps), the weight of each of the `active` splits into w[h][s]
/// and the weighted sum of their l into l_out[h]. head_row is the first
/// head's row in the partials (b x heads + h0). Up to 64 splits (two a
/// lane). FAST: fast_exp2, else exp2f.
template <bool FAST, int MAX_SPLITS>
__device__ __forceinline__ void split_weights(const float* part_ml, int64_t head_row,
                                              int32_t splits, int active, int nh, int warp,
                                              int warps, int lane, float (*w)[MAX_SPLITS],
                                              float* l_out) {
  static_assert(MAX_SPLITS >= 64, "two splits a lane: w holds 64 a head");
  for (int h = warp; h < nh; h += warps) {
    const int64_t hb = (head_row + h) * splits;
    float ms[2], ls[2];
    float mm = -INFINITY;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int s2 = lane + 32 * k;
      ms[k] = s2 < active ? __ldcg(part_ml + (hb + s2) * 2) : -INFINITY;
      ls[k] = s2 < active ? __ldcg(part_ml + (hb + s2) * 2 + 1) : 0.0f;
      if (ls[k] > 0.0f)
        mm = fmaxf(mm, ms[k]);
    }
    mm = warp_max(mm);
    float lsum = 0.0f;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int s2 = lane + 32 * k;
      const float wt = (ls[k] > 0.0f && mm != -INFINITY) ? exp2_of<FAST>(ms[k] - mm) : 0.0f;
      w[h][s2] = wt;
      lsum += ls[k] * wt;
    }
    lsum = warp_sum(lsum);
    if (lane == 0)
      l_out[h] = lsum;
  }
}

/// acc += w * v, component by component (one fmaf each).
__device__ __forceinline__ void fma4(float w, const float4& v, float4& acc) {
  acc.x = fmaf(w, v.x, acc.x);
  acc.y = fmaf(w, v.y, acc.y);
  acc.z = fmaf(w, v.z, acc.z);
  acc.w = fmaf(w, v.w, acc.w);
}

/// Stores acc / lsum (0 where lsum is 0) as four bf16 at dst (8-byte
/// aligned).
__device__ __forceinline__ void store_merged(bf16* dst, const float4& acc, float lsum) {
  const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
  *reinterpret_cast<uint2*>(dst) =
    make_uint2(pack_bf16x2(acc.x * inv, acc.y * inv), pack_bf16x2(acc.z * inv, acc.w * inv));
}

} // namespace metronome::gpu::dev
