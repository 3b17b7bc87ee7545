#pragma once
// Device helpers shared by both generations of the decode GEMV (gemv.cu,
// gemv_v1.cu), the skinny GEMM and the stand-alone RoPE kernel: which output
// rows a warp's pair covers, staging the input vectors (normalised on the fly
// from the fp32 residual, or copied), and the fused epilogues (store, residual
// add, SwiGLU, qkv bias + RoPE + cache write). The fused-RoPE decode attention
// (decode_attention.cu) uses rope_angle and rope_rotate. Both GEMV
// generations also share their block shape, their inner multiply-adds
// (fma_pair) and their host-side argument checks and dispatch
// (check_gemv_args, dispatch_gemv).

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "gpu/cuda_check.hpp"
#include "gpu/kernel_util.cuh"
#include "gpu/kernels.hpp"
#include "gpu/sm_partition.hpp"

namespace metronome::gpu::gemv_detail {

using namespace dev;

/// The decode GEMV's block (both generations): eight warps, and each lane
/// keeps `unroll` 16-byte loads of each of its two rows in flight.
constexpr int warps_per_block = 8;
constexpr int threads_per_block = warps_per_block * 32;
constexpr int unroll = 4;

struct pair_rows {
  int32_t r0, r1;
  bool has_r1;
};

template <gemv_epilogue Ep>
__device__ __forceinline__ pair_rows rows_of(const gemv_args& a, int32_t p) {
  if constexpr (Ep == gemv_epilogue::swiglu) {
    return {p, a.n / 2 + p, true};
  } else if constexpr (Ep == gemv_epilogue::qkv_rope) {
    const int32_t half = a.kv.head_dim / 2;
    const int32_t head = p / half, i = p % half;
    const int32_t r0 = head * a.kv.head_dim + i;
    return {r0, r0 + half, true};
  } else {
    return {2 * p, 2 * p + 1, 2 * p + 1 < a.n};
  }
}

template <gemv_epilogue Ep>
__host__ __device__ int32_t num_pairs(const gemv_args& a) {
  if constexpr (Ep == gemv_epilogue::swiglu || Ep == gemv_epilogue::qkv_rope)
    return a.n / 2;
  else
    return (a.n + 1) / 2;
}

/// bf16(weight * (x * inv)) of eight residual values (lo, hi) and their
/// norm weights: the normalisation of every staging path (stage_x, the decode
/// GEMV's stage_residual), so that they agree to the bit.
__device__ __forceinline__ bf16x8 normalise8(const float4& lo, const float4& hi,
                                             const bf16x8& weight, float inv) {
  float w[8];
  unpack(weight, w);
  bf16x8 out;
  out.w[0] = pack_bf16x2(w[0] * (lo.x * inv), w[1] * (lo.y * inv));
  out.w[1] = pack_bf16x2(w[2] * (lo.z * inv), w[3] * (lo.w * inv));
  out.w[2] = pack_bf16x2(w[4] * (hi.x * inv), w[5] * (hi.y * inv));
  out.w[3] = pack_bf16x2(w[6] * (hi.z * inv), w[7] * (hi.w * inv));
  return out;
}

/// Stages x[:, k0 : k0 + kc) into xs [M][kc] as bf16 (normalised if the
/// input is the residual). Each thread issues the loads of up to U vectors
/// of eight before it stores any: the stores go to shared memory, so the
/// compiler does not move later loads above them on its own, and one memory
/// round trip per vector (seven for the 8B shape's down projection) used to
/// stand between the kernel's wait and its first multiply-add. The
/// residual's vectors (two float4 and a norm weight each) go one at a time,
/// to spare registers while the weights are in flight.
template <int M, int U = 4>
__device__ void stage_x(const gemv_args& a, const float* inv_rms, int32_t k0, int32_t kc,
                        bf16* xs) {
  const int32_t vecs = kc / 8, total = M * vecs;
  if (a.residual_in) {
    for (int32_t v = threadIdx.x; v < total; v += blockDim.x) {
      const int32_t m = v / vecs, kk = (v % vecs) * 8;
      const int32_t k = k0 + kk;
      bf16x8 out{{0, 0, 0, 0}};
      if (m < a.m) {
        const float* xr = a.residual_in + int64_t(m) * a.k + k;
        const float4 lo = *reinterpret_cast<const float4*>(xr);
        const float4 hi = *reinterpret_cast<const float4*>(xr + 4);
        out = normalise8(lo, hi, load_ro(a.norm_weight + k), inv_rms[m]);
      }
      store16(xs + m * kc + kk, out);
    }
    return;
  }
  for (int32_t v0 = threadIdx.x; v0 < total; v0 += U * int32_t(blockDim.x)) {
    bf16x8 out[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int32_t v = v0 + u * int32_t(blockDim.x);
      const int32_t m = v / vecs, k = k0 + (v % vecs) * 8;
      out[u] = v < total && m < a.m ? load_global(a.x + int64_t(m) * a.k + k)
                                    : bf16x8{{0, 0, 0, 0}};
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int32_t v = v0 + u * int32_t(blockDim.x);
      if (v < total)
        store16(xs + (v / vecs) * kc + (v % vecs) * 8, out[u]);
    }
  }
}

/// acc0[m] += wa . x_m and acc1[m] += wb . x_m over eight k, where x_m is
/// the eight bf16 at xs + m * stride + k: each product one fmaf, in the
/// order e = 0..7 (the decode GEMV's inner step, both generations).
template <int M>
__device__ __forceinline__ void fma_pair(const bf16x8& wa, const bf16x8& wb, const bf16* xs,
                                         int32_t stride, int32_t k, float (&acc0)[M],
                                         float (&acc1)[M]) {
  float fa[8], fb[8];
  unpack(wa, fa);
  unpack(wb, fb);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float xv[8];
    unpack(*reinterpret_cast<const bf16x8*>(xs + m * stride + k), xv);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      acc0[m] = fmaf(fa[e], xv[e], acc0[m]);
      acc1[m] = fmaf(fb[e], xv[e], acc1[m]);
    }
  }
}

