// Tensor-core GEMM for decode steps of a few to 64 sequences ("skinny":
// M tokens against an N x K weight, M << N, K), with the GEMV's fused
// epilogues.
//
// Design note. From batch 4 to 64 a decode step is still bound by reading
// the weights once, but the GEMV's fp32 FMAs (26% of the bandwidth floor at
// eight tokens) and cuBLAS's tilings (40 to 75% at 64 tokens, plus separate
// kernels for RoPE, SwiGLU and biases) leave most of it unused. Here the
// weight rows are the M side of mma.m16n8k16 and the tokens the N side: one
// warp multiplies 32 weight rows by up to 64 tokens. Its weights arrive by
// bulk copies (the Hopper copy engine; one contiguous 512-byte row segment
// per lane and stage, completion counted on a shared-memory barrier) into a
// ring of two or three 256-wide stages of its own, so each row is read in
// long contiguous runs like the GEMV reads it; loading the mma fragments
// straight from global memory (16 bytes of 32 rows per lane and step) ran at
// half the bandwidth. Fragments come from shared memory by ldmatrix. The
// tokens' inputs are staged per block, 256 k at a time, double buffered with
// cp.async; the block's four row tiles share them. From 32 tokens two warps
// share each row tile, each with half the tokens, so that every SM partition
// has a warp issuing MMAs (one warp per partition left the tensor cores
// waiting: 48% of the bandwidth floor at 64 tokens). The 32 rows of a warp are 16
// output pairs exactly as the GEMV pairs them (RoPE's (i, i + d/2), SwiGLU's
// (j, inter + j)), so the epilogue combines each pair in registers: RoPE and
// the cache write, SwiGLU, bias, residual add. When the matrix has too few
// rows to fill the SMs, k is split across blocks; the last block of a row
// group to finish (an atomic counter, reset by that block) adds the partial
// sums in split order, so results do not depend on timing. The input must be
// bf16: the RMSNorm of the residual is a separate launch (a block cannot
// afford the inverse RMS of 64 full rows).
//
// 4-bit weights (W4A16, int4_layout's form) run the same kernel with
// 4-bit stages. A row's chunk is only 128 bytes, too little for a bulk copy
// each (a stage of 32 such copies per row tile kept the first version near
// a tenth of the bandwidth), so the whole block copies them with cp.async
// beside the inputs, eight threads a row, three chunks deep, and each
// group's scale-zero words are loaded a group ahead. Each lane turns the
// words of its four rows into the mma's A fragments itself instead of by
// ldmatrix. Lane (g, c) needs columns 2c and
// 2c + 1 of each 8-column word, which are its byte c: one PRMT puts that
// byte's two nibbles at bits 0 and 16, one LOP3 masks them under bf16 128's
// exponent (128 + q, exactly) and one bf16x2 FMA subtracts 128 + zero
// (exact: small integers). The group's scale multiplies the fp32 sums of
// its columns when the group ends, as in the 4-bit GEMV, so the products
// are exact where the dequantize-then-GEMM path rounded each weight to
// bf16. One read of 4-bit weights for up to 64 tokens replaces writing and
// reading a bf16 copy of every matrix each step.

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/gemv_common.cuh"
#include "gpu/kernel_util.cuh"
#include "gpu/kernels.hpp"
#include "gpu/launch.cuh"
#include "gpu/sm_partition.hpp"

