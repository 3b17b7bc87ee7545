// The 4-bit decode GEMV (W4A16) on tensor cores, for groups of 128 inputs
// and more.
//
// Design note. This generation (the default where the groups are whole
// multiples of 128 inputs; gemv_int4.cu's fp32 kernel otherwise) spends
// about 1.4 instructions a weight instead of 3.4, so the weights' bytes,
// not the issue slots, bound it. Each warp computes 8 row pairs (16 rows: the pairs' first rows, then
// their second) for up to 8 tokens with mma.m16n8k16 (bf16 in, fp32 sums),
// the tokens as the 8 columns. Lane (g, t) = (lane / 4, lane % 4) streams
// 16 bytes of each of its pair's two rows: stored columns 32t..32t+31 of a
// 128-column block, which is one group (the block's scale applies to the
// tile's sums). A dot product does not care in which order its terms come,
// so the 16 k-slots of each mma take whatever columns make the fragments
// cheap: one shift and one LOP3 turn a word into the bf16 pair 128 + q of
// its nibbles e and e + 4, exactly; one bf16x2 FMA subtracts 128 + zero,
// exactly; and the inputs are staged in shared memory in the same order
// (tc_slot, tc_interleave), so one 16-byte load gives a lane the columns of
// two mmas. Lanes keep two batches of two blocks in flight (the next while
// the tensor cores work on the current), and a block's 128 registers let two
// blocks share an SM; four-block batches at one block an SM ran 30% slower.
// Blocks are persistent (one wave), so that each stages the inputs once and
// every block triggers the next launch early.

#include <algorithm>

#include "gpu/cuda_check.hpp"
#include "gpu/gemv_common.cuh"
#include "gpu/gemv_int4_tc.hpp"
#include "gpu/kernel_util.cuh"
#include "gpu/kernels.hpp"
#include "gpu/launch.cuh"

