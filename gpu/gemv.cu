// Matrix-vector products for decode steps of up to eight sequences, with the
// neighbouring elementwise work fused in.
//
// Design note. At batch 1 to 4 a decode step is bound by reading the weights
// once, so the GEMV streams each weight row exactly once with 16-byte loads
// and keeps the few input vectors in shared memory, staged once per block as
// bf16. Each output PAIR of rows belongs to one group of warps, which lets the
// epilogue combine them: RoPE rotates the pair (i, i + d/2) of one head,
// SwiGLU multiplies silu(gate_j) by up_j. The prologue can compute RMSNorm of
// the fp32 residual on the fly (each block recomputes the row's inverse RMS
// from L2, cheaper than a separate launch), and the epilogue can add into the
// residual, so a decoder layer needs four GEMVs and the attention kernel, with
// no other launches.
//
// What the first generation (gemv_v1.cu) left on the table was a fixed cost of
// 8 to 10 us per launch, which the small projections (qkv, o: 3 to 12 us of
// bytes) paid in full: each warp waited for the prologue (inverse RMS, two
// block barriers, staging) before its first weight load, then walked a whole
// row pair in four dependent round trips. Here each warp issues the loads of
// its first weight batch before anything else (weights are never written, so
// this is also legal before the programmatic-launch wait; so are the
// epilogue's inputs, below), and the staging runs while those bytes are in
// flight. Rows are cut along k into KS slices
// (KS = 1, 2, 4 or 8 warps per pair, 8 / KS pairs per block of 8 warps,
// chosen on the host so that one wave of resident blocks covers the matrix
// when it can): shorter slices mean fewer dependent round trips per warp and
// more warps streaming at once. The epilogue's own reads (the residual it adds
// to; for qkv the position, RoPE frequency and the cache page of a k or v row,
// three dependent loads) are requested with the tile's first weight batch, not
// after its sums: at the end they held up every block's last store, and with
// them moved the 8B batch-1 step took 2.5% less time on the H200, the 1B
// one 3.9% less. The inputs are staged with each
// thread's loads issued together (stage_x), and one sequence's residual is
// normalised from registers in one round trip (stage_residual): the staging
// loop used to take one dependent round trip per 16 bytes a thread, up to
// seven for the 8B down projection; with both, the 8B and 1B batch-1 steps
// take 2.3% less time. The KS partial sums of a pair meet in shared memory
// (double-buffered by tile parity, one barrier per tile) in a fixed order,
// so results do not depend on timing. Inputs too large for shared memory
// (M x k x 2 bytes over 96 KiB) take the first generation's chunked path.
//
// The weight loads carry the L2 evict-first hint. A step streams 2.5 to 16 GB
// of weights through a 60 MB L2; at normal priority they push out what the
// next kernel reads first (the residual for its RMSNorm, the attention output,
// the activations), and each of those dependent reads then goes to DRAM. With
// the hint the 8B batch-1 step took 6% less time and the 1B one 6% less
// (H200).

#include <algorithm>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/gemv_common.cuh"
#include "gpu/kernel_util.cuh"
#include "gpu/kernels.hpp"
#include "gpu/kernels_v1.hpp"
#include "gpu/launch.cuh"

namespace metronome::gpu {

using namespace dev;
using namespace gemv_detail;

namespace {

constexpr int32_t smem_limit = 96 * 1024;

/// Residual rows up to this long are normalised from registers
/// (stage_residual): two groups of eight per thread.
constexpr int32_t resident_k = 2 * 8 * threads_per_block;

/// xs [k] = bf16(RMSNorm(residual[0]) * norm weight) for one sequence and
/// k <= resident_k: each thread loads its (at most two) groups of eight once
/// and keeps them for both the sum of squares and the staging, so the row
/// costs one memory round trip where residual_inv_rms and stage_x take two.
/// Ends before the caller's barrier.
__device__ __forceinline__ void stage_residual(const gemv_args& a, bf16* xs, float* scratch) {
  constexpr int C = resident_k / (8 * threads_per_block);
  float4 lo[C], hi[C];
  bf16x8 wv[C];
  float ss = 0.0f;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int32_t k = (int32_t(threadIdx.x) + c * threads_per_block) * 8;
    lo[c] = hi[c] = make_float4(0, 0, 0, 0);
    if (k < a.k) {
      lo[c] = *reinterpret_cast<const float4*>(a.residual_in + k);
      hi[c] = *reinterpret_cast<const float4*>(a.residual_in + k + 4);
      wv[c] = load_ro(a.norm_weight + k);
    }
  }
#pragma unroll
  for (int c = 0; c < C; ++c)
    ss += lo[c].x * lo[c].x + lo[c].y * lo[c].y + lo[c].z * lo[c].z + lo[c].w * lo[c].w
          + hi[c].x * hi[c].x + hi[c].y * hi[c].y + hi[c].z * hi[c].z + hi[c].w * hi[c].w;
  ss = block_sum(ss, scratch);
  const float inv = rsqrtf(ss / float(a.k) + a.eps);
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int32_t k = (int32_t(threadIdx.x) + c * threads_per_block) * 8;
    if (k < a.k)
      store16(xs + k, normalise8(lo[c], hi[c], wv[c], inv));
  }
}