/// The inverse RMS of the residual's rows m < M into inv_rms (every thread
/// reads them after a barrier), each thread's loads issued together.
template <int M>
__device__ void residual_inv_rms(const gemv_args& a, float* inv_rms, float* scratch) {
  constexpr int U = 4;
  for (int m = 0; m < M; ++m) {
    float ss = 0;
    if (m < a.m) {
      const float* xr = a.residual_in + int64_t(m) * a.k;
      for (int32_t k0 = threadIdx.x * 4; k0 < a.k; k0 += U * int32_t(blockDim.x) * 4) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int32_t k = k0 + u * int32_t(blockDim.x) * 4;
          v[u] = k < a.k ? *reinterpret_cast<const float4*>(xr + k) : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
          ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
      }
    }
    ss = block_sum(ss, scratch);
    if (threadIdx.x == 0)
      inv_rms[m] = rsqrtf(ss / float(a.k) + a.eps);
  }
  __syncthreads();
}

/// cos and sin of RoPE pair i at position pos, from the pair's frequency
/// (inv_freq[i]). Every kernel that rotates (this epilogue, rope_kv_write_kernel
/// through it, the fused decode attention) uses these helpers, so that they
/// agree to the bit.
__device__ __forceinline__ void rope_angle_of(float freq, int32_t pos, float& c, float& s) {
  sincosf(float(pos) * freq, &s, &c);
}

__device__ __forceinline__ void rope_angle(const float* inv_freq, int32_t pos, int32_t i,
                                           float& c, float& s) {
  rope_angle_of(inv_freq[i], pos, c, s);
}

/// Rotates the pair (a, b) = (x[i], x[i + d/2]) of a head in place.
__device__ __forceinline__ void rope_rotate(float& a, float& b, float c, float s) {
  const float ra = a * c - b * s, rb = b * c + a * s;
  a = ra;
  b = rb;
}

