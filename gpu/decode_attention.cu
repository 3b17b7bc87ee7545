// Paged attention for decode: one query token per sequence over its cached
// keys and values, on the tensor cores, split along the context when the
// batch is too small to fill the GPU.
//
// Design note. A block serves one (sequence, kv head, context split) and all
// the query heads that share the kv head (GQA, up to 8), so each key and value
// is read from memory once. It has 4 warps, or 2 where that halves the waves
// of a large batch's grid (decode_attention_warps); the same code either way.
// Its warps take steps of 16 keys in turn and run
// them through m16n8k16 MMAs with the keys as the M dimension and the heads as
// N (S^T = K Q^T, then O^T += V^T P^T), so the 8 columns of an MMA hold the
// group's heads and no shared memory is needed: every lane loads its operands
// straight from the cache with 16-byte loads. That works because a dot product
// does not care in which order it visits the dimensions, nor a weighted sum
// over keys in which order it visits the keys: lane (g, t) loads D/4 dims of
// keys s(g) and s(g + 8) as its A fragments of K (the same dims of its head's
// q as B), and keys 4t .. 4t + 3, D/8 dims of V, which a byte permute turns
// into A fragments of V^T whose k order matches the key order s of the P
// fragments; s(2i + e) = 4i + e, s(8 + 2i + e) = 4i + 2 + e. Which dims: see
// tc_cfg in decode_attention_layout.hpp (the lanes sharing a row interleave
// their loads so that each load instruction reads whole sectors). P^T goes
// from the accumulator layout to the B layout with movmatrix (a register
// transpose). Each lane then holds
// its V dims of heads 2t and 2t + 1. The online softmax is in the log2 domain
// (ex2.approx; the max reduction over keys is three shuffles per step), keys
// for the next step are loaded while this one is computed, page ids one step
// earlier still. Warps merge through shared memory; with one split the block
// writes the output, otherwise the last split to finish (an atomic ticket)
// merges the partials with all its threads, with no second launch. The number
// of splits in use is derived on the device from each sequence's length (at
// least 64 keys each), so one captured graph serves any context.
//
// On the cuBLAS decode path the kernel also does what rope_kv_write_kernel
// would do before it (ROPE): it rotates q as it loads it from the raw qkv
// projection, and the block whose split holds the current token writes that
// token's k and v into the cache, then reads the cache coherently. The raw
// projection may also come as split-K partials (rope_input::partials), summed
// where they are read, so that the qkv GEMM can be split along k with no
// reduction launch.
//
// Shapes outside this kernel (head_dim 256, more than 8 heads per kv head) and
// the first generation on request go to decode_attention_v1.cu.

#include <algorithm>
#include <string>
#include <type_traits>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "gpu/cuda_check.hpp"
#include "gpu/decode_attention_layout.hpp"
#include "gpu/gemv_common.cuh"
#include "gpu/kernel_util.cuh"
#include "gpu/kernels.hpp"
#include "gpu/kv_e5m2.cuh"
#include "gpu/kernels_v1.hpp"
#include "gpu/launch.cuh"
#include "gpu/split_merge.cuh"

namespace metronome::gpu {

using namespace dev;
using decode_layout::tc_cfg;

namespace {

/// Warps a block of the default form (launch_tc's WARPS).
constexpr int default_warps = 4;
constexpr int step_keys = 16;
/// A split covers at least this many keys (shorter contexts use fewer
/// splits). 64 rather than 256: batch-1 steps at 1,024 keys took 2.4% (8B)
/// and 3.5% (1B) less, at 4,096 keys 0.5% and 1.5% less, at 128 keys 0.7%
/// (8B) and nothing (1B) less; batches of 64 the same (one split each)
/// (H200).
constexpr int32_t min_split_tokens = 64;
/// Most splits (partials buffer and merge are sized for it).
constexpr int32_t max_splits = 64;
constexpr float log2e = 1.4426950408889634f;

__device__ __forceinline__ uint32_t transpose8x8(uint32_t v) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(v));
  return r;
}

/// N (1, 2 or 4) 32-bit words at p in one load; no L1 allocation; L2
/// `policy` (l2_policy()). NC: through the non-coherent path, for memory
/// nobody writes during the kernel; the kernel reads the cache coherently
/// where one of its blocks writes the current token's row first (the fused
/// RoPE, the fp8 cache's staged writer).
template <int N, bool NC>
__device__ __forceinline__ void load_vec(uint32_t* w, const void* p, uint64_t policy) {
  static_assert(N == 1 || N == 2 || N == 4);
  if constexpr (N == 4) {
    if constexpr (NC)
      asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
          : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
          : "l"(p), "l"(policy));
    else
      asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                   : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                   : "l"(p), "l"(policy)
                   : "memory");
  } else if constexpr (N == 2) {
    if constexpr (NC)
      asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
          : "=r"(w[0]), "=r"(w[1])
          : "l"(p), "l"(policy));
    else
      asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
                   : "=r"(w[0]), "=r"(w[1])
                   : "l"(p), "l"(policy)
                   : "memory");
  } else {
    if constexpr (NC)
      asm("ld.global.nc.L1::no_allocate.L2::cache_hint.u32 %0, [%1], %2;"
          : "=r"(w[0])
          : "l"(p), "l"(policy));
    else
      asm volatile("ld.global.L1::no_allocate.L2::cache_hint.u32 %0, [%1], %2;"
                   : "=r"(w[0])
                   : "l"(p), "l"(policy)
                   : "memory");
  }
}

/// WORDS words of a lane's share of a row at p (tc_cfg): runs of RUN words,
/// STRIDE bytes apart, each read in loads of up to 16 bytes.
template <int WORDS, int RUN, int STRIDE, bool NC = true>
__device__ __forceinline__ void load_runs(uint32_t (&w)[WORDS], const void* p, uint64_t policy) {
  constexpr int piece = RUN < 4 ? RUN : 4;
#pragma unroll
  for (int c = 0; c < WORDS / RUN; ++c)
#pragma unroll
    for (int j = 0; j < RUN / piece; ++j)
      load_vec<piece, NC>(w + c * RUN + j * piece,
                          static_cast<const char*>(p) + c * STRIDE + 16 * j, policy);
}

template <int WORDS>
__device__ __forceinline__ void zero_words(uint32_t (&w)[WORDS]) {
#pragma unroll
  for (int i = 0; i < WORDS; ++i)
    w[i] = 0;
}