namespace metronome::gpu {

using namespace dev;
using namespace gemv_detail;

namespace {

constexpr int row_tiles = 4;            // 32-row tiles per block
constexpr int chunk_k = 256;           // k per weight stage and per staged input round
constexpr int row_stride = chunk_k + 8; // 528 bytes: conflict-free ldmatrix rows
/// A 4-bit stage row: a chunk's 128 bytes and 16 of pad, so that the eight
/// rows g of a fragment's 8-byte loads fall on distinct banks.
constexpr int w4_row_bytes = chunk_k / 2 + 16;
/// Chunks of 4-bit weights and inputs in flight or in use per block.
constexpr int w4_stages = 3;

struct plan_params {
  int32_t tiles = 0;  // 16-pair tiles (32 weight rows)
  int32_t groups = 0; // blocks along the rows
  int32_t splits = 1; // blocks along k
  int32_t kslice = 0; // k per split (a multiple of chunk_k)
};

constexpr int token_tiles(int32_t m) {
  return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8;
}

/// Warps sharing one row tile, each with a share of the token tiles: from
/// 32 tokens one warp per SM partition would leave the tensor cores waiting.
template <int NT>
constexpr int token_warps() {
  return NT >= 4 ? 2 : 1;
}

template <int NT>
constexpr int block_threads() {
  return row_tiles * token_warps<NT>() * 32;
}

/// Weight stages per row tile: as many as fit beside the staged inputs.
/// The 4-bit form stages weights and inputs together, w4_stages deep.
template <int NT, bool W4>
constexpr int weight_stages() {
  return W4 ? w4_stages : NT <= 2 ? 3 : 2;
}

/// Bytes of one stage row.
template <bool W4>
constexpr int stage_row_bytes() {
  return W4 ? w4_row_bytes : row_stride * int(sizeof(bf16));
}

/// Input stages: two (bf16: the weights have their own ring), or one per
/// 4-bit stage.
template <bool W4>
constexpr int input_stages() {
  return W4 ? w4_stages : 2;
}

template <int NT, bool W4>
constexpr size_t smem_bytes() {
  return size_t(row_tiles) * weight_stages<NT, W4>() * 32 * stage_row_bytes<W4>()
         + size_t(input_stages<W4>()) * NT * 8 * row_stride * sizeof(bf16);
}

/// The bf16 pair (q - zero) of the nibbles of byte `sel & 3` of word w
/// (columns 2c and 2c + 1 of its eight), exactly; w_hi is w >> 4, sel is
/// c | (4 + c) << 8, neg_zero the pair -(128 + zero).
__device__ __forceinline__ uint32_t w4_pair(uint32_t w, uint32_t w_hi, uint32_t sel,
                                            uint32_t neg_zero) {
  const uint32_t biased = (__byte_perm(w, w_hi, sel) & 0x000F000Fu) | 0x43004300u;
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(biased), "r"(0x3F803F80u), "r"(neg_zero));
  return d;
}

/// -(128 + zero) as a bf16 pair, from a scale-zero word.
__device__ __forceinline__ uint32_t w4_neg_zero(uint32_t sz) {
  return (0xC300u + ((sz >> 16) & 0xFFu)) * 0x00010001u;
}

__device__ __forceinline__ float w4_scale(uint32_t sz) {
  return __half2float(__ushort_as_half(uint16_t(sz & 0xFFFFu)));
}

template <int NT, gemv_epilogue Ep, bool W4>
__global__ void __launch_bounds__(block_threads<NT>(), 1)
  skinny_kernel(const gemv_args a, const int4_weights w4, const plan_params pp, float* partials,
                int32_t* counters, bool evict_first) {
  constexpr int MP = NT * 8; // padded tokens
  constexpr int ST = weight_stages<NT, W4>();
  constexpr int TW = token_warps<NT>();
  constexpr int NW = NT / TW; // token tiles of one warp
  constexpr int threads = block_threads<NT>();
  constexpr int regs = 2 * NW * 4;
  constexpr int RB = stage_row_bytes<W4>();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // [row tile][stage][32 rows][RB bytes] weights, then [input stage][MP][row_stride]
  // inputs.
  unsigned char* wsm = smem_raw;
  bf16* xs = reinterpret_cast<bf16*>(wsm + row_tiles * ST * 32 * RB);
  __shared__ uint64_t bars[row_tiles][ST];
  __shared__ int32_t is_last;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int32_t split = blockIdx.x % pp.splits, group = blockIdx.x / pp.splits;
  // Warp w: row tile w % 4, token tiles [(w / 4) NW, (w / 4 + 1) NW); the
  // first warp of a row tile (owner) fills its stages.
  const int rt = warp % row_tiles, tok0 = (warp / row_tiles) * NW * 8;
  const bool owner = warp < row_tiles;
  const int32_t tile = group * row_tiles + rt;
  const bool active = tile < pp.tiles;
  const int32_t pairs = num_pairs<Ep>(a);
  const int32_t p0 = tile * 16 + g, p1 = p0 + 8;
  const pair_rows r0 = rows_of<Ep>(a, min(p0, pairs - 1));
  const pair_rows r1 = rows_of<Ep>(a, min(p1, pairs - 1));
  const int32_t k0 = split * pp.kslice, k1 = min(a.k, k0 + pp.kslice);
  const int32_t chunks = max(0, (k1 - k0 + chunk_k - 1) / chunk_k);

  // Lane l copies shared row l of every stage: rows 0-15 are the first rows
  // of the tile's 16 pairs, rows 16-31 their partners. Rows past the matrix
  // read a valid row; their results are never stored.
  const pair_rows mine = rows_of<Ep>(a, min(tile * 16 + (lane & 15), pairs - 1));
  const int32_t src_row = lane < 16 ? mine.r0 : (mine.has_r1 ? mine.r1 : mine.r0);
  const bf16* wsrc = a.w + int64_t(src_row) * a.k;
  unsigned char* wbuf = wsm + rt * ST * 32 * RB;
  uint64_t* bar = bars[rt];

  // Stage st <- weights of chunk ci: 32 bulk copies of one contiguous row
  // segment each (512 bytes for a whole chunk), one barrier per stage.
  const uint64_t policy = l2_policy(evict_first);
  auto fill = [&](int st, int32_t ci) {
    const int32_t kb = k0 + ci * chunk_k;
    const uint32_t bytes = uint32_t(min(chunk_k, k1 - kb)) * 2;
    if (lane == 0)
      mbar_arrive_expect(&bar[st], 32 * bytes);
    __syncwarp();
    bulk_copy_g2s(wbuf + (st * 32 + lane) * RB, wsrc + kb, bytes, &bar[st], policy);
  };

  // The 4-bit form's weights (the design note): every thread of the block
  // copies 16-byte pieces with cp.async, eight threads a row (coalesced),
  // beside the inputs: piece i of thread t is row (t + i threads) / 8 of the
  // block's 128, segment t % 8.
  constexpr int w4_pieces = W4 ? row_tiles * 32 * 8 / threads : 1;
  const unsigned char* w4_src[w4_pieces];
  if constexpr (W4) {
#pragma unroll
    for (int i = 0; i < w4_pieces; ++i) {
      const int r = (int(threadIdx.x) + i * threads) / 8;
      const int32_t t = group * row_tiles + r / 32;
      const int l = r % 32;
      const pair_rows pr = rows_of<Ep>(a, min(t * 16 + (l & 15), pairs - 1));
      const int32_t row = l < 16 ? pr.r0 : (pr.has_r1 ? pr.r1 : pr.r0);
      w4_src[i] = reinterpret_cast<const unsigned char*>(w4.q) + int64_t(row) * (a.k / 2)
                  + (threadIdx.x % 8) * 16;
    }
  }
  if (!W4 && active && owner) {
    if (lane < ST)
      mbar_init(&bar[lane], 1);
    mbar_init_fence();
    __syncwarp();
    // Weights are never written: their first stages go out before the wait.
#pragma unroll
    for (int st = 0; st < ST; ++st)
      if (st < chunks)
        fill(st, st);
  }
  if constexpr (TW > 1)
    __syncthreads(); // the barriers are initialised before anyone waits
  pdl_wait();
  pdl_trigger();

  // Inputs of chunk ci into input stage buf (and, 4-bit, its weights into
  // weight stage buf), one cp.async group; an empty group past the end.
  auto stage_x = [&](int32_t ci, int buf) {
    const int32_t kb = k0 + ci * chunk_k;
    if (ci < chunks) {
      constexpr int vecs = chunk_k / 8;
      for (int v = threadIdx.x; v < MP * vecs; v += threads) {
        const int m = v / vecs, kk = (v % vecs) * 8;
        const bool valid = m < a.m && kb + kk < k1;
        cp_async16(xs + (buf * MP + m) * row_stride + kk,
                   valid ? a.x + int64_t(m) * a.k + kb + kk : a.x, valid);
      }
      if constexpr (W4) {
        const int32_t seg_end = (k1 - kb) / 2; // bytes of this chunk in a row
#pragma unroll
        for (int i = 0; i < w4_pieces; ++i) {
          const int r = (int(threadIdx.x) + i * threads) / 8;
          const int seg = (threadIdx.x % 8) * 16;
          if (seg < seg_end)
            cp_async16(wsm + ((r / 32) * ST + buf) * 32 * RB + (r % 32) * RB + seg,
                       w4_src[i] + kb / 2, true);
        }
      }
    }
    cp_async_commit();
  };

  float acc[2][NW][4];
#pragma unroll
  for (int j = 0; j < NW; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[0][j][e] = acc[1][j][e] = 0.0f;
  // 4-bit: the current group's sums (unscaled), and its scale-zero words of
  // this lane's rows: [fragment a, b][rows g, g + 8].
  float gacc[2][NW][4];
  uint32_t gsz[2][2] = {{0, 0}, {0, 0}};
  uint32_t nz[2][2] = {{0, 0}, {0, 0}};
  const uint32_t sel = uint32_t(c) | (uint32_t(4 + c) << 8);
  // Rows of this lane's fragments, as the stage holds them (rows g, g + 8 of
  // each half: the first rows, then the partners, of pairs p0 and p1).
  const uint32_t* sz_a0 = w4.sz + int64_t(r0.r0) * w4.groups;
  const uint32_t* sz_a1 = w4.sz + int64_t(r1.r0) * w4.groups;
  const uint32_t* sz_b0 = w4.sz + int64_t(r0.has_r1 ? r0.r1 : r0.r0) * w4.groups;
  const uint32_t* sz_b1 = w4.sz + int64_t(r1.has_r1 ? r1.r1 : r1.r0) * w4.groups;
  // The next group's words, loaded a group ahead (a global load's latency
  // would stall every group's first k-step otherwise).
  uint32_t next_sz[2][2] = {{0, 0}, {0, 0}};
  int32_t next_gi = 0;
  auto fetch_group = [&](int32_t gi) {
    gi = min(gi, w4.groups - 1);
    next_sz[0][0] = __ldg(sz_a0 + gi);
    next_sz[0][1] = __ldg(sz_a1 + gi);
    next_sz[1][0] = __ldg(sz_b0 + gi);
    next_sz[1][1] = __ldg(sz_b1 + gi);
  };
  // k-steps left in the current group (counted down: no division a step).
  const int32_t group_steps = w4.group_size / 16;
  int32_t steps_left = 0;
  auto group_start = [&] {
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        gsz[f][h] = next_sz[f][h];
        nz[f][h] = w4_neg_zero(gsz[f][h]);
      }
    fetch_group(++next_gi);
    steps_left = group_steps;
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
      for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          gacc[f][j][e] = 0.0f;
  };
  auto group_end = [&] {
#pragma unroll
    for (int f = 0; f < 2; ++f) {
      const float s0 = w4_scale(gsz[f][0]), s1 = w4_scale(gsz[f][1]);
#pragma unroll
      for (int j = 0; j < NW; ++j) {
        acc[f][j][0] = fmaf(s0, gacc[f][j][0], acc[f][j][0]);
        acc[f][j][1] = fmaf(s0, gacc[f][j][1], acc[f][j][1]);
        acc[f][j][2] = fmaf(s1, gacc[f][j][2], acc[f][j][2]);
        acc[f][j][3] = fmaf(s1, gacc[f][j][3], acc[f][j][3]);
      }
    }
  };
  if constexpr (W4) {
    if (active && chunks > 0) {
      next_gi = k0 / w4.group_size;
      fetch_group(next_gi);
      group_start();
      steps_left = group_steps - (k0 % w4.group_size) / 16;
    }
  }

  // ldmatrix addresses: A tiles as in row-major m16k16, inputs as n8k8 pairs.
  const int a_row = lane & 15, a_col = (lane >> 4) * 8;
  const int b_row = (lane >> 4) * 8 + (lane & 7), b_col = ((lane >> 3) & 1) * 8;
  // bf16: inputs double buffered, weights in the bulk-copy ring. 4-bit: both
  // in w4_stages stages, w4_stages - 1 chunks ahead.
  constexpr int ahead = input_stages<W4>() - 1;
#pragma unroll
  for (int i = 0; i < ahead; ++i)
    stage_x(i, i);
  for (int32_t ci = 0; ci < chunks; ++ci) {
    const int buf = ci % input_stages<W4>();
    stage_x(ci + ahead, (ci + ahead) % input_stages<W4>());
    cp_async_wait<ahead>();
    __syncthreads();
    if (active) {
      const int st = W4 ? buf : ci % ST;
      if constexpr (!W4)
        mbar_wait(&bar[st], uint32_t(ci / ST) & 1u);
      const unsigned char* wt = wbuf + st * 32 * RB;
      const bf16* xb = xs + (buf * MP + tok0) * row_stride;
      const int32_t kb = k0 + ci * chunk_k;
      const int32_t ksteps = min(chunk_k, k1 - kb) / 16;
      // The fragments' products go to acc (bf16), or to the group's sums.
      float(*dst)[NW][4] = W4 ? gacc : acc;
#pragma unroll 4
      for (int32_t ks = 0; ks < ksteps; ++ks) {
        uint32_t fa[4], fb[4];
        if constexpr (W4) {
          if (steps_left == 0) {
            group_end();
            group_start();
          }
          --steps_left;
          // Words 2ks (columns 0-7) and 2ks + 1 (8-15) of rows g, g + 8, 16 +
          // g, 24 + g.
          const uint2 wa0 = *reinterpret_cast<const uint2*>(wt + g * RB + ks * 8);
          const uint2 wa1 = *reinterpret_cast<const uint2*>(wt + (g + 8) * RB + ks * 8);
          const uint2 wb0 = *reinterpret_cast<const uint2*>(wt + (g + 16) * RB + ks * 8);
          const uint2 wb1 = *reinterpret_cast<const uint2*>(wt + (g + 24) * RB + ks * 8);
          fa[0] = w4_pair(wa0.x, wa0.x >> 4, sel, nz[0][0]);
          fa[1] = w4_pair(wa1.x, wa1.x >> 4, sel, nz[0][1]);
          fa[2] = w4_pair(wa0.y, wa0.y >> 4, sel, nz[0][0]);
          fa[3] = w4_pair(wa1.y, wa1.y >> 4, sel, nz[0][1]);
          fb[0] = w4_pair(wb0.x, wb0.x >> 4, sel, nz[1][0]);
          fb[1] = w4_pair(wb1.x, wb1.x >> 4, sel, nz[1][1]);
          fb[2] = w4_pair(wb0.y, wb0.y >> 4, sel, nz[1][0]);
          fb[3] = w4_pair(wb1.y, wb1.y >> 4, sel, nz[1][1]);
        } else {
          const bf16* wtb = reinterpret_cast<const bf16*>(wt);
          ldmatrix_x4(fa, wtb + a_row * row_stride + ks * 16 + a_col);
          ldmatrix_x4(fb, wtb + (16 + a_row) * row_stride + ks * 16 + a_col);
        }
        if constexpr (NW == 1) {
          uint32_t x2[2];
          ldmatrix_x2(x2, xb + (lane & 7) * row_stride + ks * 16 + ((lane >> 3) & 1) * 8);
          mma_bf16(dst[0][0], fa, x2[0], x2[1]);
          mma_bf16(dst[1][0], fb, x2[0], x2[1]);
        } else {
#pragma unroll
          for (int j = 0; j < NW; j += 2) {
            uint32_t x4[4];
            ldmatrix_x4(x4, xb + (j * 8 + b_row) * row_stride + ks * 16 + b_col);
            mma_bf16(dst[0][j], fa, x4[0], x4[1]);
            mma_bf16(dst[1][j], fb, x4[0], x4[1]);
            mma_bf16(dst[0][j + 1], fa, x4[2], x4[3]);
            mma_bf16(dst[1][j + 1], fb, x4[2], x4[3]);
          }
        }
      }
      if constexpr (TW == 1 && !W4) {
        // The stage is read: refill it with the chunk ST ahead.
        if (ci + ST < chunks) {
          __syncwarp();
          fence_proxy_async();
          fill(st, ci + ST);
        }
      }
    }
    __syncthreads();
    if constexpr (TW > 1 && !W4) {
      // Both warps of the row tile have read the stage (the barrier above).
      if (active && owner && ci + ST < chunks) {
        fence_proxy_async();
        fill(ci % ST, ci + ST);
      }
    }
  }

  if constexpr (W4) {
    if (active && chunks > 0)
      group_end();
  }

  if (pp.splits > 1) {
    // Partials in fragment order: [block][register][thread], coalesced.
    float* flat = &acc[0][0][0];
    float* out = partials + int64_t(blockIdx.x) * regs * threads + threadIdx.x;
#pragma unroll
    for (int r = 0; r < regs; ++r)
      __stcg(out + r * threads, flat[r]);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
      is_last = atomicAdd(counters + group, 1) == pp.splits - 1;
    __syncthreads();
    if (!is_last)
      return;
    __threadfence();
    float sum[regs];
#pragma unroll
    for (int r = 0; r < regs; ++r)
      sum[r] = 0.0f;
    for (int32_t s = 0; s < pp.splits; ++s) {
      const float* theirs = partials
                            + int64_t(group * pp.splits + s) * regs * threads + threadIdx.x;
#pragma unroll
      for (int r = 0; r < regs; ++r)
        sum[r] += s == split ? flat[r] : __ldcg(theirs + r * threads);
    }
#pragma unroll
    for (int r = 0; r < regs; ++r)
      flat[r] = sum[r];
    if (threadIdx.x == 0)
      counters[group] = 0;
  }

  if (!active)
    return;
  // c0, c1: (row g, tokens 2c, 2c + 1); c2, c3: (row g + 8, same tokens).
#pragma unroll
  for (int j = 0; j < NW; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int32_t m = tok0 + 8 * j + 2 * c + e;
        const int32_t p = h ? p1 : p0;
        if (m < a.m && p < pairs)
          epilogue<1, Ep>(a, p, h ? r1 : r0, m, acc[0][j][2 * h + e], acc[1][j][2 * h + e]);
      }
}

// -- planning and launch -----------------------------------------------------------------

template <int NT, gemv_epilogue Ep, bool W4>
int32_t blocks_per_sm() {
  static std::once_flag once;
  static int32_t blocks = 1;
  std::call_once(once, [] {
    auto* kernel = skinny_kernel<NT, Ep, W4>;
    METRONOME_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(smem_bytes<NT, W4>())));
    int b = 0;
    METRONOME_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, block_threads<NT>(),
                                                                 smem_bytes<NT, W4>()));
    blocks = std::max(b, 1);
  });
  return blocks;
}

