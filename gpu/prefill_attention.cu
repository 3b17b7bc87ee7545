// Flash-style attention for prompt chunks over the paged KV cache.
//
// Design note. A block computes one tile of 128 query rows of one sequence
// for one query head against that sequence's keys in tiles of 64 (32 for
// head_dim 256), with tensor-core MMAs (m16n8k16, bf16 in, fp32 accumulate)
// and an online softmax in registers (FlashAttention-2's order: S = Q K^T, row
// max, P = exp2(S - m), O = O * alpha + P V, one division at the end). For
// head_dim <= 128 each of the 4 warps owns 32 rows (two m16 tiles), so every
// K or V fragment read from shared memory feeds two MMAs: shared-memory reads
// per MMA are 40% lower than with 16 rows a warp (the first generation, which
// was bound by them). Q stays in shared memory and is re-read per key tile (a
// register copy would not fit next to two accumulators). K and V tiles are
// gathered from the sequence's pages with cp.async into a double-buffered,
// padded (conflict-free for ldmatrix) ring, so the next tile's loads overlap
// this tile's math. Causal work is skipped per tile (keys past the block's
// last row are never loaded) and per warp (a warp whose rows all precede a
// key tile, or all lie past the window, skips its math). The exponent is
// ex2.approx on the scaled score (one FFMA folds the scale and the max): its
// relative error (2^-22) is far below the bf16 rounding of P. The chunk's own
// keys were written to the cache before this kernel, so a chunk attends to
// everything cached before it (chunked prefill) and causally to itself. Work
// items (sequence, tile) are listed longest first by the host so the last
// wave is short.
//
// Split keys. A short chunk after a long cached context (a prefix-cache hit)
// is one tile a head: 32 blocks on 132 SMs, each streaming every key. The
// host then asks for up to 8 splits (prefill_split): blockIdx.z takes a run
// of at least two key tiles and writes its unnormalised output with its row
// maxima and sums; a second kernel merges them, 8 rows of one head a block.
// The merge is a kernel of its own because it is wide: a merge by the last
// split block to finish (the threadfence reduction the decode attention uses
// for its one row a head) leaves one block reading 100 rows x 8 splits, 400
// KB, latency-bound with 128 threads, while the device idles (8B shape on the
// H200: 2.0-2.4 ms a step for a 100-token chunk after 1,000-4,000 cached
// tokens, about 70 us a layer).
//
// The fp8 cache (kv_view::k8; head_dim <= 128): cp.async fills the ring with
// the tiles' e4m3 (or e5m2) bytes and row scales instead, and once a tile has landed
// the block turns it into one K and V tile in the layout above, so the math
// is the same; the next tile's bytes still load during this tile's math. That
// tile is f16, not bf16: e4m3 converts to an f16 pair in one instruction
// (exactly) and the row's scale is one f16 multiply, where a bf16 tile took
// seven instructions a pair through fp32 (8B shape, 2,048 tokens on the H200:
// 181-183 us with bf16 tiles, 169 with f16 ones, 148-151 with the bf16
// cache). So with the fp8 cache Q (rounded to f16 once, in shared memory, at
// the first tile) and P are f16 operands too, as in the fp8 decode attention;
// the accumulators stay fp32. The scale's f16 rounding is exact enough for
// rows whose largest |value| is above about 0.03 (their scale is a normal
// f16); a smaller row keeps fewer bits of its scale and of its values, and
// one below about 1e-5 reads as zeros: values that small weigh nothing in a
// score or an output beside the bf16 rounding of the rest.

#include <string>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "gpu/cuda_check.hpp"
#include "gpu/kernel_util.cuh"
#include "gpu/kernels.hpp"
#include "gpu/kernels_v1.hpp"
#include "gpu/launch.cuh"
#include "gpu/prefill_common.cuh"