// -- the fp8 cache (kv_view::k8) ------------------------------------------------
// Its rows hold the same elements at the same indices in one byte each. A
// lane loads runs of 16 bytes (tc_cfg's WIDE layout: at head dim 128 its K
// dims are 16 t + 64 i + 0..15 and its V dims 16 g + 0..15, q loaded in the
// same order), so that a load instruction reads 64 bytes of each of 8 K rows
// or all 128 of 4 V rows: with the bf16 layout's offsets in bytes (8-byte
// loads) every instruction read half of that and the L2 saw twice the
// requests a byte. It turns them into pairs for the MMAs (e4m3 converts
// exactly to f16 and to bf16). Its warps issue about twice the bf16 form's
// instructions a byte, so the fp8 form also saves instructions where the
// bf16 form, bound by memory, gains nothing (LEAN): one page-table read for
// a step of 16 keys that lies in one page and in range, and no rescale of
// O where no maximum moved (alpha is then exactly 1). Together: 8B batch 64
// at 1,024 keys 57-61 -> 46-47 us on the H200.
// The row scales are applied outside the MMAs: a key's K scale to its scores
// (S = K Q^T in f16, q rounded to bf16 first as the bf16 cache's kernel does),
// its V scale to its probabilities before they meet V (O^T += V^T P^T in
// bf16, as with the bf16 cache: P times a small scale would fall below f16's
// range where one key holds most of the weight), the row sums l without it.

/// 32-bit words of e4m3 that hold what WORDS words of bf16 hold (a 16-bit
/// piece in the low half below 2 words).
template <int WORDS>
constexpr int words8 = WORDS >= 2 ? WORDS / 2 : 1;

/// The f16 pairs (BF16: bf16 pairs) of WORDS words from their e4m3 (E5M2:
/// e5m2) bytes (load_words8); both exact.
template <int WORDS, bool E5M2, bool BF16 = false>
__device__ __forceinline__ void fp8_to_f16_words(uint32_t (&out)[WORDS],
                                                 const uint32_t (&raw)[words8<WORDS>]) {
#pragma unroll
  for (int j = 0; j < WORDS; ++j) {
    const auto pair = static_cast<__nv_fp8x2_storage_t>(raw[j / 2] >> (16 * (j & 1)));
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, E5M2 ? __NV_E5M2 : __NV_E4M3);
    if constexpr (BF16) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
      out[j] = pack_bf16x2(f.x, f.y);
    } else {
      out[j] = uint32_t(h.x) | (uint32_t(h.y) << 16);
    }
  }
}

/// The fp8 cache's writer: the row (k, v) in sm_row into the cache at element
/// offset `row` (each row's scale, its largest |value| / 448, then its bytes:
/// rope_kv_write's arithmetic). Every thread of the block calls it.
template <int D, int THREADS>
__device__ __forceinline__ void store_row8(const kv_view& kv, int64_t row,
                                           const float (&sm_row)[2][D], float (&sm_amax)[2]) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (warp < 2) { // warp 0: k, warp 1: v
    float mx = 0.0f;
    for (int d = lane; d < D; d += 32)
      mx = fmaxf(mx, fabsf(sm_row[warp][d]));
    mx = warp_max(mx);
    if (lane == 0) {
      sm_amax[warp] = mx;
      (warp == 0 ? kv.k_scale : kv.v_scale)[row / D] = mx * (1.0f / 448.0f);
    }
  }
  __syncthreads();
  const float ik = e4m3_inverse_scale(sm_amax[0]), iv = e4m3_inverse_scale(sm_amax[1]);
  for (int d = tid; d < D; d += THREADS) {
    kv.k8[row + d] = to_e4m3(sm_row[0][d] * ik);
    kv.v8[row + d] = to_e4m3(sm_row[1][d] * iv);
  }
  __syncthreads();
}

/// The fp8_e5m2 cache's writer (kv_e5m2.cuh): the row (k, v) in sm_row of
/// position pos, kv head kvh, batch row b, into the cache at element offset
/// `row`. At a window's first position the block fixes the window's scales
/// from the row and the history in the cache (pt: the sequence's page
/// table); elsewhere it reads them from the window's first row. Every
/// thread of the block calls it; THREADS >= 64.
template <int D, int THREADS>
__device__ __forceinline__ void store_row_e5m2(const kv_view& kv, int64_t row,
                                               const float (&sm_row)[2][D],
                                               float (&sm_scale)[2], uint32_t* red,
                                               const int32_t* pt, int32_t kvh, int32_t pos,
                                               int32_t b) {
  static_assert(THREADS >= 64, "warps 0 and 1 take K and V");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int32_t first = pos - pos % kv_e5m2_window;
  if (pos == first) { // the same for the whole block, so are the barriers
    float history[2] = {0.0f, 0.0f};
    if (first > 0)
      e5m2_cached_max(kv, pt, kvh, max(0, first - kv_e5m2_history * kv_e5m2_window), first,
                      red, history);
    if (warp < 2) {
      float mx = history[warp];
      for (int d = lane; d < D; d += 32)
        mx = fmaxf(mx, e5m2_first_abs(sm_row[warp][d]));
      mx = warp_max(mx);
      if (lane == 0)
        sm_scale[warp] = e5m2_window_scale(mx);
    }
  } else if (tid < 2) {
    sm_scale[tid] =
      __ldcg((tid == 0 ? kv.k_scale : kv.v_scale) + e5m2_scale_row(kv, pt, kvh, first));
  }
  __syncthreads();
  const float sk = sm_scale[0], sv = sm_scale[1];
  const float ik = 1.0f / sk, iv = 1.0f / sv; // exact: powers of two
  e5m2_counts c;
  for (int d = tid; d < D; d += THREADS) {
    const float k = sm_row[0][d], v = sm_row[1][d];
    c.add(k, ik);
    c.add(v, iv);
    kv.k8[row + d] = to_e5m2(k * ik);
    kv.v8[row + d] = to_e5m2(v * iv);
  }
  if (tid == 0) {
    kv.k_scale[row / D] = sk;
    kv.v_scale[row / D] = sv;
  }
  e5m2_count_thread(kv, b, c);
  __syncthreads();
}

/// The K and V operands of one step of 16 keys for one lane.
template <int D>
struct step_regs {
  uint32_t k[2][tc_cfg<D>::kw]; // keys s(g), s(g + 8)
  uint32_t v[4][tc_cfg<D>::vw]; // keys 4t .. 4t + 3
};

/// step_regs from the fp8 cache: the bytes, and the K and V scales of keys
/// s(g), s(g + 8) (whose scores and probabilities this lane holds).
template <int D>
struct step_regs8 {
  uint32_t k[2][words8<tc_cfg<D>::kw>];
  uint32_t v[4][words8<tc_cfg<D>::vw>];
  float ks[2], vs[2];
};

