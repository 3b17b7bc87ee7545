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

namespace metronome::gpu {

using namespace dev;
using namespace gemv_detail;

namespace {

constexpr int row_tiles = 4;            // 32-row tiles per block
constexpr int chunk_k = 256;           // k per weight stage and per staged input round
constexpr int row_stride = chunk_k + 8; // 528 bytes: conflict-free ldmatrix rows

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
template <int NT>
constexpr int weight_stages() {
  return NT <= 2 ? 3 : 2;
}

template <int NT>
constexpr size_t smem_bytes() {
  return (size_t(row_tiles) * weight_stages<NT>() * 32 + size_t(2) * NT * 8) * row_stride
         * sizeof(bf16);
}

template <int NT, gemv_epilogue Ep>
__global__ void __launch_bounds__(block_threads<NT>(), 1)
  skinny_kernel(const gemv_args a, const plan_params pp, float* partials, int32_t* counters,
                bool evict_first) {
  constexpr int MP = NT * 8; // padded tokens
  constexpr int ST = weight_stages<NT>();
  constexpr int TW = token_warps<NT>();
  constexpr int NW = NT / TW; // token tiles of one warp
  constexpr int threads = block_threads<NT>();
  constexpr int regs = 2 * NW * 4;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // [row tile][stage][32 rows][row_stride] weights, then [2][MP][row_stride] inputs.
  bf16* wsm = reinterpret_cast<bf16*>(smem_raw);
  bf16* xs = wsm + row_tiles * ST * 32 * row_stride;
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
  bf16* wbuf = wsm + rt * ST * 32 * row_stride;
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
    bulk_copy_g2s(wbuf + (st * 32 + lane) * row_stride, wsrc + kb, bytes, &bar[st], policy);
  };
  if (active && owner) {
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

  auto stage_x = [&](int32_t ci, int buf) {
    const int32_t kb = k0 + ci * chunk_k;
    constexpr int vecs = chunk_k / 8;
    for (int v = threadIdx.x; v < MP * vecs; v += threads) {
      const int m = v / vecs, kk = (v % vecs) * 8;
      const bool valid = m < a.m && kb + kk < k1;
      cp_async16(xs + (buf * MP + m) * row_stride + kk,
                 valid ? a.x + int64_t(m) * a.k + kb + kk : a.x, valid);
    }
    cp_async_commit();
  };

  float acc[2][NW][4];
#pragma unroll
  for (int j = 0; j < NW; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[0][j][e] = acc[1][j][e] = 0.0f;

  if (chunks > 0)
    stage_x(0, 0);
  // ldmatrix addresses: A tiles as in row-major m16k16, inputs as n8k8 pairs.
  const int a_row = lane & 15, a_col = (lane >> 4) * 8;
  const int b_row = (lane >> 4) * 8 + (lane & 7), b_col = ((lane >> 3) & 1) * 8;
  for (int32_t ci = 0; ci < chunks; ++ci) {
    const int buf = ci & 1;
    if (ci + 1 < chunks) {
      stage_x(ci + 1, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (active) {
      const int st = ci % ST;
      mbar_wait(&bar[st], uint32_t(ci / ST) & 1u);
      const bf16* wt = wbuf + st * 32 * row_stride;
      const bf16* xb = xs + (buf * MP + tok0) * row_stride;
      const int32_t ksteps = min(chunk_k, k1 - (k0 + ci * chunk_k)) / 16;
#pragma unroll 4
      for (int32_t ks = 0; ks < ksteps; ++ks) {
        uint32_t fa[4], fb[4];
        ldmatrix_x4(fa, wt + a_row * row_stride + ks * 16 + a_col);
        ldmatrix_x4(fb, wt + (16 + a_row) * row_stride + ks * 16 + a_col);
        if constexpr (NW == 1) {
          uint32_t x2[2];
          ldmatrix_x2(x2, xb + (lane & 7) * row_stride + ks * 16 + ((lane >> 3) & 1) * 8);
          mma_bf16(acc[0][0], fa, x2[0], x2[1]);
          mma_bf16(acc[1][0], fb, x2[0], x2[1]);
        } else {
#pragma unroll
          for (int j = 0; j < NW; j += 2) {
            uint32_t x4[4];
            ldmatrix_x4(x4, xb + (j * 8 + b_row) * row_stride + ks * 16 + b_col);
            mma_bf16(acc[0][j], fa, x4[0], x4[1]);
            mma_bf16(acc[1][j], fb, x4[0], x4[1]);
            mma_bf16(acc[0][j + 1], fa, x4[2], x4[3]);
            mma_bf16(acc[1][j + 1], fb, x4[2], x4[3]);
          }
        }
      }
      if constexpr (TW == 1) {
        // The stage is read: refill it with the chunk ST ahead.
        if (ci + ST < chunks) {
          __syncwarp();
          fence_proxy_async();
          fill(st, ci + ST);
        }
      }
    }
    __syncthreads();
    if constexpr (TW > 1) {
      // Both warps of the row tile have read the stage (the barrier above).
      if (active && owner && ci + ST < chunks) {
        fence_proxy_async();
        fill(ci % ST, ci + ST);
      }
    }
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

template <int NT, gemv_epilogue Ep>
int32_t blocks_per_sm() {
  static std::once_flag once;
  static int32_t blocks = 1;
  std::call_once(once, [] {
    auto* kernel = skinny_kernel<NT, Ep>;
    METRONOME_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(smem_bytes<NT>())));
    int b = 0;
    METRONOME_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, block_threads<NT>(),
                                                                 smem_bytes<NT>()));
    blocks = std::max(b, 1);
  });
  return blocks;
}

// Occupancy, SM count and the shared-memory attribute are set up once per
// process, on the first device that launches (one engine per process runs on
// one GPU; several GPUs would need them per device).
int32_t device_sms() {
  static std::once_flag once;
  static int32_t sms = 1;
  std::call_once(once, [] {
    int device = 0, n = 0;
    METRONOME_CUDA(cudaGetDevice(&device));
    METRONOME_CUDA(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    sms = std::max(n, 1);
  });
  return sms;
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

template <int NT>
int32_t slots_for(gemv_epilogue ep) {
  // Occupancy does not depend on the epilogue enough to matter for planning.
  (void)ep;
  return blocks_per_sm<NT, gemv_epilogue::store_f32>() * device_sms();
}

int32_t slots_of(gemv_epilogue ep, int32_t m) {
  switch (token_tiles(m)) {
    case 1: return slots_for<1>(ep);
    case 2: return slots_for<2>(ep);
    case 4: return slots_for<4>(ep);
    default: return slots_for<8>(ep);
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

template <int NT, gemv_epilogue Ep>
void launch_nt(const gemv_args& a, const plan_params& pp, float* partials, int32_t* counters,
               cudaStream_t stream) {
  (void)blocks_per_sm<NT, Ep>(); // sets the shared-memory attribute once
  launch_kernel("skinny_gemm_kernel", skinny_kernel<NT, Ep>, dim3(pp.groups * pp.splits),
                dim3(block_threads<NT>()), smem_bytes<NT>(), stream, a, pp, partials, counters,
                stream_hint_on(hint_skinny_weights));
}

template <gemv_epilogue Ep>
void launch_ep(const gemv_args& a, const plan_params& pp, float* partials, int32_t* counters,
               cudaStream_t stream) {
  switch (token_tiles(a.m)) {
    case 1: return launch_nt<1, Ep>(a, pp, partials, counters, stream);
    case 2: return launch_nt<2, Ep>(a, pp, partials, counters, stream);
    case 4: return launch_nt<4, Ep>(a, pp, partials, counters, stream);
    default: return launch_nt<8, Ep>(a, pp, partials, counters, stream);
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
    const plan_params pp = make_plan(epilogue, n, k, mm, slots_of(epilogue, mm));
    out.partial_bytes = std::max(out.partial_bytes, partial_bytes(pp, mm));
    out.counters = std::max(out.counters, pp.groups);
    if (m >= max_m)
      break;
  }
  return out;
}

void launch_skinny_gemm(gemv_epilogue epilogue, const gemv_args& a, const skinny_gemm_scratch& s,
                        cudaStream_t stream) {
  if (a.m < 1 || a.m > skinny_gemm_max_m)
    throw cuda_error("launch_skinny_gemm: m = " + std::to_string(a.m) + " is not in 1..64");
  if (!a.x || a.residual_in)
    throw cuda_error("launch_skinny_gemm: the input must be bf16 x (normalise it first)");
  if (epilogue == gemv_epilogue::qkv_rope && a.kv.k8 && !a.kv.stage)
    throw cuda_error("launch_skinny_gemm: qkv_rope with the fp8 cache needs kv.stage");
  if (!skinny_gemm_supports(epilogue, a.n, a.k, a.kv.head_dim))
    throw cuda_error("launch_skinny_gemm: unsupported shape n = " + std::to_string(a.n)
                     + ", k = " + std::to_string(a.k));
  // Bulk copies and cp.async move 16-byte pieces: both bases must allow it.
  if (!a.w || (reinterpret_cast<uintptr_t>(a.w) | reinterpret_cast<uintptr_t>(a.x)) % 16 != 0)
    throw cuda_error("launch_skinny_gemm: weights and input must be 16-byte aligned");
  plan_params pp = make_plan(epilogue, a.n, a.k, a.m, slots_of(epilogue, a.m));
  if (pp.splits > 1
      && (partial_bytes(pp, a.m) > s.partial_bytes || pp.groups > s.counters || !s.partials
          || !s.counter_data)) {
    pp.splits = 1; // always correct, possibly slower
    pp.kslice = (a.k + chunk_k - 1) / chunk_k * chunk_k;
  }
  switch (epilogue) {
    case gemv_epilogue::store_f32:
      return launch_ep<gemv_epilogue::store_f32>(a, pp, s.partials, s.counter_data, stream);
    case gemv_epilogue::residual_add:
      return launch_ep<gemv_epilogue::residual_add>(a, pp, s.partials, s.counter_data, stream);
    case gemv_epilogue::swiglu:
      return launch_ep<gemv_epilogue::swiglu>(a, pp, s.partials, s.counter_data, stream);
    case gemv_epilogue::qkv_rope:
      return launch_ep<gemv_epilogue::qkv_rope>(a, pp, s.partials, s.counter_data, stream);
  }
}

int32_t skinny_gemm_splits(gemv_epilogue epilogue, int32_t n, int32_t k, int32_t m) {
  return make_plan(epilogue, n, k, m, slots_of(epilogue, m)).splits;
}

} // namespace metronome::gpu