template <int M, gemv_epilogue Ep, int KS>
__global__ void __launch_bounds__(threads_per_block, M <= 2 ? 3 : 2)
  gemv_split_kernel(const gemv_args a, int32_t kslice, int32_t tiles, bool evict_first,
                    bool late_trigger) {
  constexpr int RP = warps_per_block / KS; // row pairs per tile
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* xs = reinterpret_cast<bf16*>(smem_raw); // [M][k]
  __shared__ float inv_rms[M];
  __shared__ float scratch[32];
  __shared__ float red[2][warps_per_block][M][2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lp = warp / KS, ks = warp % KS;
  const int32_t pairs = num_pairs<Ep>(a);
  const int32_t k0 = ks * kslice, k1 = min(a.k, k0 + kslice);

  // The first weight batch of this warp's first tile, before anything else.
  int32_t tile = blockIdx.x;
  int32_t p = 0;
  bool active = false;
  pair_rows rows{0, 0, false};
  const bf16* w0 = a.w;
  const bf16* w1 = a.w;
  // What the lane that runs the tile's epilogue for batch row `lane` reads
  // besides its sums, requested with the tile's setup (gemv_common.cuh).
  epilogue_inputs ein;
  auto setup = [&](int32_t tl) {
    p = tl * RP + lp;
    active = tl < tiles && p < pairs;
    rows = active ? rows_of<Ep>(a, p) : pair_rows{0, 0, false};
    w0 = a.w + int64_t(rows.r0) * a.k;
    w1 = a.w + int64_t(rows.has_r1 ? rows.r1 : rows.r0) * a.k;
  };
  // After the tile's first weight batch is out: a k or v row's page is three
  // dependent loads, which hold the warp (before pdl_wait() they overlap the
  // kernel before).
  auto prepare = [&] {
    if (active && ks == 0 && lane < M && lane < a.m)
      ein = load_epilogue_inputs<Ep>(a, p, rows, lane);
  };
  const uint64_t policy = l2_policy(evict_first);
  bf16x8 wa[unroll], wb[unroll];
  auto load_batch = [&](int32_t kk) {
#pragma unroll
    for (int u = 0; u < unroll; ++u) {
      const int32_t k = kk + u * 256;
      if (active && k < k1) {
        // Volatile loads (load_stream): the first batch stays ahead of the
        // prologue's barriers.
        wa[u] = load_stream(w0 + k, policy);
        wb[u] = load_stream(w1 + k, policy);
      }
    }
  };
  setup(tile);
  load_batch(k0 + lane * 8);
  prepare();

  pdl_wait();
  if (!late_trigger)
    pdl_trigger();

  // Inputs, while the weights are in flight.
  if (M == 1 && a.residual_in && a.k <= resident_k) {
    stage_residual(a, xs, scratch);
  } else {
    if (a.residual_in)
      residual_inv_rms<M>(a, inv_rms, scratch);
    stage_x<M>(a, inv_rms, 0, a.k, xs);
  }
  __syncthreads();

  for (int parity = 0; tile < tiles; tile += gridDim.x, parity ^= 1) {
    float acc0[M], acc1[M];
#pragma unroll
    for (int m = 0; m < M; ++m)
      acc0[m] = acc1[m] = 0.0f;
    bool loaded = true;
    for (int32_t kk = k0 + lane * 8; kk < k1; kk += 256 * unroll) {
      if (!loaded)
        load_batch(kk);
      loaded = false;
#pragma unroll
      for (int u = 0; u < unroll; ++u) {
        const int32_t k = kk + u * 256;
        if (active && k < k1)
          fma_pair<M>(wa[u], wb[u], xs, a.k, k, acc0, acc1);
      }
    }
    const pair_rows done = rows;
    const int32_t done_p = p;
    const bool done_active = active;
    const epilogue_inputs done_in = ein;
    // The next tile's first batch goes out before this tile's reduction.
    if (tile + int32_t(gridDim.x) < tiles) {
      setup(tile + gridDim.x);
      load_batch(k0 + lane * 8);
      prepare();
    }
    finish_tile<M, Ep, KS>(a, acc0, acc1, red, parity, warp, lane, ks, done_active, done_p, done,
                           done_in);
  }
  // Late triggers (kernels.hpp): the residual-adding GEMV after this one
  // becomes resident as this grid drains, not while it streams.
  if (late_trigger)
    pdl_trigger();
}

// -- launch ----------------------------------------------------------------------------

template <int M, gemv_epilogue Ep, int KS>
void launch_ks(const gemv_args& a, size_t smem, int32_t tiles, int32_t kslice,
               const gemv_launch_info& info, cudaStream_t stream) {
  const int32_t grid = std::max(1, std::min(tiles, info.blocks_per_sm * info.num_sms));
  launch_kernel("gemv_split_kernel", gemv_split_kernel<M, Ep, KS>, dim3(grid),
                dim3(threads_per_block), smem, stream, a, kslice, tiles,
                stream_hint_on(hint_gemv_weights),
                Ep == gemv_epilogue::swiglu && late_triggers());
}

template <int M, gemv_epilogue Ep>
void launch(const gemv_args& a, cudaStream_t stream) {
  const size_t smem = size_t(M) * size_t(a.k) * 2;
  const gemv_launch_info info[4] = {
    gemv_occupancy(gemv_split_kernel<M, Ep, 1>, smem, smem_limit),
    gemv_occupancy(gemv_split_kernel<M, Ep, 2>, smem, smem_limit),
    gemv_occupancy(gemv_split_kernel<M, Ep, 4>, smem, smem_limit),
    gemv_occupancy(gemv_split_kernel<M, Ep, 8>, smem, smem_limit)};
  // Slices are whole multiples of 256 elements (one 16-byte load per lane).
  const auto [ks, tiles, kslice] = choose_gemv_split(num_pairs<Ep>(a), a.k, 256, info);
  switch (ks) {
    case 1: return launch_ks<M, Ep, 1>(a, smem, tiles, kslice, info[0], stream);
    case 2: return launch_ks<M, Ep, 2>(a, smem, tiles, kslice, info[1], stream);
    case 4: return launch_ks<M, Ep, 4>(a, smem, tiles, kslice, info[2], stream);
    default: return launch_ks<M, Ep, 8>(a, smem, tiles, kslice, info[3], stream);
  }
}

int32_t padded_m(int32_t m) {
  return m <= 2 ? m : m <= 4 ? 4 : 8;
}

} // namespace