/// A 32-bit global load the compiler issues where it is written.
__device__ __forceinline__ int32_t load_pinned(const int32_t* p) {
  int32_t v;
  asm volatile("ld.global.s32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

/// The two bf16 of a 32-bit word as floats (the low half, the element of the
/// lower index, first).
__device__ __forceinline__ float2 unpack2(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

/// ROPE: q is read from the raw qkv projection (rope.qkv, before bias and
/// RoPE) and rotated here, and the block whose split holds the current token
/// first writes that token's rotated k and its v into the cache (what
/// rope_kv_write_kernel does for every token), so that a decode step on the
/// cuBLAS path needs no RoPE launch. The arithmetic is rope_kv_write_kernel's,
/// through the same helpers (an absent bias adds zero to q here). Otherwise q
/// is the rotated q [tokens][heads][D].
template <int D, bool ROPE, int WARPS, bool KV8, bool E5M2 = false>
__global__ void __launch_bounds__(WARPS * 32)
  decode_attention_tc_kernel(attention_shape sh, const bf16* __restrict__ q, rope_input rope,
                             kv_view kv, batch_view batch, int32_t splits,
                             float* __restrict__ part_o, float* __restrict__ part_ml,
                             int32_t* __restrict__ counters, bf16* __restrict__ out,
                             bool kv_evict_first, bool late_trigger) {
  // The fp8 cache's form (LEAN, and tc_cfg's WIDE runs): its warps issue
  // about twice the instructions a byte of the bf16 form, so it reads a
  // step's page once and rescales O only where a maximum moved.
  constexpr bool LEAN = KV8;
  using C = tc_cfg<D, KV8>;
  using regs = std::conditional_t<KV8, step_regs8<D>, step_regs<D>>;
  constexpr int warps = WARPS, threads = WARPS * 32;
  __shared__ float sm_o[warps][8][D];
  // The fp8 writer's row (rotated k, v) and its two largest |values|.
  __shared__ float sm_row[KV8 ? 2 : 1][KV8 ? D : 1];
  __shared__ float sm_amax[2];
  __shared__ uint32_t sm_red[E5M2 ? 2 : 1];
  __shared__ float sm_cos[ROPE ? D / 2 : 1], sm_sin[ROPE ? D / 2 : 1];
  __shared__ float sm_m[warps][8], sm_l[warps][8];
  __shared__ float mg_w[8][max_splits];
  __shared__ float mg_l[8];
  __shared__ bool last;

  // The block's (sequence, split): from the grid, or from the host's work
  // list (balanced splits: a long context is cut into as many splits as its
  // keys need, so that one long sequence does not hold the step).
  // A listed grid is (kv heads, items): the blocks of one item's heads
  // run side by side, as the device rule's (splits, kv heads, sequences)
  // grid has them (they read the same pages), and unused items come last.
  int split = blockIdx.x, b = blockIdx.z, kvh = blockIdx.y, listed_splits = 0;
  if (batch.work) {
    const int32_t w = load_pinned(batch.work + blockIdx.y);
    if (w < 0)
      return;
    kvh = blockIdx.x;
    b = w >> 16;
    listed_splits = (w >> 8) & 0xff;
    split = w & 0xff;
  }
  const int group = sh.num_heads / sh.kv_heads;
  const int h0 = kvh * group;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;

  // With PDL, the kernel before (the qkv projection) may still run until
  // pdl_wait(). What it writes is q and the current token's k and v (or, with
  // ROPE, the raw projection this kernel reads); the lengths, slots and page
  // table come from the step's inputs, and the other keys and values from
  // earlier steps, all complete by then (the qkv kernel itself waited for
  // the kernel before it). So without ROPE the block reads those and loads
  // its first step of keys before waiting, unless that step holds the
  // current token: at batch 1 the attention's first two memory round trips
  // overlap the projection's tail.
  if constexpr (ROPE) {
    pdl_wait();
    pdl_trigger();
  }
  // All three before the branch below, so that their loads overlap; the
  // slot's would otherwise wait for the length (one more memory round trip
  // before the first page-table read). Volatile, or the compiler sinks the
  // slot's load below the branch.
  const int32_t len = load_pinned(batch.seq_len + b);
  const int32_t qrow = load_pinned(batch.seq_q_start + b);
  const int32_t slot = load_pinned(batch.seq_slot + b);
  const int32_t pos = len - 1;
  const int32_t lo = sh.window > 0 ? max(0, pos - sh.window + 1) : 0;
  const int32_t active =
    listed_splits > 0 ? listed_splits
                      : max(1, min(splits, (len - lo + min_split_tokens - 1) / min_split_tokens));
  if (split >= active)
    return;
  // Steps of 16 keys from lo rounded down; this split's share of them.
  const int32_t base0 = lo & ~(step_keys - 1);
  const int32_t nsteps = (len - base0 + step_keys - 1) / step_keys;
  const int32_t per_split = (nsteps + active - 1) / active;
  const int32_t s_begin = split * per_split;
  const int32_t s_end = min(nsteps, s_begin + per_split);

  const int32_t* pt = kv.page_table + int64_t(slot) * kv.page_table_stride;
  const int32_t ps = kv.page_size;
  const int32_t ps_shift = (ps & (ps - 1)) == 0 ? __ffs(ps) - 1 : -1;
  const int64_t head_stride = int64_t(ps) * D; // one (page, kv head) block
  // Keys of this lane within a step: K rows s(g), s(g + 8); V rows 4t .. 4t + 3.
  const int kr0 = 4 * (g >> 1) + (g & 1), kr1 = kr0 + 2;
  // Element offset of key j's row in the pools (j in range).
  auto row_in_pool = [&](int32_t j) -> int64_t {
    int32_t page, in_page;
    if (ps_shift >= 0) {
      page = pt[j >> ps_shift];
      in_page = j & (ps - 1);
    } else {
      page = pt[j / ps];
      in_page = j % ps;
    }
    return (int64_t(page) * kv.kv_heads + kvh) * head_stride + int64_t(in_page) * D;
  };
  // The same, or -1 if j is outside [lo, len).
  auto row_of = [&](int32_t j) -> int64_t {
    return j < lo || j >= len ? -1 : row_in_pool(j);
  };
  struct step_rows {
    int64_t k[2], v[4];
  };
  auto rows_of_step = [&](int32_t s, step_rows& r) {
    const int32_t base = base0 + s * step_keys;
    if (LEAN && ps % step_keys == 0 && base >= lo && base + step_keys <= len) {
      // The whole step in range and in one page (base is a multiple of 16).
      const int64_t r0 = row_in_pool(base);
      r.k[0] = r0 + kr0 * D;
      r.k[1] = r0 + kr1 * D;
#pragma unroll
      for (int i = 0; i < 4; ++i)
        r.v[i] = r0 + (4 * t + i) * D;
      return;
    }
    r.k[0] = row_of(base + kr0);
    r.k[1] = row_of(base + kr1);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      r.v[i] = row_of(base + 4 * t + i);
  };
  const uint64_t kv_policy = l2_policy(kv_evict_first);
  auto load_step = [&](const step_rows& r, regs& x) {
    if constexpr (KV8) {
      constexpr int kw8 = words8<C::kw>, vw8 = words8<C::vw>;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (r.k[i] >= 0) {
          // Coherent loads: a block of this kernel may write the current
          // row first (the fused RoPE, or kv.stage).
          load_runs<kw8, C::kcw / 2, C::k_stride, false>(x.k[i], kv.k8 + r.k[i] + C::k_base(t),
                                                         kv_policy);
          const int64_t row = r.k[i] / D; // of the scale arrays
          x.ks[i] = __ldcg(kv.k_scale + row);
          x.vs[i] = __ldcg(kv.v_scale + row);
        } else {
          zero_words<kw8>(x.k[i]);
          x.ks[i] = x.vs[i] = 0.0f;
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (r.v[i] < 0)
          zero_words<vw8>(x.v[i]);
        else if constexpr (C::vw == 1) // head_dim 16: 2 bytes
          x.v[i][0] = __ldcg(reinterpret_cast<const unsigned short*>(kv.v8 + r.v[i] + C::v_base(g)));
        else
          load_runs<vw8, C::vcw / 2, C::v_stride, false>(x.v[i], kv.v8 + r.v[i] + C::v_base(g),
                                                         kv_policy);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (r.k[i] >= 0)
          load_runs<C::kw, C::kcw, 2 * C::k_stride, !ROPE>(x.k[i], kv.k + r.k[i] + C::k_base(t),
                                                           kv_policy);
        else
          zero_words<C::kw>(x.k[i]);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (r.v[i] >= 0)
          load_runs<C::vw, C::vcw, 2 * C::v_stride, !ROPE>(x.v[i], kv.v + r.v[i] + C::v_base(g),
                                                           kv_policy);
        else
          zero_words<C::vw>(x.v[i]);
      }
    }
  };

  // Steps s_begin + warp, + warps, ...: keys one step ahead, rows two. The
  // first two steps' page ids are requested before q.
  int32_t s = s_begin + warp;
  step_rows r0, rows_next;
  if (s < s_end)
    rows_of_step(s, r0);
  else
    r0 = step_rows{{-1, -1}, {-1, -1, -1, -1}};
  if (s + warps < s_end)
    rows_of_step(s + warps, rows_next);
  else
    rows_next = step_rows{{-1, -1}, {-1, -1, -1, -1}};

  regs cur;
  // Whether this warp's first step is loaded before the wait (above).
  const bool early = !ROPE && s != nsteps - 1;
  if (early)
    load_step(r0, cur);
  if constexpr (!ROPE) {
    pdl_wait();
    if (!late_trigger)
      pdl_trigger();
  }

  // q of head g (zero for lanes past the group): the dims of K lane t holds.
  uint32_t qw[C::kw];
  if constexpr (!ROPE) {
    if (g < group)
      load_runs<C::kw, C::kcw, 2 * C::k_stride>(qw, q + (int64_t(qrow) * sh.num_heads + h0 + g) * D
                                                      + C::k_base(t),
                                                l2_policy(false));
    else
      zero_words<C::kw>(qw);
    if constexpr (KV8) {
#pragma unroll
      for (int w = 0; w < C::kw; ++w) {
        const float2 x = unpack2(qw[w]);
        qw[w] = pack_f16x2(x.x, x.y);
      }
      // The GEMV path (kv.stage): the block whose split holds the current
      // token quantises its rotated row into the cache before any warp
      // loads that step (early loads never hold it: see `early`).
      if (kv.stage && len > 0 && (nsteps - 1) / per_split == split) {
        const float* src = kv.stage + (int64_t(qrow) * 2 * kv.kv_heads + kvh) * D;
        for (int d = tid; d < D; d += threads) {
          sm_row[0][d] = src[d];
          sm_row[1][d] = src[int64_t(kv.kv_heads) * D + d];
        }
        __syncthreads();
        if constexpr (E5M2)
          store_row_e5m2<D, threads>(kv, row_of(pos), sm_row, sm_amax, sm_red, pt, kvh, pos, b);
        else
          store_row8<D, threads>(kv, row_of(pos), sm_row, sm_amax);
      }
    }
  } else {
    // Raw q (and bias) of the dims lane t holds, then of their rotation
    // partners (d + D/2 mod D: the same run shape, D/2 elements away). Where
    // a lane holds more than one run (bf16 from D = 64, fp8 at D = 128) the
    // partner of run c is this lane's run c ^ chunks / 2; otherwise it is the
    // one run of lane t ^ 2 (same g, so the same head).
    constexpr int half = D / 2;
    constexpr int cw = C::kcw; // words a run
    constexpr int chunks = C::kw / cw;
    const int64_t width = int64_t(sh.num_heads + 2 * sh.kv_heads) * D;
    const bf16* raw = rope.partials ? nullptr : rope.qkv + int64_t(qrow) * width;
    const float* part = rope.partials ? rope.partials + int64_t(qrow) * width : nullptr;
    // With partials, q's raw dims are the splits summed (one split at a time,
    // each split's loads issued together: one round trip a split), rounded to
    // the bf16 the unsplit projection stores; so are the writer's k and v.
    uint32_t own[C::kw], par[C::kw], bown[C::kw], bpar[C::kw];
    const int hq = (h0 + min(g, group - 1)) * D;
    const uint64_t qpol = l2_policy(false);
    if (!part) {
      load_runs<C::kw, C::kcw, 2 * C::k_stride>(own, raw + hq + C::k_base(t), qpol);
    } else {
      float2 v[C::kw];
#pragma unroll
      for (int w = 0; w < C::kw; ++w)
        v[w] = make_float2(0.0f, 0.0f);
      for (int32_t s2 = 0; s2 < rope.splits; ++s2) {
        const float* ps = part + s2 * rope.split_stride + hq + C::k_base(t);
#pragma unroll
        for (int w = 0; w < C::kw; ++w) {
          const float2 x = __ldcg(
            reinterpret_cast<const float2*>(ps + (w / cw) * C::k_stride + 2 * (w % cw)));
          v[w].x += x.x;
          v[w].y += x.y;
        }
      }
#pragma unroll
      for (int w = 0; w < C::kw; ++w)
        own[w] = pack_bf16x2(v[w].x, v[w].y);
    }
    if (rope.bias)
      load_runs<C::kw, C::kcw, 2 * C::k_stride>(bown, rope.bias + hq + C::k_base(t), qpol);
    else
      zero_words<C::kw>(bown);
#pragma unroll
    for (int w = 0; w < C::kw; ++w) {
      if constexpr (chunks > 1) {
        par[w] = own[((w / cw) ^ (chunks / 2)) * cw + w % cw];
        bpar[w] = bown[((w / cw) ^ (chunks / 2)) * cw + w % cw];
      } else {
        par[w] = __shfl_xor_sync(0xffffffffu, own[w], 2);
        bpar[w] = __shfl_xor_sync(0xffffffffu, bown[w], 2);
      }
    }
    // The angles of this position, and the current token's k and v into the
    // cache by the block that reads that row (len >= 1: see kernels.hpp).
    const bool writer = len > 0 && (nsteps - 1) / per_split == split;
    const int64_t cur_row = writer ? row_of(pos) : -1;
    // Thread tid writes k pairs (d, d + half) and v elements d for d = tid,
    // tid + threads, ... (one pass when the block has D threads), each
    // pass's raw values loaded together.
    for (int d = tid; d < D; d += threads) {
      const int kc = (sh.num_heads + kvh) * D + d;
      const int vc = (sh.num_heads + sh.kv_heads + kvh) * D + d;
      float raw_k0 = 0.0f, raw_k1 = 0.0f, raw_v = 0.0f;
      if (writer) {
        if (!part) {
          if (d < half) {
            raw_k0 = to_float(raw[kc]);
            raw_k1 = to_float(raw[kc + half]);
          }
          raw_v = to_float(raw[vc]);
        } else {
          for (int32_t s2 = 0; s2 < rope.splits; ++s2) {
            const float* ps = part + s2 * rope.split_stride;
            if (d < half) {
              raw_k0 += __ldcg(ps + kc);
              raw_k1 += __ldcg(ps + kc + half);
            }
            raw_v += __ldcg(ps + vc);
          }
          raw_k0 = to_float(__float2bfloat16_rn(raw_k0));
          raw_k1 = to_float(__float2bfloat16_rn(raw_k1));
          raw_v = to_float(__float2bfloat16_rn(raw_v));
        }
      }
      if (d < half) {
        float cs, sn;
        gemv_detail::rope_angle(rope.inv_freq, pos, d, cs, sn);
        sm_cos[d] = cs;
        sm_sin[d] = sn;
        if (writer) {
          float a = raw_k0, b = raw_k1;
          if (rope.bias) {
            a += to_float(rope.bias[kc]);
            b += to_float(rope.bias[kc + half]);
          }
          gemv_detail::rope_rotate(a, b, cs, sn);
          if constexpr (KV8) {
            sm_row[0][d] = a;
            sm_row[0][d + half] = b;
          } else {
            kv.k[cur_row + d] = __float2bfloat16_rn(a);
            kv.k[cur_row + d + half] = __float2bfloat16_rn(b);
          }
        }
      }
      if (writer) {
        float a = raw_v;
        if (rope.bias)
          a += to_float(rope.bias[vc]);
        if constexpr (KV8)
          sm_row[1][d] = a;
        else
          kv.v[cur_row + d] = __float2bfloat16_rn(a);
      }
    }
    __syncthreads();
    if constexpr (KV8) {
      // `writer` is the same for the whole block, so are the barriers.
      if (writer)
        if constexpr (E5M2)
          store_row_e5m2<D, threads>(kv, cur_row, sm_row, sm_amax, sm_red, pt, kvh, pos, b);
        else
          store_row8<D, threads>(kv, cur_row, sm_row, sm_amax);
    }
#pragma unroll
    for (int w = 0; w < C::kw; ++w) {
      const int d = C::k_elem(t, w);
      const float2 x = unpack2(own[w]), y = unpack2(par[w]);
      const float2 bx = unpack2(bown[w]), by = unpack2(bpar[w]);
      float r[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float mine = (e ? x.y : x.x) + (e ? bx.y : bx.x);
        float other = (e ? y.y : y.x) + (e ? by.y : by.x);
        const int i = (d + e) % half;
        // A dim below D/2 is the pair's first element, the others its second.
        if (d + e < half)
          gemv_detail::rope_rotate(mine, other, sm_cos[i], sm_sin[i]);
        else
          gemv_detail::rope_rotate(other, mine, sm_cos[i], sm_sin[i]);
        r[e] = mine;
      }
      // With the fp8 cache q is an f16 operand, rounded to bf16 first (exact
      // in f16), as the unfused kernel reads it from rope_kv_write's q.
      qw[w] = g < group ? (KV8 ? pack_f16x2(__bfloat162float(__float2bfloat16_rn(r[0])),
                                            __bfloat162float(__float2bfloat16_rn(r[1])))
                               : pack_bf16x2(r[0], r[1]))
                        : 0u;
    }
  }

  const float qscale = sh.scale * log2e;
  float o[C::ks][4];
#pragma unroll
  for (int i = 0; i < C::ks; ++i)
#pragma unroll
    for (int c = 0; c < 4; ++c)
      o[i][c] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; // heads 2t, 2t + 1

  if (!early)
    load_step(r0, cur);
  for (; s < s_end; s += warps) {
    regs nxt;
    load_step(rows_next, nxt);
    if (s + 2 * warps < s_end)
      rows_of_step(s + 2 * warps, rows_next);
    else
      rows_next = step_rows{{-1, -1}, {-1, -1, -1, -1}};

    // S^T[16 keys][8 heads]: rows s(g), s(g + 8); columns 2t, 2t + 1.
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (KV8) {
      uint32_t k0[C::kw], k1[C::kw];
      fp8_to_f16_words<C::kw, E5M2>(k0, cur.k[0]);
      fp8_to_f16_words<C::kw, E5M2>(k1, cur.k[1]);
#pragma unroll
      for (int kk = 0; kk < C::ks; ++kk) {
        const uint32_t a[4] = {k0[2 * kk], k1[2 * kk], k0[2 * kk + 1], k1[2 * kk + 1]};
        mma_f16(c, a, qw[2 * kk], qw[2 * kk + 1]);
      }
      c[0] *= cur.ks[0];
      c[1] *= cur.ks[0];
      c[2] *= cur.ks[1];
      c[3] *= cur.ks[1];
    } else {
#pragma unroll
      for (int kk = 0; kk < C::ks; ++kk) {
        const uint32_t a[4] = {cur.k[0][2 * kk], cur.k[1][2 * kk], cur.k[0][2 * kk + 1],
                               cur.k[1][2 * kk + 1]};
        mma_bf16(c, a, qw[2 * kk], qw[2 * kk + 1]);
      }
    }
    const int32_t base = base0 + s * step_keys;
    const bool ok0 = base + kr0 >= lo && base + kr0 < len;
    const bool ok1 = base + kr1 >= lo && base + kr1 < len;
    float alpha[2];
    uint32_t pk[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float s0 = ok0 ? c[e] : -INFINITY, s1 = ok1 ? c[2 + e] : -INFINITY;
      float mx = fmaxf(s0, s1);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      const float m_new = fmaxf(m[e], mx * qscale);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      alpha[e] = fast_exp2(m[e] - m_use); // 0 while nothing was seen
      m[e] = m_new;
      c[e] = fast_exp2(fmaf(s0, qscale, -m_use));
      c[2 + e] = fast_exp2(fmaf(s1, qscale, -m_use));
      l[e] = l[e] * alpha[e] + c[e] + c[2 + e];
    }
    // P^T as B fragments: (head g; keys 2t, 2t + 1) and (head g; keys 2t + 8, 2t + 9).
    if constexpr (KV8) {
      pk[0] = transpose8x8(pack_bf16x2(c[0] * cur.vs[0], c[1] * cur.vs[0]));
      pk[1] = transpose8x8(pack_bf16x2(c[2] * cur.vs[1], c[3] * cur.vs[1]));
    } else {
      pk[0] = transpose8x8(pack_bf16x2(c[0], c[1]));
      pk[1] = transpose8x8(pack_bf16x2(c[2], c[3]));
    }
    uint32_t vf[4][C::vw];
    if constexpr (KV8) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        fp8_to_f16_words<C::vw, E5M2, true>(vf[i], cur.v[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int w = 0; w < C::vw; ++w)
          vf[i][w] = cur.v[i][w];
    }
    // O^T[dims][heads] = O^T * alpha + V^T P^T, one m16 tile of dims at a time.
    // LEAN: alpha is exactly 1 where no maximum moved, so O keeps its scale.
    const bool rescale =
      !LEAN || __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f);
#pragma unroll
    for (int dt = 0; dt < C::ks; ++dt) {
      if (rescale) {
        o[dt][0] *= alpha[0];
        o[dt][1] *= alpha[1];
        o[dt][2] *= alpha[0];
        o[dt][3] *= alpha[1];
      }
      const uint32_t a[4] = {__byte_perm(vf[0][dt], vf[1][dt], 0x5410),
                             __byte_perm(vf[0][dt], vf[1][dt], 0x7632),
                             __byte_perm(vf[2][dt], vf[3][dt], 0x5410),
                             __byte_perm(vf[2][dt], vf[3][dt], 0x7632)};
      mma_bf16(o[dt], a, pk[0], pk[1]);
    }
    cur = nxt;
  }

  // Late triggers (kernels.hpp): the o projection after this kernel becomes
  // resident once every block is past its keys.
  if (!ROPE && late_trigger)
    pdl_trigger();
  // Row sums over the keys of the warp (lanes with the same t).
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 4);
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 8);
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 16);
  }
  // o[dt][e] is dim v_dim(g, dt) of head 2t + e; o[dt][2 + e] the next dim.
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    float* dst = &sm_o[warp][2 * t + e][0];
#pragma unroll
    for (int dt = 0; dt < C::ks; ++dt) {
      const int d0 = C::v_dim(g, dt);
      dst[d0] = o[dt][e];
      dst[d0 + 1] = o[dt][2 + e];
    }
    if (g == 0) {
      sm_m[warp][2 * t + e] = m[e];
      sm_l[warp][2 * t + e] = l[e];
    }
  }
  __syncthreads();

  // Merge the warps; write the output (one split) or this split's partial.
  const int nh = min(group, 8);
  merge_warps<true, threads>(sm_m, sm_l, sm_o, nh, tid, out, part_o, part_ml, sh.num_heads, qrow,
                             b, h0, splits, split, active);
  if (active == 1)
    return;

  // The last split to finish merges all of them (split_merge.cuh) and
  // resets the counter for the next step or graph replay.
  int32_t* counter = counters + int64_t(b) * sh.kv_heads + kvh;
  if (!arrive_last(counter, active, tid, last))
    return;
  // The first `pre` partial outputs of this thread's first item are
  // requested now, with the statistics below rather than after them: one
  // memory round trip less at the end of the kernel.
  constexpr int pre = 8;
  const int items = nh * (D / 4);
  float4 pv[pre];
  if (tid < items) {
    const int h = tid / (D / 4), d4 = (tid % (D / 4)) * 4;
    const int64_t hb = (int64_t(b) * sh.num_heads + h0 + h) * splits;
#pragma unroll
    for (int k = 0; k < pre; ++k)
      if (k < active)
        pv[k] = __ldcg(reinterpret_cast<const float4*>(part_o + (hb + k) * D + d4));
  }
  split_weights<true, max_splits>(part_ml, int64_t(b) * sh.num_heads + h0, splits, active, nh,
                                  warp, warps, lane, mg_w, mg_l);
  __syncthreads();
  for (int i = tid; i < items; i += threads) {
    const int h = i / (D / 4), d4 = (i % (D / 4)) * 4;
    const int64_t hb = (int64_t(b) * sh.num_heads + h0 + h) * splits;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    // Splits in order either way, so the sum does not depend on which were
    // prefetched.
    const int first = i == tid ? min(active, pre) : 0;
#pragma unroll
    for (int s2 = 0; s2 < pre; ++s2)
      if (s2 < first)
        fma4(mg_w[h][s2], pv[s2], acc);
#pragma unroll 8
    for (int s2 = first; s2 < active; ++s2)
      fma4(mg_w[h][s2], __ldcg(reinterpret_cast<const float4*>(part_o + (hb + s2) * D + d4)),
           acc);
    store_merged(out + (int64_t(qrow) * sh.num_heads + h0 + h) * D + d4, acc, mg_l[h]);
  }
  if (tid == 0)
    *counter = 0;
}