// Occupancy and the shared-memory attribute are set up once per process, on
// the first device that launches (one engine per process runs on one GPU;
// several GPUs would need them per device). The SM count is this thread's
// share (launch_sms: an engine in an sm_partition sizes grids to its SMs).
int32_t device_sms() {
  return launch_sms();
}

bool paired(gemv_epilogue ep) {
  return ep == gemv_epilogue::swiglu || ep == gemv_epilogue::qkv_rope;
}

/// Splits along k: minimises rounds of resident blocks x (chunks per block
/// + a fixed cost of about one and a half chunks per block), with the
/// partial sums kept under an eighth of the weight bytes. (A fixed cost of
/// half a chunk chose more splits and measured slower on the H200: 8B
/// gate_up at 8 tokens 75 -> 83 us.)
plan_params make_plan(gemv_epilogue ep, int32_t n, int32_t k, int32_t m, int32_t slots) {
  plan_params pp;
  const int32_t pairs = paired(ep) ? n / 2 : (n + 1) / 2;
  pp.tiles = (pairs + 15) / 16;
  pp.groups = (pp.tiles + row_tiles - 1) / row_tiles;
  const int32_t chunks = (k + chunk_k - 1) / chunk_k;
  const int32_t tokens = token_tiles(m) * 8;
  const int32_t max_splits = std::max(1, std::min(chunks, k / (16 * tokens)));
  double best = -1;
  for (int32_t s = 1; s <= max_splits; ++s) {
    const int32_t per = (chunks + s - 1) / s;
    if ((chunks + per - 1) / per != s)
      continue; // some split would get no work
    const int64_t rounds = (int64_t(pp.groups) * s + slots - 1) / slots;
    const double cost = double(rounds) * (per + 1.5);
    if (best < 0 || cost < best - 1e-9) {
      best = cost;
      pp.splits = s;
      pp.kslice = per * chunk_k;
    }
  }
  return pp;
}