namespace metronome::gpu {

using namespace dev;
using namespace gemv_detail;

namespace {

/// Columns one lane group (four lanes) covers in a load: a block of 128, one
/// group; load groups a batch; the staging rows' pad (bf16).
constexpr int32_t tc_block = 128;
constexpr int tc_unroll = 2;
constexpr int32_t tc_pad = 32;

size_t tc_smem_bytes(int32_t m, int32_t k) {
  return size_t(m) * size_t(k + tc_pad) * 2;
}

/// Where stored column k sits in a staged row: the 16-byte chunks of each
/// 128-column block transposed from 4t + i to 4i + t, so that the four
/// lanes of a row read 64 contiguous bytes (lane t's word i).
__device__ __forceinline__ int32_t tc_slot(int32_t k) {
  const int32_t c = (k & (tc_block - 1)) >> 3;
  return (k & ~(tc_block - 1)) + 8 * (4 * (c & 3) + (c >> 2));
}

/// Eight inputs e0..e7 reordered (e0, e4, e1, e5, e2, e6, e3, e7): the
/// order in which tc_pair hands out a word's nibbles.
__device__ __forceinline__ bf16x8 tc_interleave(const bf16x8& v) {
  return bf16x8{{__byte_perm(v.w[0], v.w[2], 0x5410), __byte_perm(v.w[0], v.w[2], 0x7632),
                 __byte_perm(v.w[1], v.w[3], 0x5410), __byte_perm(v.w[1], v.w[3], 0x7632)}};
}

/// The bf16 pair (q_s - zero, q_{s+4} - zero) of word w's nibbles, exactly:
/// the nibbles under bf16 128's exponent read as 128 + q; neg_zero is the
/// pair -(128 + zero).
template <int S>
__device__ __forceinline__ uint32_t tc_pair(uint32_t w, uint32_t neg_zero) {
  const uint32_t biased = ((w >> (4 * S)) & 0x000F000Fu) | 0x43004300u;
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(biased), "r"(0x3F803F80u), "r"(neg_zero));
  return d;
}

/// -(128 + zero) as a bf16 pair, from a scale-zero word.
__device__ __forceinline__ uint32_t tc_neg_zero(uint32_t sz) {
  const uint32_t z = (sz >> 16) & 0xFFu;
  return (0xC300u + z) * 0x00010001u;
}

/// The inputs as the tensor-core kernel reads them: rows of k + tc_pad,
/// each column at tc_slot, each chunk tc_interleave'd; normalised on the
/// fly from the residual as stage_x does, and through the act-order
/// permutation where there is one.
template <int M>
__device__ void stage_x_tc(const gemv_args& a, const int32_t* perm, const float* inv_rms,
                           bf16* xs) {
  constexpr int U = 4;
  const int32_t stride = a.k + tc_pad, vecs = a.k / 8, total = M * vecs;
  for (int32_t v0 = threadIdx.x; v0 < total; v0 += U * int32_t(blockDim.x)) {
    bf16x8 out[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int32_t v = v0 + u * int32_t(blockDim.x);
      const int32_t m = v / vecs, k = (v % vecs) * 8;
      out[u] = bf16x8{{0, 0, 0, 0}};
      if (v >= total || m >= a.m)
        continue;
      if (perm) {
        float f[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int32_t i = perm[k + e];
          f[e] = a.residual_in
                   ? to_float(a.norm_weight[i]) * (a.residual_in[int64_t(m) * a.k + i] * inv_rms[m])
                   : to_float(a.x[int64_t(m) * a.k + i]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e)
          out[u].w[e] = pack_bf16x2(f[2 * e], f[2 * e + 1]);
      } else if (a.residual_in) {
        const float* xr = a.residual_in + int64_t(m) * a.k + k;
        out[u] = normalise8(*reinterpret_cast<const float4*>(xr),
                            *reinterpret_cast<const float4*>(xr + 4), load_ro(a.norm_weight + k),
                            inv_rms[m]);
      } else {
        out[u] = load_global(a.x + int64_t(m) * a.k + k);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int32_t v = v0 + u * int32_t(blockDim.x);
      if (v < total)
        store16(xs + (v / vecs) * stride + tc_slot((v % vecs) * 8), tc_interleave(out[u]));
    }
  }
}

/// One lane's loads of U blocks: 16 bytes of each row, and each row's
/// scale-zero word of the block.
template <int U>
struct tc_batch {
  bf16x8 a[U], b[U];
  uint32_t sa[U], sb[U];
};

template <int U>
__device__ __forceinline__ void tc_load(tc_batch<U>& bt, bool active, const uint32_t* q0,
                                        const uint32_t* q1, const uint32_t* sz0,
                                        const uint32_t* sz1, int32_t group_size, int32_t kb,
                                        int32_t k1, uint64_t policy) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int32_t k = kb + u * tc_block;
    if (active && k < k1) {
      bt.a[u] = load_stream(q0 + k / 8, policy);
      bt.b[u] = load_stream(q1 + k / 8, policy);
      bt.sa[u] = __ldg(sz0 + k / group_size);
      bt.sb[u] = __ldg(sz1 + k / group_size);
    }
  }
}

/// acc (this lane's C fragment: rows g and g + 8, tokens 2t and 2t + 1) +=
/// the batch's blocks times the staged inputs; xrow is the lane's token row
/// of the staging (its B fragment's column), null past the padded batch.
template <int U>
__device__ __forceinline__ void tc_compute(const tc_batch<U>& bt, const bf16* xrow, int t,
                                           int32_t kb, int32_t k1, float (&acc)[4]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int32_t k = kb + u * tc_block;
    if (k < k1) {
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const uint32_t za = tc_neg_zero(bt.sa[u]), zb = tc_neg_zero(bt.sb[u]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint4 xv = make_uint4(0, 0, 0, 0);
        if (xrow)
          xv = *reinterpret_cast<const uint4*>(xrow + k + 8 * (4 * i + t));
        const uint32_t wa = bt.a[u].w[i], wb = bt.b[u].w[i];
        const uint32_t f0[4] = {tc_pair<0>(wa, za), tc_pair<0>(wb, zb), tc_pair<1>(wa, za),
                                tc_pair<1>(wb, zb)};
        mma_bf16(c, f0, xv.x, xv.y);
        const uint32_t f1[4] = {tc_pair<2>(wa, za), tc_pair<2>(wb, zb), tc_pair<3>(wa, za),
                                tc_pair<3>(wb, zb)};
        mma_bf16(c, f1, xv.z, xv.w);
      }
      const float s0 = __half2float(__ushort_as_half(uint16_t(bt.sa[u] & 0xFFFFu)));
      const float s1 = __half2float(__ushort_as_half(uint16_t(bt.sb[u] & 0xFFFFu)));
      acc[0] = fmaf(s0, c[0], acc[0]);
      acc[1] = fmaf(s0, c[1], acc[1]);
      acc[2] = fmaf(s1, c[2], acc[2]);
      acc[3] = fmaf(s1, c[3], acc[3]);
    }
  }
}