template <int D, int WARPS, bool KV8, bool E5M2>
void launch_tc(const attention_shape& sh, const bf16* q, const rope_input* rope,
               const kv_view& kv, const batch_view& batch, int32_t splits, float* part_o,
               float* part_ml, int32_t* counters, bf16* out, cudaStream_t stream) {
  const dim3 grid = batch.work
                     ? dim3(unsigned(sh.kv_heads), unsigned(batch.work_items), 1u)
                     : dim3(unsigned(splits), unsigned(sh.kv_heads), unsigned(batch.num_seqs));
  const bool hint = stream_hint_on(hint_decode_kv);
  if (rope)
    launch_kernel("decode_attention_tc_kernel",
                  decode_attention_tc_kernel<D, true, WARPS, KV8, E5M2>, grid, dim3(WARPS * 32), 0,
                  stream, sh, static_cast<const bf16*>(nullptr), *rope, kv, batch, splits,
                  part_o, part_ml, counters, out, hint, false);
  else
    launch_kernel("decode_attention_tc_kernel",
                  decode_attention_tc_kernel<D, false, WARPS, KV8, E5M2>, grid, dim3(WARPS * 32), 0,
                  stream, sh, q, rope_input{}, kv, batch, splits, part_o, part_ml, counters,
                  out, hint, late_triggers());
}