namespace metronome::gpu {

using namespace dev;
using namespace prefill_detail;

namespace {

constexpr float log2e = 1.4426950408889634f;
constexpr int32_t tile_rows = 128;

template <int D>
struct prefill_cfg {
  static constexpr int warps = D <= 128 ? 4 : 8;
  static constexpr int mt = D <= 128 ? 2 : 1; // m16 tiles per warp
  static constexpr int bm = warps * 16 * mt;  // query rows per block
  static constexpr int bn = D <= 128 ? 64 : 32;
  static constexpr int threads = warps * 32;
  static constexpr int rs = D + 8; // row stride in elements: 16 bytes of padding
  static constexpr size_t smem = size_t(bm + 4 * bn) * rs * 2;
  /// With the fp8 cache: Q, one bf16 K and V tile, and a ring of two tiles'
  /// bytes and scales (no more than smem for D <= 128).
  static constexpr size_t smem8 = size_t(bm + 2 * bn) * rs * 2 + size_t(4) * bn * D + 16 * bn;
  static constexpr int min_blocks = D <= 128 ? 2 : 1;
  static_assert(bm == tile_rows);
};

/// Eight e4m3 (E5M2: e5m2) values (8 bytes) times `scale`, as eight f16 (16
/// bytes): the conversion is exact, the product rounds once. An e5m2 window
/// scale times a saturated value can pass f16's range (up to 224 times the
/// window's reference): it is clamped to +-65504, never infinite.
template <bool E5M2>
__device__ __forceinline__ uint4 dequant8(uint32_t lo, uint32_t hi, __half2 scale) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = i < 2 ? lo : hi;
    const auto pair = static_cast<__nv_fp8x2_storage_t>(word >> (16 * (i & 1)));
    const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(pair, E5M2 ? __NV_E5M2 : __NV_E4M3);
    __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&hr), scale);
    if constexpr (E5M2) {
      const __half2 big = __float2half2_rn(65504.0f);
      v = __hmax2(__hmin2(v, big), __hneg2(big));
    }
    w[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

/// Eight bf16 (16 bytes) as eight f16, in place.
__device__ __forceinline__ void bf16x8_to_f16(uint4& x) {
  uint32_t* w = &x.x;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(w + i));
    w[i] = pack_f16x2(f.x, f.y);
  }
}

/// A tile's rows and keys: the query rows it holds and the keys they see.
struct tile_span {
  int32_t row0;       // first row of the sequence's chunk in q and out
  int32_t rows_valid; // rows of the tile that exist (<= tile_rows)
  int32_t first_pos;  // position of the tile's first row
  int32_t lo;         // first key any row sees (the window's edge)
  int32_t kv_end;     // one past the last key any row sees
};

__device__ __forceinline__ tile_span span_of(const attention_shape& sh, const batch_view& batch,
                                             const prefill_item& item) {
  tile_span t;
  t.row0 = batch.seq_q_start[item.seq];
  const int32_t n = batch.seq_q_start[item.seq + 1] - t.row0;
  const int32_t start_pos = batch.seq_len[item.seq] - n;
  t.rows_valid = min(tile_rows, n - item.row);
  t.first_pos = start_pos + item.row;
  t.lo = sh.window > 0 ? max(0, t.first_pos - sh.window + 1) : 0;
  t.kv_end = t.first_pos + t.rows_valid;
  return t;
}

/// How a tile's keys are split over at most `splits` blocks: `used` runs of
/// `per` key tiles of BN keys from `kt_first` (runs of at least two tiles).
/// The attention kernel and the merge both derive it from this.
struct key_split {
  int32_t kt_first, per, used;
};

template <int BN>
__device__ __forceinline__ key_split split_of(const tile_span& t, int32_t splits) {
  key_split k;
  k.kt_first = t.lo / BN * BN;
  const int32_t tiles = (t.kv_end - k.kt_first + BN - 1) / BN;
  const int32_t want = min(splits, max(1, tiles / 2));
  k.per = (tiles + want - 1) / want;
  k.used = (tiles + k.per - 1) / k.per;
  return k;
}