void launch_gemv(gemv_epilogue epilogue, const gemv_args& a, cudaStream_t stream) {
  check_gemv_args(a);
  if (epilogue == gemv_epilogue::qkv_rope && a.kv.k8 && !a.kv.stage)
    throw cuda_error("launch_gemv: qkv_rope with the fp8 cache needs kv.stage (the decode "
                     "attention quantises the rows from there)");
  // The residual-adding projections (o, down) launch early only with late
  // triggers (kernels.hpp), in either generation: with PDL on every other
  // launch and off for these two, the 8B batch-1 step took 3% less time than
  // with PDL off everywhere, and with PDL on these too, 2% more (H200, this
  // generation); with
  // the kernels before them triggering late, the 1B step takes 3% less.
  // They still trigger their dependents, so the launch after them
  // (gate_up, the next qkv) overlaps.
  const pdl_scope no_early_launch(
    epilogue == gemv_epilogue::residual_add && !late_triggers() ? false : pdl_active());
  if (active_kernels().gemv == 1 || int64_t(padded_m(a.m)) * a.k * 2 > smem_limit)
    return launch_gemv_v1(epilogue, a, stream);
  dispatch_gemv(epilogue, a.m, [&]<int M, gemv_epilogue Ep>() { launch<M, Ep>(a, stream); });
}

} // namespace metronome::gpu