template <int D, int WARPS>
void launch_tc(const attention_shape& sh, const bf16* q, const rope_input* rope,
               const kv_view& kv, const batch_view& batch, int32_t splits, float* part_o,
               float* part_ml, int32_t* counters, bf16* out, cudaStream_t stream) {
  if (kv.k8 && kv.e5m2)
    return launch_tc<D, WARPS, true, true>(sh, q, rope, kv, batch, splits, part_o, part_ml,
                                           counters, out, stream);
  if (kv.k8)
    return launch_tc<D, WARPS, true, false>(sh, q, rope, kv, batch, splits, part_o, part_ml,
                                            counters, out, stream);
  launch_tc<D, WARPS, false, false>(sh, q, rope, kv, batch, splits, part_o, part_ml, counters,
                                    out, stream);
}

template <int D>
void launch_tc(const attention_shape& sh, const bf16* q, const rope_input* rope,
               const kv_view& kv, const batch_view& batch, int32_t splits, int32_t warps,
               float* part_o, float* part_ml, int32_t* counters, bf16* out, cudaStream_t stream) {
  if (warps == 2)
    return launch_tc<D, 2>(sh, q, rope, kv, batch, splits, part_o, part_ml, counters, out, stream);
  launch_tc<D, default_warps>(sh, q, rope, kv, batch, splits, part_o, part_ml, counters, out,
                              stream);
}