/// What the epilogue of row pair p for batch row m reads besides its sums:
/// the bias, the residual it adds to, and for qkv_rope the position, the
/// pair's RoPE frequency and the cache page of the token. The decode GEMV
/// loads them when it sets up a tile, right after the tile's first weight
/// batch, so that none of these round trips (three dependent ones for a k or
/// v row) falls after the tile's last weight byte, at the end of the kernel.
struct epilogue_inputs {
  float bias0 = 0.0f, bias1 = 0.0f;
  float x0 = 0.0f, x1 = 0.0f; // residual_add: the residual at rows r0, r1
  int32_t pos = 0, page = 0;  // qkv_rope (page: k and v rows only)
  float freq = 0.0f;          // qkv_rope: inv_freq of the pair (q and k rows)
};

/// Loads a tile's epilogue_inputs. The decode GEMV (gemv.cu) does so for its
/// first tile before pdl_wait(), while the launch before it may still run.
/// That is safe because nothing read here is written by the launch right
/// before, and every kernel triggers its dependents only after its own wait,
/// so whatever launched two or more back is complete:
/// - the bias and inv_freq are weights; positions, token_seq and seq_slot
///   are the step's inputs, copied before its first kernel;
/// - the page table is written by page_updates, the step's first kernel, two
///   launches before layer 0's qkv projection (embed runs between them; a
///   step that launched qkv right after page_updates would break this);
/// - the residual (residual_add: o and down) was last written by the down or
///   o projection two or more launches back (the attention and gate_up,
///   which run right before o and down, do not write it); besides,
///   launch_gemv launches o and down early only with late triggers, when
///   the kernel before them triggers after its own work.
/// gpu_launch's source test checks the wait-then-trigger order of every kernel.
template <gemv_epilogue Ep>
__device__ __forceinline__ epilogue_inputs load_epilogue_inputs(const gemv_args& a, int32_t p,
                                                                const pair_rows& rows,
                                                                int32_t m) {
  epilogue_inputs e;
  if (a.bias) {
    e.bias0 = to_float(a.bias[rows.r0]);
    if (rows.has_r1)
      e.bias1 = to_float(a.bias[rows.r1]);
  }
  if constexpr (Ep == gemv_epilogue::residual_add) {
    e.x0 = a.out_f32[int64_t(m) * a.n + rows.r0];
    if (rows.has_r1)
      e.x1 = a.out_f32[int64_t(m) * a.n + rows.r1];
  } else if constexpr (Ep == gemv_epilogue::qkv_rope) {
    const int32_t half = a.kv.head_dim / 2;
    const int32_t head = p / half;
    e.pos = a.batch.positions[m];
    if (head < a.num_heads + a.kv.kv_heads)
      e.freq = a.inv_freq[p % half];
    if (head >= a.num_heads) {
      const int32_t slot = a.batch.seq_slot[a.batch.token_seq[m]];
      e.page = a.kv.page_table[int64_t(slot) * a.kv.page_table_stride + e.pos / a.kv.page_size];
    }
  }
  return e;
}

template <int M, gemv_epilogue Ep>
__device__ __forceinline__ void epilogue(const gemv_args& a, int32_t p, const pair_rows& rows,
                                         int32_t m, float y0, float y1, const epilogue_inputs& e) {
  if (a.bias) {
    y0 += e.bias0;
    if (rows.has_r1)
      y1 += e.bias1;
  }
  if constexpr (Ep == gemv_epilogue::store_f32) {
    a.out_f32[int64_t(m) * a.n + rows.r0] = y0;
    if (rows.has_r1)
      a.out_f32[int64_t(m) * a.n + rows.r1] = y1;
  } else if constexpr (Ep == gemv_epilogue::residual_add) {
    a.out_f32[int64_t(m) * a.n + rows.r0] = e.x0 + y0;
    if (rows.has_r1)
      a.out_f32[int64_t(m) * a.n + rows.r1] = e.x1 + y1;
  } else if constexpr (Ep == gemv_epilogue::swiglu) {
    a.out_bf16[int64_t(m) * (a.n / 2) + p] = __float2bfloat16_rn(y0 / (1.0f + expf(-y0)) * y1);
  } else {
    const int32_t d = a.kv.head_dim, half = d / 2;
    const int32_t head = p / half, i = p % half;
    const int32_t kvh = a.kv.kv_heads;
    if (head < a.num_heads + kvh) {
      float c, s;
      rope_angle_of(e.freq, e.pos, c, s);
      rope_rotate(y0, y1, c, s);
    }
    if (head < a.num_heads) {
      bf16* q = a.out_bf16 + int64_t(m) * a.num_heads * d + head * d;
      q[i] = __float2bfloat16_rn(y0);
      q[i + half] = __float2bfloat16_rn(y1);
    } else if (a.kv.k8) {
      const bool is_k = head < a.num_heads + kvh;
      const int32_t h = head - a.num_heads - (is_k ? 0 : kvh);
      float* dst = a.kv.stage + ((int64_t(m) * 2 + (is_k ? 0 : 1)) * kvh + h) * d;
      dst[i] = y0;
      dst[i + half] = y1;
    } else {
      const bool is_k = head < a.num_heads + kvh;
      const int32_t h = head - a.num_heads - (is_k ? 0 : kvh);
      bf16* dst = (is_k ? a.kv.k : a.kv.v)
                  + ((int64_t(e.page) * kvh + h) * a.kv.page_size + e.pos % a.kv.page_size) * d;
      dst[i] = __float2bfloat16_rn(y0);
      dst[i + half] = __float2bfloat16_rn(y1);
    }
  }
}