template <int D, bool KV8, bool E5M2 = false>
__global__ void __launch_bounds__(prefill_cfg<D>::threads, prefill_cfg<D>::min_blocks)
  prefill_attention_kernel(attention_shape sh, const bf16* __restrict__ q, kv_view kv,
                           batch_view batch, const prefill_item* __restrict__ items,
                           bf16* __restrict__ out, prefill_split split) {
  using C = prefill_cfg<D>;
  constexpr int MT = C::mt, BM = C::bm, BN = C::bn, RS = C::rs, T = C::threads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* ks = qs + BM * RS;                    // [2][BN][RS] (fp8: [BN][RS] of f16)
  bf16* vs = ks + (KV8 ? 1 : 2) * BN * RS;    // [2][BN][RS] (fp8: [BN][RS])
  // fp8 only: the ring of bytes [2][BN][D] and scales [2][BN] of K and V.
  uint8_t* rk = reinterpret_cast<uint8_t*>(vs + (KV8 ? 1 : 2) * BN * RS);
  uint8_t* rv = rk + 2 * BN * D;
  float* sk = reinterpret_cast<float*>(rv + 2 * BN * D);
  float* sv = sk + 2 * BN;

  pdl_wait();
  pdl_trigger();
  const auto [head, kvh, item, tid, lane, warp, g, t4] = prefill_block_of(sh, items);
  if (item.seq < 0)
    return; // a padding item of a captured mixed step (whole block: no barrier skipped)

  const tile_span span = span_of(sh, batch, item);
  const int32_t row0 = span.row0, rows_valid = span.rows_valid, first_pos = span.first_pos;
  const int32_t window = sh.window;
  const int32_t lo = span.lo, kv_end = span.kv_end;
  const int32_t* pt = kv.page_table + int64_t(batch.seq_slot[item.seq]) * kv.page_table_stride;
  const int32_t ps = kv.page_size;
  // Split over keys (blockIdx.z): each of `used` blocks takes a run of at
  // least two key tiles; prefill_merge_kernel combines their partials.
  int32_t k_begin, k_stop;
  bool split_out;
  {
    const key_split plan = split_of<BN>(span, int32_t(gridDim.z));
    if (int32_t(blockIdx.z) >= plan.used)
      return;
    k_begin = plan.kt_first + int32_t(blockIdx.z) * plan.per * BN;
    k_stop = min(kv_end, k_begin + plan.per * BN);
    split_out = plan.used > 1;
  }
  const int32_t ps_shift = (ps & (ps - 1)) == 0 ? __ffs(ps) - 1 : -1;
  const int64_t q_stride = int64_t(sh.num_heads) * D;

  // Q tile.
  constexpr int cpr = D / 8; // 16-byte chunks per row
  for (int c = tid; c < BM * cpr; c += T) {
    const int r = c / cpr, col = (c % cpr) * 8;
    const bool valid = r < rows_valid;
    const bf16* src = valid ? q + int64_t(row0 + item.row + r) * q_stride + head * D + col : q;
    cp_async16(qs + r * RS + col, src, valid);
  }
  // Row of key `key` in the pools, or -1 outside [lo, kv_end).
  auto row_of = [&](int32_t key) -> int64_t {
    if (key < lo || key >= kv_end)
      return -1;
    int32_t page, in_page;
    if (ps_shift >= 0) {
      page = pt[key >> ps_shift];
      in_page = key & (ps - 1);
    } else {
      page = pt[key / ps];
      in_page = key % ps;
    }
    return (int64_t(page) * kv.kv_heads + kvh) * ps + in_page;
  };
  auto load_kv = [&](int32_t kt, int buf) {
    if constexpr (KV8) {
      constexpr int cpr8 = D / 16; // 16-byte chunks of a row of bytes
      for (int c = tid; c < BN * cpr8; c += T) {
        const int r = c / cpr8, col = (c % cpr8) * 16;
        const int64_t row = row_of(kt + r);
        const int64_t off = row >= 0 ? row * D + col : 0;
        cp_async16(rk + (buf * BN + r) * D + col, kv.k8 + off, row >= 0);
        cp_async16(rv + (buf * BN + r) * D + col, kv.v8 + off, row >= 0);
      }
      for (int r = tid; r < BN; r += T) {
        const int64_t row = row_of(kt + r);
        cp_async4(sk + buf * BN + r, kv.k_scale + (row >= 0 ? row : 0), row >= 0);
        cp_async4(sv + buf * BN + r, kv.v_scale + (row >= 0 ? row : 0), row >= 0);
      }
    } else {
      for (int c = tid; c < BN * cpr; c += T) {
        const int r = c / cpr, col = (c % cpr) * 8;
        const int32_t key = kt + r;
        const bool valid = key >= lo && key < kv_end;
        int64_t off = 0;
        if (valid) {
          int32_t page, in_page;
          if (ps_shift >= 0) {
            page = pt[key >> ps_shift];
            in_page = key & (ps - 1);
          } else {
            page = pt[key / ps];
            in_page = key % ps;
          }
          off = ((int64_t(page) * kv.kv_heads + kvh) * ps + in_page) * D + col;
        }
        cp_async16(ks + (buf * BN + r) * RS + col, kv.k + off, valid);
        cp_async16(vs + (buf * BN + r) * RS + col, kv.v + off, valid);
      }
    }
  };
  load_kv(k_begin, 0);
  cp_async_commit();

  // This warp's rows, and each thread's rows g and g + 8 of each m16 tile.
  const int wrow0 = warp * 16 * MT;
  const int32_t w_first_pos = first_pos + min(wrow0, rows_valid - 1);
  const int32_t w_last_pos = first_pos + min(wrow0 + 16 * MT - 1, rows_valid - 1);
  int32_t pos_r[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i)
      pos_r[mt][i] = first_pos + min(wrow0 + mt * 16 + g + i * 8, rows_valid - 1);

  const float qscale = sh.scale * log2e;
  float o[MT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        o[mt][j][c] = 0.0f;
  // Row max in the scaled (log2) domain and the thread's partial row sums.
  float m_r[MT][2], l_r[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      m_r[mt][i] = -INFINITY;
      l_r[mt][i] = 0.0f;
    }

  int buf = 0;
  for (int32_t kt = k_begin; kt < k_stop; kt += BN, buf ^= 1) {
    if (kt + BN < k_stop)
      load_kv(kt + BN, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if constexpr (KV8) {
      // Q to f16 once (it landed with the first tile).
      if (kt == k_begin)
        for (int c = tid; c < BM * cpr; c += T) {
          uint4* at = reinterpret_cast<uint4*>(qs + (c / cpr) * RS + (c % cpr) * 8);
          uint4 x = *at;
          bf16x8_to_f16(x);
          *at = x;
        }
      // This tile's bytes to f16 values, 16 a thread at a time (the ring's
      // zero-filled rows, keys outside the window, stay zero).
      constexpr int c16 = D / 16;
      for (int c = tid; c < BN * c16; c += T) {
        const int r = c / c16, col = (c % c16) * 16;
        const int at = (buf * BN + r) * D + col;
        const uint4 kb = *reinterpret_cast<const uint4*>(rk + at);
        const uint4 vb = *reinterpret_cast<const uint4*>(rv + at);
        const __half2 ksc = __float2half2_rn(sk[buf * BN + r]);
        const __half2 vsc = __float2half2_rn(sv[buf * BN + r]);
        uint4* kd = reinterpret_cast<uint4*>(ks + r * RS + col);
        uint4* vd = reinterpret_cast<uint4*>(vs + r * RS + col);
        kd[0] = dequant8<E5M2>(kb.x, kb.y, ksc);
        kd[1] = dequant8<E5M2>(kb.z, kb.w, ksc);
        vd[0] = dequant8<E5M2>(vb.x, vb.y, vsc);
        vd[1] = dequant8<E5M2>(vb.z, vb.w, vsc);
      }
      __syncthreads();
    }

    // Skip tiles wholly after this warp's rows or wholly before its window.
    const bool skip = kt > w_last_pos || (window > 0 && kt + BN - 1 <= w_first_pos - window);
    if (!skip) {
      const bf16* kb = ks + (KV8 ? 0 : buf * BN * RS);
      const bf16* vb = vs + (KV8 ? 0 : buf * BN * RS);
      float s[MT][BN / 8][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c)
            s[mt][j][c] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          ldmatrix_x4(a[mt], qs + (wrow0 + mt * 16 + (lane & 15)) * RS + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < BN / 16; ++np) {
          uint32_t b[4];
          const int j = lane >> 3;
          ldmatrix_x4(b, kb + (np * 16 + (j >> 1) * 8 + (lane & 7)) * RS + kk * 16 + (j & 1) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma<KV8>(s[mt][2 * np], a[mt], b[0], b[1]);
            mma<KV8>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
          }
        }
      }

      // Mask (only tiles that cross the diagonal or the window's edge), then
      // the online softmax in the scaled domain.
      const bool need_mask =
        kt + BN - 1 > w_first_pos || (window > 0 && kt <= w_last_pos - window);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        float mx[2] = {-INFINITY, -INFINITY};
        if (need_mask) {
#pragma unroll
          for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              const bool ok = score_visible(kt, j, c, t4, pos_r[mt][c >> 1], window);
              s[mt][j][c] = ok ? s[mt][j][c] : -INFINITY;
              mx[c >> 1] = fmaxf(mx[c >> 1], s[mt][j][c]);
            }
        } else {
#pragma unroll
          for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c)
              mx[c >> 1] = fmaxf(mx[c >> 1], s[mt][j][c]);
        }
        float m_use[2], alpha[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
          mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
          const float m_new = fmaxf(m_r[mt][i], mx[i] * qscale);
          m_use[i] = m_new == -INFINITY ? 0.0f : m_new;
          alpha[i] = fast_exp2(m_r[mt][i] - m_use[i]); // 0 while nothing was seen
          m_r[mt][i] = m_new;
          l_r[mt][i] *= alpha[i];
        }
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int i = c >> 1;
            const float p = fast_exp2(fmaf(s[mt][j][c], qscale, -m_use[i])); // 0 for -inf
            s[mt][j][c] = p;
            l_r[mt][i] += p;
          }
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
          o[mt][j][0] *= alpha[0];
          o[mt][j][1] *= alpha[0];
          o[mt][j][2] *= alpha[1];
          o[mt][j][3] *= alpha[1];
        }
      }

      // O += P V.
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          constexpr auto pack = KV8 ? pack_f16x2 : pack_bf16x2;
          pa[mt][0] = pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[mt][1] = pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[mt][2] = pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[mt][3] = pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dn = 0; dn < D / 16; ++dn) {
          uint32_t b[4];
          const int j = lane >> 3;
          ldmatrix_x4_trans(b, vb + (kk * 16 + (j & 1) * 8 + (lane & 7)) * RS + dn * 16 + (j >> 1) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma<KV8>(o[mt][2 * dn], pa[mt], b[0], b[1]);
            mma<KV8>(o[mt][2 * dn + 1], pa[mt], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads(); // the buffer is refilled two tiles later
  }
  cp_async_wait<0>();

  if (split_out) {
    // Partial output (unnormalised, against this block's row maxima), the
    // row maxima and sums, for prefill_merge_kernel.
    const int64_t part = (int64_t(blockIdx.y) * gridDim.x + head) * gridDim.z + blockIdx.z;
    float* po = split.o + part * BM * D;
    float* pml = split.ml + part * BM * 2;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float l = l_r[mt][i];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int r = wrow0 + mt * 16 + g + i * 8;
        if (r >= rows_valid)
          continue;
        if (t4 == 0) {
          pml[2 * r] = m_r[mt][i];
          pml[2 * r + 1] = l;
        }
#pragma unroll
        for (int j = 0; j < D / 8; ++j)
          *reinterpret_cast<float2*>(po + r * D + j * 8 + 2 * t4) =
            make_float2(o[mt][j][2 * i], o[mt][j][2 * i + 1]);
      }
    return;
  }

  // Normalise and write.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float l = l_r[mt][i];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int r = wrow0 + mt * 16 + g + i * 8;
      if (r >= rows_valid)
        continue;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      bf16* dst = out + int64_t(row0 + item.row + r) * q_stride + head * D;
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<uint32_t*>(dst + j * 8 + 2 * t4) =
          pack_bf16x2(o[mt][j][2 * i] * inv, o[mt][j][2 * i + 1] * inv);
    }
}