void launch_checked(const attention_shape& sh, const bf16* q, const rope_input* rope,
                    const kv_view& kv, const batch_view& batch, int32_t splits, int32_t warps,
                    float* part_o, float* part_ml, int32_t* counters, bf16* out,
                    cudaStream_t stream) {
  if (batch.num_seqs <= 0)
    return;
  if (sh.head_dim != kv.head_dim)
    throw cuda_error("launch_decode_attention: inconsistent head_dim");
  if (splits < 1 || splits > max_splits)
    throw cuda_error("launch_decode_attention: splits must lie in 1.." + std::to_string(max_splits));
  if (warps != 2 && warps != default_warps)
    throw cuda_error("launch_decode_attention: warps must be 2 or 4, not "
                     + std::to_string(warps));
  if (splits > 1 && (!part_o || !part_ml || !counters))
    throw cuda_error("launch_decode_attention: splits > 1 needs partial buffers and counters");
  if (kv.k8 && (!kv.v8 || !kv.k_scale || !kv.v_scale))
    throw cuda_error("launch_decode_attention: an fp8 cache needs k8, v8 and both scales");
  switch (sh.head_dim) {
    case 16: return launch_tc<16>(sh, q, rope, kv, batch, splits, warps, part_o, part_ml, counters, out, stream);
    case 32: return launch_tc<32>(sh, q, rope, kv, batch, splits, warps, part_o, part_ml, counters, out, stream);
    case 64: return launch_tc<64>(sh, q, rope, kv, batch, splits, warps, part_o, part_ml, counters, out, stream);
    case 128:
      return launch_tc<128>(sh, q, rope, kv, batch, splits, warps, part_o, part_ml, counters, out,
                            stream);
    default:
      throw cuda_error("launch_decode_attention: head_dim " + std::to_string(sh.head_dim)
                       + " is not supported here");
  }
}

