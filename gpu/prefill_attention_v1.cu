// Flash-style attention for prompt chunks over the paged KV cache, first
// generation (2026-11-30; 64-row tiles, one m16 tile per warp). Kept for A/B
// measurement; prefill_attention.cu holds the kernel launched by default.
//
// Design note. A block computes one tile of 64 query rows of one sequence for
// one query head (4 warps x 16 rows) against that sequence's keys in tiles of
// 64, with tensor-core MMAs (m16n8k16, bf16 in, fp32 accumulate) and an
// online softmax in registers (FlashAttention-2's order: S = Q K^T, row max,
// P = exp2(S - m), O = O * alpha + P V, one division at the end). K and V
// tiles are gathered from the sequence's pages with cp.async into a
// double-buffered, padded (conflict-free for ldmatrix) shared-memory ring, so
// the next tile's loads overlap this tile's math. The chunk's own keys were
// written to the cache before this kernel, so a chunk attends to everything
// cached before it (chunked prefill) and causally to itself. Keys before the
// sliding window are neither loaded nor counted. Work items (sequence, tile)
// are listed longest first by the host so the last wave is short.

#include <string>

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

constexpr int bm = prefill_min_tile; // query rows per block
constexpr int bn = 64;           // keys per tile
constexpr int threads = 128;
constexpr float log2e = 1.4426950408889634f;

template <int D>
constexpr int row_stride() {
  return D + 8; // 16 bytes of padding per row
}

template <int D>
constexpr size_t smem_bytes() {
  return size_t(bm + 4 * bn) * row_stride<D>() * 2;
}

template <int D>
__global__ void __launch_bounds__(threads)
  prefill_attention_kernel(attention_shape sh, const bf16* __restrict__ q, kv_view kv,
                           batch_view batch, const prefill_item* __restrict__ items,
                           bf16* __restrict__ out) {
  constexpr int rs = row_stride<D>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* ks = qs + bm * rs;       // [2][bn][rs]
  bf16* vs = ks + 2 * bn * rs;   // [2][bn][rs]

  pdl_wait();
  pdl_trigger();
  const auto [head, kvh, item, tid, lane, warp, g, t4] = prefill_block_of(sh, items);
  if (item.seq < 0)
    return; // a padding item of a captured mixed step (whole block: no barrier skipped)

  const int32_t seq = item.seq;
  const int32_t row0 = batch.seq_q_start[seq];
  const int32_t n = batch.seq_q_start[seq + 1] - row0;
  const int32_t kv_len = batch.seq_len[seq];
  const int32_t start_pos = kv_len - n;
  const int32_t rows_valid = min(bm, n - item.row);
  const int32_t first_pos = start_pos + item.row;
  const int32_t last_pos = first_pos + rows_valid - 1;
  const int32_t lo = sh.window > 0 ? max(0, first_pos - sh.window + 1) : 0;
  const int32_t kv_end = last_pos + 1;
  const int32_t* pt = kv.page_table + int64_t(batch.seq_slot[seq]) * kv.page_table_stride;
  const int32_t ps = kv.page_size;
  const int64_t q_stride = int64_t(sh.num_heads) * D;

  // Q tile.
  constexpr int chunks_per_row = D / 8;
  for (int c = tid; c < bm * chunks_per_row; c += threads) {
    const int r = c / chunks_per_row, col = (c % chunks_per_row) * 8;
    const bool valid = r < rows_valid;
    const bf16* src = valid ? q + (int64_t(row0 + item.row + r)) * q_stride + head * D + col : q;
    cp_async16(qs + r * rs + col, src, valid);
  }
  auto load_kv = [&](int32_t kt, int buf) {
    for (int c = tid; c < bn * chunks_per_row; c += threads) {
      const int r = c / chunks_per_row, col = (c % chunks_per_row) * 8;
      const int32_t key = kt + r;
      const bool valid = key >= lo && key < kv_end;
      int64_t off = 0;
      if (valid)
        off = ((int64_t(pt[key / ps]) * kv.kv_heads + kvh) * ps + key % ps) * D + col;
      cp_async16(ks + (buf * bn + r) * rs + col, kv.k + off, valid);
      cp_async16(vs + (buf * bn + r) * rs + col, kv.v + off, valid);
    }
  };
  const int32_t kt_first = lo / bn * bn;
  load_kv(kt_first, 0);
  cp_async_commit();

  // Per-thread rows: g and g + 8 of this warp's 16.
  int32_t pos_r[2];
  for (int i = 0; i < 2; ++i) {
    const int r = warp * 16 + g + i * 8;
    pos_r[i] = first_pos + min(r, rows_valid - 1);
  }
  const float qscale = sh.scale * log2e;
  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c)
      o[j][c] = 0.0f;
  float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.0f, 0.0f};
  // Q's A fragments stay in registers for the whole key loop (D <= 128).
  constexpr bool q_in_regs = D <= 128;
  uint32_t qf[q_in_regs ? D / 16 : 1][4];

  int buf = 0;
  for (int32_t kt = kt_first; kt < kv_end; kt += bn, buf ^= 1) {
    const bool has_next = kt + bn < kv_end;
    if (has_next)
      load_kv(kt + bn, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    const bf16* kb = ks + buf * bn * rs;
    const bf16* vb = vs + buf * bn * rs;
    if (q_in_regs && kt == kt_first) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(qf[kk], qs + (warp * 16 + (lane & 15)) * rs + kk * 16 + (lane >> 4) * 8);
    }
    float s[bn / 8][4];
#pragma unroll
    for (int j = 0; j < bn / 8; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        s[j][c] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      if constexpr (q_in_regs) {
#pragma unroll
        for (int r = 0; r < 4; ++r)
          a[r] = qf[kk][r];
      } else {
        ldmatrix_x4(a, qs + (warp * 16 + (lane & 15)) * rs + kk * 16 + (lane >> 4) * 8);
      }
#pragma unroll
      for (int np = 0; np < bn / 16; ++np) {
        uint32_t b[4];
        const int j = lane >> 3;
        ldmatrix_x4(b, kb + (np * 16 + (j >> 1) * 8 + (lane & 7)) * rs + kk * 16 + (j & 1) * 8);
        mma_bf16(s[2 * np], a, b[0], b[1]);
        mma_bf16(s[2 * np + 1], a, b[2], b[3]);
      }
    }

    // Mask (only tiles that cross the diagonal or the window's edge), scale,
    // online softmax.
    float mx[2] = {-INFINITY, -INFINITY};
    const bool need_mask =
      kt + bn - 1 > first_pos || (sh.window > 0 && kt <= last_pos - sh.window);
    if (need_mask) {
#pragma unroll
      for (int j = 0; j < bn / 8; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const bool ok = score_visible(kt, j, c, t4, pos_r[c >> 1], sh.window);
          s[j][c] = ok ? s[j][c] * qscale : -INFINITY;
          mx[c >> 1] = fmaxf(mx[c >> 1], s[j][c]);
        }
    } else {
#pragma unroll
      for (int j = 0; j < bn / 8; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          s[j][c] *= qscale;
          mx[c >> 1] = fmaxf(mx[c >> 1], s[j][c]);
        }
    }
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m_r[i], mx[i]);
      alpha[i] = m_r[i] == -INFINITY ? 0.0f : exp2f(m_r[i] - m_new);
      m_r[i] = m_new;
      l_r[i] *= alpha[i];
    }