/// A unit of work: 8 / KS tiles of 8 row pairs, KS warps a tile, each warp
/// a slice of kslice columns (a multiple of 128) of its tile. Persistent:
/// each block stages the inputs once and takes units blockIdx.x,
/// blockIdx.x + gridDim.x, ..., loading the next unit's first two batches
/// before it reduces and stores the current one. A grid of one wave lets
/// every block trigger the next launch early, whose weights then stream
/// while this one ends (programmatic dependent launch).
template <int M, gemv_epilogue Ep, int KS>
__global__ void __launch_bounds__(threads_per_block, 2)
  gemv_int4_tc_kernel(const gemv_args a, const int4_weights w, int32_t kslice, int32_t units,
                      bool evict_first, bool late_trigger) {
  constexpr int TB = warps_per_block / KS;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* xs = reinterpret_cast<bf16*>(smem_raw); // [M][k + tc_pad]
  __shared__ float inv_rms[M];
  __shared__ float scratch[32];
  __shared__ float4 red[2][warps_per_block][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ks = warp % KS, g = lane >> 2, t = lane & 3;
  const int32_t pairs = num_pairs<Ep>(a);
  const int32_t row_words = a.k / 8;
  const int32_t k0 = ks * kslice, k1 = min(a.k, k0 + kslice);
  constexpr int U = tc_unroll;
  const int32_t span = U * tc_block;
  const int32_t batches = k1 > k0 ? (k1 - k0 + span - 1) / span : 0;
  const uint64_t policy = l2_policy(evict_first);

  int32_t unit = blockIdx.x;
  int32_t p = 0;
  bool active = false;
  pair_rows rows{0, 0, false};
  const uint32_t *q0 = w.q, *q1 = w.q, *sz0 = w.sz, *sz1 = w.sz;
  epilogue_inputs e0, e1;
  tc_batch<U> b0{}, b1{};
  // The unit's rows, its first two batches of weights (never written, so
  // also before the wait) and its epilogue's inputs (load_epilogue_inputs).
  auto start = [&](int32_t un) {
    p = (un * TB + warp / KS) * 8 + g;
    active = un < units && p < pairs;
    rows = active ? rows_of<Ep>(a, p) : pair_rows{0, 0, false};
    const int32_t r1 = rows.has_r1 ? rows.r1 : rows.r0;
    q0 = w.q + int64_t(rows.r0) * row_words + 4 * t;
    q1 = w.q + int64_t(r1) * row_words + 4 * t;
    sz0 = w.sz + int64_t(rows.r0) * w.groups;
    sz1 = w.sz + int64_t(r1) * w.groups;
    if (batches > 0)
      tc_load(b0, active, q0, q1, sz0, sz1, w.group_size, k0, k1, policy);
    if (batches > 1)
      tc_load(b1, active, q0, q1, sz0, sz1, w.group_size, k0 + span, k1, policy);
    if (active && ks == 0) {
      if (2 * t < a.m && 2 * t < M)
        e0 = load_epilogue_inputs<Ep>(a, p, rows, 2 * t);
      if (2 * t + 1 < a.m && 2 * t + 1 < M)
        e1 = load_epilogue_inputs<Ep>(a, p, rows, 2 * t + 1);
    }
  };
  start(unit);

  pdl_wait();
  if (!late_trigger)
    pdl_trigger();

  if (a.residual_in)
    residual_inv_rms<M>(a, inv_rms, scratch);
  stage_x_tc<M>(a, w.perm, inv_rms, xs);
  __syncthreads();

  const bf16* xrow = g < M ? xs + g * (a.k + tc_pad) : nullptr;
  for (int parity = 0; unit < units; unit += gridDim.x, parity ^= 1) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int32_t b = 0; b < batches; b += 2) {
      tc_compute(b0, xrow, t, k0 + b * span, k1, acc);
      if (b + 2 < batches)
        tc_load(b0, active, q0, q1, sz0, sz1, w.group_size, k0 + (b + 2) * span, k1, policy);
      if (b + 1 < batches) {
        tc_compute(b1, xrow, t, k0 + (b + 1) * span, k1, acc);
        if (b + 3 < batches)
          tc_load(b1, active, q0, q1, sz0, sz1, w.group_size, k0 + (b + 3) * span, k1, policy);
      }
    }
    const int32_t done_p = p;
    const bool done_active = active;
    const pair_rows done_rows = rows;
    const epilogue_inputs d0 = e0, d1 = e1;
    if (unit + int32_t(gridDim.x) < units)
      start(unit + gridDim.x);
    // The tile's KS slices summed in a fixed order (results do not depend
    // on timing; `red` alternates by parity: one barrier a unit); the first
    // warp's lanes run the epilogues of their pair.
    if constexpr (KS > 1) {
      if (ks != 0)
        red[parity][warp][lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      __syncthreads();
      if (ks == 0) {
#pragma unroll
        for (int j = 1; j < KS; ++j) {
          const float4 r = red[parity][warp + j][lane];
          acc[0] += r.x;
          acc[1] += r.y;
          acc[2] += r.z;
          acc[3] += r.w;
        }
      }
    }
    if (done_active && ks == 0) {
      if (2 * t < a.m && 2 * t < M)
        epilogue<M, Ep>(a, done_p, done_rows, 2 * t, acc[0], acc[2], d0);
      if (2 * t + 1 < a.m && 2 * t + 1 < M)
        epilogue<M, Ep>(a, done_p, done_rows, 2 * t + 1, acc[1], acc[3], d1);
    }
  }
  if (late_trigger)
    pdl_trigger();
}