template <int NT, bool W4>
int32_t slots_for(gemv_epilogue ep) {
  // Occupancy does not depend on the epilogue enough to matter for planning.
  (void)ep;
  return blocks_per_sm<NT, gemv_epilogue::store_f32, W4>() * device_sms();
}

template <bool W4 = false>
int32_t slots_of(gemv_epilogue ep, int32_t m) {
  switch (token_tiles(m)) {
    case 1: return slots_for<1, W4>(ep);
    case 2: return slots_for<2, W4>(ep);
    case 4: return slots_for<4, W4>(ep);
    default: return slots_for<8, W4>(ep);
  }
}

size_t partial_bytes(const plan_params& pp, int32_t m) {
  if (pp.splits <= 1)
    return 0;
  // Per block: 2 x (token tiles per warp) x 4 floats per thread, which is
  // 2 x (token tiles) x 4 floats per lane of the four row-tile warps.
  return size_t(pp.groups) * pp.splits * 2 * token_tiles(m) * 4 * row_tiles * 32
         * sizeof(float);
}

template <int NT, gemv_epilogue Ep, bool W4>
void launch_nt(const gemv_args& a, const int4_weights& w4, const plan_params& pp,
               float* partials, int32_t* counters, cudaStream_t stream) {
  (void)blocks_per_sm<NT, Ep, W4>(); // sets the shared-memory attribute once
  launch_kernel(W4 ? "skinny_gemm_int4_kernel" : "skinny_gemm_kernel", skinny_kernel<NT, Ep, W4>,
                dim3(pp.groups * pp.splits), dim3(block_threads<NT>()), smem_bytes<NT, W4>(),
                stream, a, w4, pp, partials, counters, stream_hint_on(hint_skinny_weights));
}