constexpr int merge_rows = 8;     // rows of one head a merge block combines
constexpr int merge_threads = 128;

/// Combines the split blocks' partial outputs of `merge_rows` rows of one
/// tile and head (grid: heads x items x tile_rows / merge_rows): each split's
/// weight exp2(m_s - M) / sum_s(exp2(m_s - M) l_s), then the weighted sum.
/// Tiles that ran unsplit were written by the attention kernel.
template <int D>
__global__ void __launch_bounds__(merge_threads)
  prefill_merge_kernel(attention_shape sh, batch_view batch, const prefill_item* __restrict__ items,
                       bf16* __restrict__ out, prefill_split split) {
  constexpr int BN = prefill_cfg<D>::bn, BM = prefill_cfg<D>::bm;
  __shared__ float w[merge_rows][prefill_max_splits];
  pdl_wait();
  pdl_trigger();
  const int head = blockIdx.x;
  const prefill_item item = items[blockIdx.y];
  if (item.seq < 0)
    return;
  const tile_span span = span_of(sh, batch, item);
  const int32_t used = split_of<BN>(span, split.splits).used;
  const int r0 = int(blockIdx.z) * merge_rows;
  if (used <= 1 || r0 >= span.rows_valid)
    return;
  const int rows = min(merge_rows, span.rows_valid - r0);
  const int64_t part0 = (int64_t(blockIdx.y) * gridDim.x + head) * split.splits;
  const int tid = threadIdx.x;
  if (tid < rows) {
    const float* ml = split.ml + part0 * BM * 2 + (r0 + tid) * 2;
    float mx = -INFINITY;
    for (int z = 0; z < used; ++z)
      mx = fmaxf(mx, ml[z * BM * 2]);
    float sum = 0.0f;
    for (int z = 0; z < used; ++z) {
      const float m = ml[z * BM * 2];
      const float e = m == -INFINITY ? 0.0f : fast_exp2(m - mx);
      w[tid][z] = e;
      sum += e * ml[z * BM * 2 + 1];
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int z = 0; z < used; ++z)
      w[tid][z] *= inv;
  }
  __syncthreads();
  const int64_t q_stride = int64_t(sh.num_heads) * D;
  const float* o0 = split.o + part0 * BM * D + int64_t(r0) * D;
  for (int e = tid * 4; e < rows * D; e += merge_threads * 4) {
    const int r = e / D, d = e % D;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int z = 0; z < used; ++z) {
      const float4 v = *reinterpret_cast<const float4*>(o0 + int64_t(z) * BM * D + e);
      const float wz = w[r][z];
      acc.x = fmaf(wz, v.x, acc.x);
      acc.y = fmaf(wz, v.y, acc.y);
      acc.z = fmaf(wz, v.z, acc.z);
      acc.w = fmaf(wz, v.w, acc.w);
    }
    uint2 packed;
    packed.x = pack_bf16x2(acc.x, acc.y);
    packed.y = pack_bf16x2(acc.z, acc.w);
    *reinterpret_cast<uint2*>(out + int64_t(span.row0 + item.row + r0 + r) * q_stride + head * D
                              + d) = packed;
  }
}