template <int M, gemv_epilogue Ep, int KS>
void launch_tc_ks(const gemv_args& a, const int4_weights& w, size_t smem, int32_t grid,
                  int32_t kslice, int32_t units, cudaStream_t stream) {
  // Raises the kernel's dynamic shared-memory limit on first use (cached).
  gemv_occupancy(gemv_int4_tc_kernel<M, Ep, KS>, smem, int4_smem_limit);
  launch_kernel("gemv_int4_tc_kernel", gemv_int4_tc_kernel<M, Ep, KS>, dim3(grid),
                dim3(threads_per_block), smem, stream, a, w, kslice, units,
                stream_hint_on(hint_gemv_weights),
                Ep == gemv_epilogue::swiglu && late_triggers());
}

/// The tensor-core generation's split: of KS = 1, 2, 4, 8 warps a tile (each
/// at least one 128-column block), the one that streams the fewest columns
/// through the busiest block: its units over the resident blocks, rounded
/// up, times each warp's slice (ties to fewer warps a tile, fewer partial
/// sums). The grid is one wave of resident blocks, or the units if fewer.
template <int M, gemv_epilogue Ep>
void launch_tc(const gemv_args& a, const int4_weights& w, cudaStream_t stream) {
  const size_t smem = tc_smem_bytes(M, a.k);
  const gemv_launch_info info =
    gemv_occupancy(gemv_int4_tc_kernel<M, Ep, 1>, smem, int4_smem_limit);
  const int64_t resident = int64_t(info.blocks_per_sm) * info.num_sms;
  const int64_t tiles = (num_pairs<Ep>(a) + 7) / 8;
  const int32_t blocks_of_k = a.k / tc_block;
  int best = 1;
  int64_t best_cost = -1, best_units = 0, best_slice = 0;
  for (int ks = 1; ks <= 8 && ks <= blocks_of_k; ks *= 2) {
    const int64_t units = (tiles * ks + warps_per_block - 1) / warps_per_block;
    const int64_t slice = (blocks_of_k + ks - 1) / ks * tc_block;
    const int64_t cost = (units + resident - 1) / resident * slice;
    if (best_cost < 0 || cost < best_cost) {
      best = ks;
      best_cost = cost;
      best_units = units;
      best_slice = slice;
    }
  }
  const auto units = int32_t(best_units);
  const auto grid = int32_t(std::min<int64_t>(best_units, resident));
  const auto slice = int32_t(best_slice);
  switch (best) {
    case 1: return launch_tc_ks<M, Ep, 1>(a, w, smem, grid, slice, units, stream);
    case 2: return launch_tc_ks<M, Ep, 2>(a, w, smem, grid, slice, units, stream);
    case 4: return launch_tc_ks<M, Ep, 4>(a, w, smem, grid, slice, units, stream);
    default: return launch_tc_ks<M, Ep, 8>(a, w, smem, grid, slice, units, stream);
  }
}

} // namespace

bool gemv_int4_tensor_cores(const int4_weights& w, int32_t k) {
  return active_kernels().gemv_int4 >= 2 && k % tc_block == 0 && w.group_size % tc_block == 0;
}

void launch_gemv_int4_tc(gemv_epilogue epilogue, const gemv_args& a, const int4_weights& w,
                         cudaStream_t stream) {
  dispatch_gemv(epilogue, a.m,
                [&]<int M, gemv_epilogue Ep>() { launch_tc<M, Ep>(a, w, stream); });
}

} // namespace metronome::gpu