/// The epilogue with its inputs loaded where it runs (the first-generation
/// GEMV, the skinny GEMM, the stand-alone RoPE kernel).
template <int M, gemv_epilogue Ep>
__device__ __forceinline__ void epilogue(const gemv_args& a, int32_t p, const pair_rows& rows,
                                         int32_t m, float y0, float y1) {
  epilogue<M, Ep>(a, p, rows, m, y0, y1, load_epilogue_inputs<Ep>(a, p, rows, m));
}

/// The end of a tile of the split GEMVs (gemv.cu, gemv_int4.cu): each
/// warp's sums reduced over its lanes, then, with KS warps a pair, over the
/// pair's warps through `red` (double-buffered by tile parity: one barrier a
/// tile) in a fixed order, so results do not depend on timing; lane m of the
/// pair's first warp runs the epilogue of batch row m.
template <int M, gemv_epilogue Ep, int KS>
__device__ __forceinline__ void finish_tile(const gemv_args& a, float (&acc0)[M],
                                            float (&acc1)[M],
                                            float (&red)[2][warps_per_block][M][2], int parity,
                                            int warp, int lane, int ks, bool active, int32_t p,
                                            const pair_rows& rows, const epilogue_inputs& ein) {
#pragma unroll
  for (int m = 0; m < M; ++m) {
    acc0[m] = warp_sum(acc0[m]);
    acc1[m] = warp_sum(acc1[m]);
  }
  if constexpr (KS == 1) {
    if (active) {
#pragma unroll
      for (int m = 0; m < M; ++m)
        if (lane == m && m < a.m)
          epilogue<M, Ep>(a, p, rows, m, acc0[m], acc1[m], ein);
    }
  } else {
#pragma unroll
    for (int m = 0; m < M; ++m)
      if (lane == m) {
        red[parity][warp][m][0] = acc0[m];
        red[parity][warp][m][1] = acc1[m];
      }
    __syncthreads();
    if (ks == 0 && active) {
#pragma unroll
      for (int m = 0; m < M; ++m)
        if (lane == m && m < a.m) {
          float y0 = 0.0f, y1 = 0.0f;
#pragma unroll
          for (int j = 0; j < KS; ++j) {
            y0 += red[parity][warp + j][m][0];
            y1 += red[parity][warp + j][m][1];
          }
          epilogue<M, Ep>(a, p, rows, m, y0, y1, ein);
        }
    }
  }
}

// -- host side, both generations -----------------------------------------------------

/// Blocks of a split GEMV kernel one SM holds, and the SMs.
struct gemv_launch_info {
  int32_t blocks_per_sm = 0;
  int32_t num_sms = 0;
};