#pragma unroll
    for (int j = 0; j < bn / 8; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int i = c >> 1;
        const float p = m_r[i] == -INFINITY ? 0.0f : exp2f(s[j][c] - m_r[i]);
        s[j][c] = p;
        l_r[i] += p;
      }
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }

    // O += P V.
#pragma unroll
    for (int kk = 0; kk < bn / 16; ++kk) {
      uint32_t a[4];
      a[0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        uint32_t b[4];
        const int j = lane >> 3;
        ldmatrix_x4_trans(b, vb + (kk * 16 + (j & 1) * 8 + (lane & 7)) * rs + dn * 16 + (j >> 1) * 8);
        mma_bf16(o[2 * dn], a, b[0], b[1]);
        mma_bf16(o[2 * dn + 1], a, b[2], b[3]);
      }
    }
    __syncthreads(); // the buffer is refilled two tiles later
  }
  cp_async_wait<0>();

  // Normalise and write.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_r[i] += __shfl_xor_sync(0xffffffffu, l_r[i], 1);
    l_r[i] += __shfl_xor_sync(0xffffffffu, l_r[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = warp * 16 + g + i * 8;
    if (r >= rows_valid)
      continue;
    const float inv = l_r[i] > 0.0f ? 1.0f / l_r[i] : 0.0f;
    bf16* dst = out + int64_t(row0 + item.row + r) * q_stride + head * D;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<uint32_t*>(dst + j * 8 + 2 * t4) =
        pack_bf16x2(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
  }
}

template <int D>
void launch_prefill(const attention_shape& sh, const bf16* q, const kv_view& kv,
                    const batch_view& batch, const prefill_item* items, int32_t num_items,
                    bf16* out, cudaStream_t stream) {
  constexpr size_t smem = smem_bytes<D>();
  static const bool configured = [] {
    METRONOME_CUDA(cudaFuncSetAttribute(prefill_attention_kernel<D>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return true;
  }();
  (void)configured;
  const dim3 grid(unsigned(sh.num_heads), unsigned(num_items));
  launch_kernel("prefill_attention_kernel", prefill_attention_kernel<D>, grid, dim3(threads), smem,
                stream, sh, q, kv, batch, items, out);
}

} // namespace

void launch_prefill_attention_v1(const attention_shape& sh, const bf16* q, const kv_view& kv,
                              const batch_view& batch, const prefill_item* items,
                              int32_t num_items, bf16* out, cudaStream_t stream) {
  if (num_items <= 0)
    return;
  check_prefill_args(sh, kv, num_items);
  dispatch_prefill_head_dim(sh.head_dim, [&]<int D>() {
    launch_prefill<D>(sh, q, kv, batch, items, num_items, out, stream);
  });
}

} // namespace metronome::gpu