template <int D, bool KV8, bool E5M2 = false>
void launch_prefill(const attention_shape& sh, const bf16* q, const kv_view& kv,
                    const batch_view& batch, const prefill_item* items, int32_t num_items,
                    bf16* out, const prefill_split& split, cudaStream_t stream) {
  using C = prefill_cfg<D>;
  constexpr size_t smem = KV8 ? C::smem8 : C::smem;
  static const bool configured = [] {
    METRONOME_CUDA(cudaFuncSetAttribute(prefill_attention_kernel<D, KV8, E5M2>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return true;
  }();
  (void)configured;
  const dim3 grid(unsigned(sh.num_heads), unsigned(num_items), unsigned(split.splits));
  launch_kernel("prefill_attention_kernel", prefill_attention_kernel<D, KV8, E5M2>, grid,
                dim3(C::threads), smem, stream, sh, q, kv, batch, items, out, split);
  if (split.splits > 1)
    launch_kernel("prefill_merge_kernel", prefill_merge_kernel<D>,
                  dim3(unsigned(sh.num_heads), unsigned(num_items), unsigned(C::bm / merge_rows)),
                  dim3(merge_threads), 0, stream, sh, batch, items, out, split);
}

template <int D>
void launch_prefill(const attention_shape& sh, const bf16* q, const kv_view& kv,
                    const batch_view& batch, const prefill_item* items, int32_t num_items,
                    bf16* out, const prefill_split& split, cudaStream_t stream) {
  if constexpr (D <= 128) {
    if (kv.k8 && kv.e5m2)
      return launch_prefill<D, true, true>(sh, q, kv, batch, items, num_items, out, split,
                                           stream);
    if (kv.k8)
      return launch_prefill<D, true>(sh, q, kv, batch, items, num_items, out, split, stream);
  } else {
    if (kv.k8)
      throw cuda_error("launch_prefill_attention: the fp8 cache needs head_dim <= 128");
  }
  launch_prefill<D, false>(sh, q, kv, batch, items, num_items, out, split, stream);
}

} // namespace

int32_t prefill_tile_rows() {
  return active_kernels().prefill_attention == 1 ? prefill_min_tile : tile_rows;
}

void launch_prefill_attention(const attention_shape& sh, const bf16* q, const kv_view& kv,
                              const batch_view& batch, const prefill_item* items,
                              int32_t num_items, bf16* out, cudaStream_t stream,
                              const prefill_split& split) {
  if (num_items <= 0)
    return;
  if (split.splits < 1 || split.splits > prefill_max_splits
      || (split.splits > 1 && (!split.o || !split.ml)))
    throw cuda_error("launch_prefill_attention: splits must lie in 1.."
                     + std::to_string(prefill_max_splits) + ", with scratch beyond 1");
  if (kv.k8 && (!kv.v8 || !kv.k_scale || !kv.v_scale))
    throw cuda_error("launch_prefill_attention: an fp8 cache needs k8, v8 and both scales");
  if (active_kernels().prefill_attention == 1) {
    if (kv.k8)
      throw cuda_error("launch_prefill_attention: the first generation has no fp8 cache");
    return launch_prefill_attention_v1(sh, q, kv, batch, items, num_items, out, stream);
  }
  check_prefill_args(sh, kv, num_items);
  dispatch_prefill_head_dim(sh.head_dim, [&]<int D>() {
    launch_prefill<D>(sh, q, kv, batch, items, num_items, out, split, stream);
  });
}

} // namespace metronome::gpu