template <gemv_epilogue Ep, bool W4>
void launch_ep(const gemv_args& a, const int4_weights& w4, const plan_params& pp,
               float* partials, int32_t* counters, cudaStream_t stream) {
  switch (token_tiles(a.m)) {
    case 1: return launch_nt<1, Ep, W4>(a, w4, pp, partials, counters, stream);
    case 2: return launch_nt<2, Ep, W4>(a, w4, pp, partials, counters, stream);
    case 4: return launch_nt<4, Ep, W4>(a, w4, pp, partials, counters, stream);
    default: return launch_nt<8, Ep, W4>(a, w4, pp, partials, counters, stream);
  }
}

/// Checks, plans and launches either form (w4 null: bf16 a.w).
template <bool W4>
void launch_any(gemv_epilogue epilogue, const gemv_args& a, const int4_weights& w4,
                const skinny_gemm_scratch& s, cudaStream_t stream) {
  const char* what = W4 ? "launch_skinny_gemm_int4" : "launch_skinny_gemm";
  if (a.m < 1 || a.m > skinny_gemm_max_m)
    throw cuda_error(std::string(what) + ": m = " + std::to_string(a.m) + " is not in 1..64");
  if (!a.x || a.residual_in)
    throw cuda_error(std::string(what) + ": the input must be bf16 x (normalise it first)");
  if (epilogue == gemv_epilogue::qkv_rope && a.kv.k8 && !a.kv.stage)
    throw cuda_error(std::string(what) + ": qkv_rope with the fp8 cache needs kv.stage");
  if (!skinny_gemm_supports(epilogue, a.n, a.k, a.kv.head_dim)
      || (W4 && !skinny_gemm_int4_takes(w4, a.k)))
    throw cuda_error(std::string(what) + ": unsupported shape n = " + std::to_string(a.n)
                     + ", k = " + std::to_string(a.k));
  // Bulk copies and cp.async move 16-byte pieces: both bases must allow it.
  const auto* w = W4 ? static_cast<const void*>(w4.q) : static_cast<const void*>(a.w);
  if (!w || (reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(a.x)) % 16 != 0)
    throw cuda_error(std::string(what) + ": weights and input must be 16-byte aligned");
  plan_params pp = make_plan(epilogue, a.n, a.k, a.m, slots_of<W4>(epilogue, a.m));
  if (pp.splits > 1
      && (partial_bytes(pp, a.m) > s.partial_bytes || pp.groups > s.counters || !s.partials
          || !s.counter_data)) {
    pp.splits = 1; // always correct, possibly slower
    pp.kslice = (a.k + chunk_k - 1) / chunk_k * chunk_k;
  }
  switch (epilogue) {
    case gemv_epilogue::store_f32:
      return launch_ep<gemv_epilogue::store_f32, W4>(a, w4, pp, s.partials, s.counter_data,
                                                     stream);
    case gemv_epilogue::residual_add:
      return launch_ep<gemv_epilogue::residual_add, W4>(a, w4, pp, s.partials, s.counter_data,
                                                        stream);
    case gemv_epilogue::swiglu:
      return launch_ep<gemv_epilogue::swiglu, W4>(a, w4, pp, s.partials, s.counter_data, stream);
    case gemv_epilogue::qkv_rope:
      return launch_ep<gemv_epilogue::qkv_rope, W4>(a, w4, pp, s.partials, s.counter_data,
                                                    stream);
  }
}

} // namespace