/// Blocks an SM holds of both forms of the kernel for head_dim D and the
/// cache's form (the fewer).
template <int D, bool KV8, bool E5M2>
int32_t resident_blocks() {
  int with_rope = 0, without = 0;
  METRONOME_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
    &with_rope, decode_attention_tc_kernel<D, true, default_warps, KV8, E5M2>,
    default_warps * 32, 0));
  METRONOME_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
    &without, decode_attention_tc_kernel<D, false, default_warps, KV8, E5M2>,
    default_warps * 32, 0));
  return std::max(1, std::min(with_rope, without));
}

/// The fp8 forms' figure is the fewer of their two byte formats'.
template <int D>
int32_t resident_blocks(bool fp8) {
  return fp8 ? std::min(resident_blocks<D, true, false>(), resident_blocks<D, true, true>())
             : resident_blocks<D, false, false>();
}

bool use_v2(const attention_shape& sh) {
  return active_kernels().decode_attention != 1 && decode_attention_v2_supports(sh);
}

} // namespace

bool decode_attention_v2_supports(const attention_shape& sh) {
  const int32_t d = sh.head_dim;
  return (d == 16 || d == 32 || d == 64 || d == 128) && sh.kv_heads > 0
         && sh.num_heads % sh.kv_heads == 0 && sh.num_heads / sh.kv_heads <= 8;
}

bool attention_supports_head_dim(int32_t d) {
  return d == 16 || d == 32 || d == 64 || d == 128 || d == 256;
}

int32_t decode_attention_blocks_per_sm(const attention_shape& sh, bool fp8) {
  switch (sh.head_dim) {
    case 16: return resident_blocks<16>(fp8);
    case 32: return resident_blocks<32>(fp8);
    case 64: return resident_blocks<64>(fp8);
    case 128: return resident_blocks<128>(fp8);
    default: return 1; // the first generation's shapes: its split rule ignores this
  }
}

int32_t decode_attention_splits(const attention_shape& sh, int32_t num_seqs, int32_t num_sms,
                                int32_t blocks_per_sm) {
  if (!use_v2(sh))
    return decode_attention_splits_v1(sh, num_seqs, num_sms);
  // About two blocks per SM at long contexts (shorter ones use fewer splits
  // on the device), but never more blocks than the SMs hold at once, and
  // never more than max_splits. Two a SM rounded up can overshoot one wave
  // when an SM holds only two (head_dim 128: 224 registers a thread); the
  // few blocks left for a second wave then cost a whole block's time. 8B at
  // 32 sequences ran 2 splits, 512 blocks on 264 slots; 1 split took the
  // step from 5.86-6.02 to 5.55-5.69 ms on the H200.
  const int32_t blocks = std::max(1, num_seqs * sh.kv_heads);
  const int32_t wanted = (2 * num_sms + blocks - 1) / blocks;
  const int32_t one_wave = std::max(1, blocks_per_sm) * num_sms / blocks;
  return std::max(1, std::min({wanted, one_wave, max_splits}));
}