/// The occupancy of `kernel` (threads_per_block threads, `smem` dynamic
/// bytes; its dynamic limit raised to `smem_limit` on first use), cached
/// per kernel and size. Needs the device current; any thread.
template <class... P>
gemv_launch_info gemv_occupancy(void (*kernel)(P...), size_t smem, int32_t smem_limit) {
  static std::mutex mtx;
  static std::map<std::pair<const void*, size_t>, gemv_launch_info> cache;
  std::lock_guard guard{mtx};
  const auto key = std::make_pair(reinterpret_cast<const void*>(kernel), smem);
  auto it = cache.find(key);
  if (it == cache.end()) {
    METRONOME_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(smem_limit)));
    int blocks = 0;
    METRONOME_CUDA(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads_per_block, smem));
    it = cache.emplace(key, gemv_launch_info{std::max(blocks, 1), 0}).first;
  }
  // The SMs of this thread's share (an engine in an sm_partition), not the
  // device's: a grid of one wave must fit the share.
  return gemv_launch_info{it->second.blocks_per_sm, launch_sms()};
}

/// How a split GEMV cuts its rows: KS warps a row pair, the tiles of
/// 8 / KS pairs, and each warp's slice of k.
struct gemv_split {
  int32_t ks = 1, tiles = 0, kslice = 0;
};

/// The most warps a pair (1, 2, 4, 8; info[i] the occupancy at KS = 2^i)
/// such that one wave of resident blocks covers all `pairs` and each warp
/// still has one load a lane (`warp_cols` inputs a warp) of each row; slices
/// are whole multiples of warp_cols.
inline gemv_split choose_gemv_split(int32_t pairs, int32_t k, int32_t warp_cols,
                                    const gemv_launch_info (&info)[4]) {
  int which = 0;
  for (int i = 1; i < 4; ++i) {
    const int64_t cand = int64_t(1) << i;
    const int64_t tiles = (int64_t(pairs) * cand + warps_per_block - 1) / warps_per_block;
    if (tiles <= int64_t(info[i].blocks_per_sm) * info[i].num_sms && cand * warp_cols <= k)
      which = i;
  }
  gemv_split s;
  s.ks = 1 << which;
  s.tiles = int32_t((int64_t(pairs) * s.ks + warps_per_block - 1) / warps_per_block);
  s.kslice = ((k + s.ks - 1) / s.ks + warp_cols - 1) / warp_cols * warp_cols;
  return s;
}


/// The checks every launch_gemv makes before it dispatches (both
/// generations): k in whole 16-byte vectors, a norm weight with a residual
/// input.
inline void check_gemv_args(const gemv_args& a) {
  if (a.k % 8 != 0)
    throw cuda_error("launch_gemv: k = " + std::to_string(a.k) + " is not a multiple of 8");
  if (a.residual_in && !a.norm_weight)
    throw cuda_error("launch_gemv: a residual input needs its norm weight");
}

/// Calls f.template operator()<M, Ep>() (f: a lambda
/// []<int M, gemv_epilogue Ep>() {...}) with Ep = epilogue and M the batch
/// rows m padded to 1, 2, 4 or 8; throws for m outside 1..8.
template <class F>
void dispatch_gemv(gemv_epilogue epilogue, int32_t m, F&& f) {
  const auto rows = [&]<gemv_epilogue Ep>() {
    switch (m) {
      case 1: return f.template operator()<1, Ep>();
      case 2: return f.template operator()<2, Ep>();
      case 3:
      case 4: return f.template operator()<4, Ep>();
      case 5:
      case 6:
      case 7:
      case 8: return f.template operator()<8, Ep>();
      default: throw cuda_error("launch_gemv: m = " + std::to_string(m) + " is not in 1..8");
    }
  };
  switch (epilogue) {
    case gemv_epilogue::store_f32: return rows.template operator()<gemv_epilogue::store_f32>();
    case gemv_epilogue::residual_add:
      return rows.template operator()<gemv_epilogue::residual_add>();
    case gemv_epilogue::swiglu: return rows.template operator()<gemv_epilogue::swiglu>();
    case gemv_epilogue::qkv_rope: return rows.template operator()<gemv_epilogue::qkv_rope>();
  }
}

} // namespace metronome::gpu::gemv_detail