bool skinny_gemm_supports(gemv_epilogue epilogue, int32_t n, int32_t k, int32_t head_dim) {
  if (k <= 0 || k % 16 != 0 || n <= 0)
    return false;
  if (epilogue == gemv_epilogue::swiglu && n % 2 != 0)
    return false;
  if (epilogue == gemv_epilogue::qkv_rope
      && (head_dim <= 0 || head_dim % 2 != 0 || n % head_dim != 0))
    return false;
  return true;
}

skinny_gemm_workspace_size skinny_gemm_workspace(gemv_epilogue epilogue, int32_t n, int32_t k,
                                                 int32_t max_m) {
  skinny_gemm_workspace_size out;
  for (int32_t m : {8, 16, 32, 64}) {
    const int32_t mm = std::min(m, std::max(max_m, 1));
    // Both weight forms: the 4-bit stages are smaller, so more blocks may
    // be resident and the plan may split more.
    for (const int32_t slots : {slots_of<false>(epilogue, mm), slots_of<true>(epilogue, mm)}) {
      const plan_params pp = make_plan(epilogue, n, k, mm, slots);
      out.partial_bytes = std::max(out.partial_bytes, partial_bytes(pp, mm));
      out.counters = std::max(out.counters, pp.groups);
    }
    if (m >= max_m)
      break;
  }
  return out;
}

void launch_skinny_gemm(gemv_epilogue epilogue, const gemv_args& a, const skinny_gemm_scratch& s,
                        cudaStream_t stream) {
  launch_any<false>(epilogue, a, int4_weights{}, s, stream);
}

bool skinny_gemm_int4_takes(const int4_weights& w, int32_t k) {
  return w && !w.perm && k > 0 && k % 32 == 0 && w.group_size > 0 && w.group_size % 32 == 0;
}

void launch_skinny_gemm_int4(gemv_epilogue epilogue, const gemv_args& a, const int4_weights& w,
                             const skinny_gemm_scratch& s, cudaStream_t stream) {
  launch_any<true>(epilogue, a, w, s, stream);
}

int32_t skinny_gemm_splits(gemv_epilogue epilogue, int32_t n, int32_t k, int32_t m) {
  return make_plan(epilogue, n, k, m, slots_of(epilogue, m)).splits;
}

} // namespace metronome::gpu