namespace {

/// Batches of at least this many sequences take the work list: below it the
/// device rule already splits every sequence (up to 33 splits at batch 1),
/// and the list's extra load would sit on every block's critical path.
constexpr int32_t work_min_seqs = 16;
/// Most splits of one sequence from the work list (the partials' stride).
constexpr int32_t work_max_splits = 32;

/// Items that fill one wave of blocks, at least one a sequence.
int32_t work_budget(const attention_shape& sh, int32_t num_seqs, int32_t num_sms,
                    int32_t blocks_per_sm) {
  return std::max(num_seqs, std::max(1, blocks_per_sm) * num_sms / std::max(1, sh.kv_heads));
}

} // namespace

int32_t decode_attention_work_items(const attention_shape& sh, int32_t num_seqs,
                                    int32_t num_sms, int32_t blocks_per_sm) {
  if (num_seqs < work_min_seqs || !use_v2(sh))
    return 0;
  return num_seqs + work_budget(sh, num_seqs, num_sms, blocks_per_sm);
}

int32_t decode_attention_work_splits() {
  return work_max_splits;
}

int32_t decode_attention_work(const attention_shape& sh, const int32_t* seq_len,
                              int32_t num_seqs, int32_t num_sms, int32_t blocks_per_sm,
                              int32_t* work, int32_t items) {
  // Design note. The device rule gives every sequence of a large batch one
  // split, so a step's attention lasts as long as its longest context: on
  // the H200, 8B, 64 sequences with 65,536 keys in all took 6.8 ms a step
  // at 1,024 each and 14.6 ms with four of them at 8,704 (gpu_bench
  // --decode-spread). Here each sequence gets about keys / K splits, K the
  // keys in all over the items that fill one wave (at least 64, as the
  // device rule's), rounded to the nearest (a sequence a little over K
  // keeps one split, as the device rule would), so that no block holds much
  // more than K keys. Rounding adds at most half an item a sequence, hence
  // the list's num_seqs items beyond the budget.
  const int32_t budget = work_budget(sh, num_seqs, num_sms, blocks_per_sm);
  auto keys_of = [&](int32_t b) {
    const int32_t len = std::max(1, seq_len[b]);
    return sh.window > 0 ? std::min(len, sh.window) : len;
  };
  int64_t total = 0;
  for (int32_t b = 0; b < num_seqs; ++b)
    total += keys_of(b);
  const int64_t k = std::max<int64_t>(min_split_tokens, (total + budget - 1) / budget);
  int32_t used = 0;
  for (int32_t b = 0; b < num_seqs; ++b) {
    const int64_t n = std::clamp<int64_t>((keys_of(b) + k / 2) / k, 1, work_max_splits);
    if (used + n > items)
      throw cuda_error("decode_attention_work: " + std::to_string(items)
                       + " items cannot hold the batch's splits");
    for (int32_t split = 0; split < n; ++split)
      work[used++] = (b << 16) | int32_t(n << 8) | split;
  }
  for (int32_t i = used; i < items; ++i)
    work[i] = -1;
  return used;
}

int32_t decode_attention_warps(const attention_shape& sh, int32_t num_seqs, int32_t splits,
                               int32_t num_sms, int32_t blocks_per_sm) {
  const int32_t forced = active_kernels().attention_warps;
  if (forced == 2 || forced == default_warps)
    return forced;
  // A 2-warp block takes about twice a 4-warp block's time for the same
  // keys (a warp streams at about the same rate either way while the SMs
  // hold as many warps), and an SM holds twice as many (the same registers
  // a thread). So the 2-warp form wins where it needs at most half the
  // waves: a grid just past one wave of 4-warp blocks runs its few leftover
  // blocks alone for a whole block's time, and a grid of 2-warp blocks that
  // fits one wave has no such tail. The H200's kernel times, 1,024 keys,
  // 4 -> 2 warps: 8B 48 sequences 70.1 -> 59.1 us, 64 76.8 -> 74.1, 128
  // 142.4 -> 140.5, and at 96 (1.5 of the 2-warp form's waves against 3 of
  // the 4-warp form's) 110.6 -> 123.0, which this rule keeps at 4; 1B 96
  // 69.4 -> 56.7, 128 76.6 -> 73.5. Within one wave of the 4-warp form fewer
  // warps only cut the loads in flight (8B, 32 sequences: 41.0 -> 47.6 us).
  const int64_t blocks = int64_t(std::max(1, num_seqs)) * sh.kv_heads * std::max(1, splits);
  const int64_t slots = int64_t(std::max(1, blocks_per_sm)) * std::max(1, num_sms);
  const int64_t waves4 = (blocks + slots - 1) / slots;
  const int64_t waves2 = (blocks + 2 * slots - 1) / (2 * slots);
  return waves4 > 1 && 2 * waves2 <= waves4 ? 2 : default_warps;
}

void launch_decode_attention(const attention_shape& sh, const bf16* q, const kv_view& kv,
                             const batch_view& batch, int32_t splits, int32_t warps,
                             float* part_o, float* part_ml, int32_t* counters, bf16* out,
                             cudaStream_t stream) {
  if (!use_v2(sh)) {
    if (kv.k8)
      throw cuda_error("launch_decode_attention: the first generation has no fp8 cache");
    return launch_decode_attention_v1(sh, q, kv, batch, splits, part_o, part_ml, counters, out,
                                      stream);
  }
  launch_checked(sh, q, nullptr, kv, batch, splits, warps, part_o, part_ml, counters, out,
                 stream);
}

bool decode_attention_fuses_rope(const attention_shape& sh) {
  return use_v2(sh) && active_kernels().decode_rope != 1;
}

void launch_decode_attention_rope(const attention_shape& sh, const rope_input& rope,
                                  const kv_view& kv, const batch_view& batch, int32_t splits,
                                  int32_t warps, float* part_o, float* part_ml,
                                  int32_t* counters, bf16* out, cudaStream_t stream) {
  if (!use_v2(sh))
    throw cuda_error("launch_decode_attention_rope: this shape has no fused kernel");
  if (!(rope.qkv || (rope.partials && rope.splits >= 1)) || !rope.inv_freq)
    throw cuda_error("launch_decode_attention_rope: qkv (or its partials) and inv_freq are "
                     "required");
  launch_checked(sh, nullptr, &rope, kv, batch, splits, warps, part_o, part_ml, counters, out,
                 stream);
}
} // namespace metronome::gpu
