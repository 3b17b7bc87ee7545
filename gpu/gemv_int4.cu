// The decode GEMV on 4-bit weights (W4A16), and their dequantization to bf16
// for the paths that multiply bf16 matrices.
//
// Design note. A batch-1 step on 4-bit weights reads a quarter of the bytes,
// so the multiply-adds, not the memory, become the limit unless each weight
// costs about three instructions. Each lane streams 16 bytes (32 weights of
// one group) per row, and turns a nibble into a float with one shift and one
// logical op: placed in bits 16..19 under the exponent of 128, the word reads
// as the float 128 + q, exactly. The lane's 32 products then use 128 + q, and
// the group's sum is corrected once: scale * (sum (128 + q) x - (128 + zero)
// sum x), where sum x over each 32-input run is computed once per block when
// the inputs are staged. The correction cancels at most 8 bits of fp32's 24,
// far below the bf16 rounding of the inputs, so the sums agree with a GEMV on
// the exactly dequantized weights to about 1e-6 relative.
//
// The rest is the bf16 GEMV's (gemv.cu): warps in pairs of output rows so
// the fused epilogues (RoPE, SwiGLU, residual add) see both rows, k cut into
// KS slices so that one wave of blocks covers the matrix, the first weight
// batch and the epilogue's inputs requested before the programmatic-launch
// wait, the evict-first hint on the weight stream. The inputs are staged as
// bf16, normalised on the fly from the residual as there, and read through
// the act-order permutation where the checkpoint has one.
//
// Groups of 128 inputs and more run the tensor-core generation instead
// (gemv_int4_tc.cu); this fp32 kernel is generation 1 for them
// (kernel_generations::gemv_int4) and the only one for groups of 32 and 64.

#include <algorithm>
#include <string>

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

/// Inputs a lane's 16-byte load covers, and a warp's.
constexpr int32_t lane_cols = 32;
constexpr int32_t warp_cols = 32 * lane_cols;
constexpr int int4_unroll = 4;

size_t smem_bytes(int32_t m, int32_t k) {
  return size_t(m) * size_t(k) * 2 + size_t(m) * size_t(k / lane_cols) * 4;
}

/// The float 128 + (nibble e of w), exactly: the nibble moved to bits 16..19
/// under 128's exponent.
template <int E>
__device__ __forceinline__ float biased_nibble(uint32_t w) {
  uint32_t v;
  if constexpr (E < 4)
    v = w << (16 - 4 * E);
  else if constexpr (E == 4)
    v = w;
  else
    v = w >> (4 * E - 16);
  return __uint_as_float((v & 0x000F0000u) | 0x43000000u);
}

/// sum_e (128 + q_e) x_e over one word's eight nibbles and the eight inputs
/// at xs (16 bytes of bf16), added to acc.
__device__ __forceinline__ float dot_word(uint32_t w, const bf16* xs, float acc) {
  const uint4 xv = *reinterpret_cast<const uint4*>(xs);
  acc = fmaf(biased_nibble<0>(w), bf16_lo(xv.x), acc);
  acc = fmaf(biased_nibble<1>(w), bf16_hi(xv.x), acc);
  acc = fmaf(biased_nibble<2>(w), bf16_lo(xv.y), acc);
  acc = fmaf(biased_nibble<3>(w), bf16_hi(xv.y), acc);
  acc = fmaf(biased_nibble<4>(w), bf16_lo(xv.z), acc);
  acc = fmaf(biased_nibble<5>(w), bf16_hi(xv.z), acc);
  acc = fmaf(biased_nibble<6>(w), bf16_lo(xv.w), acc);
  acc = fmaf(biased_nibble<7>(w), bf16_hi(xv.w), acc);
  return acc;
}

/// scale * (dot - (128 + zero) * run_sum) for a scale-zero word.
__device__ __forceinline__ float correct(uint32_t sz, float dot, float run_sum) {
  const float scale = __half2float(__ushort_as_half(uint16_t(sz & 0xFFFFu)));
  const float offset = 128.0f + float((sz >> 16) & 0xFFu);
  return scale * fmaf(-offset, run_sum, dot);
}

/// Stages the inputs as stage_x does, each stored column j read from input
/// perm[j] (act-order). Scalar: act-order checkpoints only.
template <int M>
__device__ void stage_x_permuted(const gemv_args& a, const int32_t* perm, const float* inv_rms,
                                 bf16* xs) {
  const int32_t total = M * a.k;
  for (int32_t v = threadIdx.x; v < total; v += blockDim.x) {
    const int32_t m = v / a.k, j = v % a.k;
    const int32_t i = perm[j];
    float x = 0.0f;
    if (m < a.m) {
      if (a.residual_in)
        x = to_float(a.norm_weight[i]) * (a.residual_in[int64_t(m) * a.k + i] * inv_rms[m]);
      else
        x = to_float(a.x[int64_t(m) * a.k + i]);
    }
    xs[v] = __float2bfloat16_rn(x);
  }
}

template <int M, gemv_epilogue Ep, int KS>
__global__ void __launch_bounds__(threads_per_block, M <= 2 ? 2 : 1)
  gemv_int4_kernel(const gemv_args a, const int4_weights w, int32_t kslice, int32_t tiles,
                   bool evict_first, bool late_trigger) {
  constexpr int RP = warps_per_block / KS; // row pairs per tile
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* xs = reinterpret_cast<bf16*>(smem_raw); // [M][k]
  float* run_sums = reinterpret_cast<float*>(smem_raw + size_t(M) * a.k * 2); // [M][k / 32]
  __shared__ float inv_rms[M];
  __shared__ float scratch[32];
  __shared__ float red[2][warps_per_block][M][2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lp = warp / KS, ks = warp % KS;
  const int32_t pairs = num_pairs<Ep>(a);
  const int32_t k0 = ks * kslice, k1 = min(a.k, k0 + kslice);
  const int32_t row_words = a.k / 8, runs = a.k / lane_cols;

  int32_t tile = blockIdx.x;
  int32_t p = 0;
  bool active = false;
  pair_rows rows{0, 0, false};
  const uint32_t* q0 = w.q;
  const uint32_t* q1 = w.q;
  const uint32_t* sz0 = w.sz;
  const uint32_t* sz1 = w.sz;
  epilogue_inputs ein;
  auto setup = [&](int32_t tl) {
    p = tl * RP + lp;
    active = tl < tiles && p < pairs;
    rows = active ? rows_of<Ep>(a, p) : pair_rows{0, 0, false};
    const int32_t r1 = rows.has_r1 ? rows.r1 : rows.r0;
    q0 = w.q + int64_t(rows.r0) * row_words;
    q1 = w.q + int64_t(r1) * row_words;
    sz0 = w.sz + int64_t(rows.r0) * w.groups;
    sz1 = w.sz + int64_t(r1) * w.groups;
  };
  auto prepare = [&] {
    if (active && ks == 0 && lane < M && lane < a.m)
      ein = load_epilogue_inputs<Ep>(a, p, rows, lane);
  };
  const uint64_t policy = l2_policy(evict_first);
  bf16x8 wa[int4_unroll], wb[int4_unroll];
  uint32_t sa[int4_unroll], sb[int4_unroll];
  auto load_batch = [&](int32_t kk) {
#pragma unroll
    for (int u = 0; u < int4_unroll; ++u) {
      const int32_t k = kk + u * warp_cols;
      if (active && k < k1) {
        wa[u] = load_stream(q0 + k / 8, policy);
        wb[u] = load_stream(q1 + k / 8, policy);
        sa[u] = __ldg(sz0 + k / w.group_size);
        sb[u] = __ldg(sz1 + k / w.group_size);
      }
    }
  };
  setup(tile);
  load_batch(k0 + lane * lane_cols);
  prepare();

  pdl_wait();
  if (!late_trigger)
    pdl_trigger();

  // Inputs and their run sums, while the weights are in flight.
  if (a.residual_in)
    residual_inv_rms<M>(a, inv_rms, scratch);
  if (w.perm)
    stage_x_permuted<M>(a, w.perm, inv_rms, xs);
  else
    stage_x<M>(a, inv_rms, 0, a.k, xs);
  __syncthreads();
  for (int32_t r = threadIdx.x; r < M * runs; r += blockDim.x) {
    const bf16* x = xs + (r / runs) * a.k + (r % runs) * lane_cols;
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < lane_cols; c += 8) {
      float f[8];
      unpack(*reinterpret_cast<const bf16x8*>(x + c), f);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        s += f[e];
    }
    run_sums[r] = s;
  }
  __syncthreads();

  for (int parity = 0; tile < tiles; tile += gridDim.x, parity ^= 1) {
    float acc0[M], acc1[M];
#pragma unroll
    for (int m = 0; m < M; ++m)
      acc0[m] = acc1[m] = 0.0f;
    bool loaded = true;
    for (int32_t kk = k0 + lane * lane_cols; kk < k1; kk += warp_cols * int4_unroll) {
      if (!loaded)
        load_batch(kk);
      loaded = false;
#pragma unroll
      for (int u = 0; u < int4_unroll; ++u) {
        const int32_t k = kk + u * warp_cols;
        if (active && k < k1) {
#pragma unroll
          for (int m = 0; m < M; ++m) {
            const bf16* x = xs + m * a.k + k;
            float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              d0 = dot_word(wa[u].w[i], x + 8 * i, d0);
              d1 = dot_word(wb[u].w[i], x + 8 * i, d1);
            }
            const float rs = run_sums[m * runs + k / lane_cols];
            acc0[m] += correct(sa[u], d0, rs);
            acc1[m] += correct(sb[u], d1, rs);
          }
        }
      }
    }
    const pair_rows done = rows;
    const int32_t done_p = p;
    const bool done_active = active;
    const epilogue_inputs done_in = ein;
    if (tile + int32_t(gridDim.x) < tiles) {
      setup(tile + gridDim.x);
      load_batch(k0 + lane * lane_cols);
      prepare();
    }
    finish_tile<M, Ep, KS>(a, acc0, acc1, red, parity, warp, lane, ks, done_active, done_p, done,
                           done_in);
  }
  if (late_trigger)
    pdl_trigger();
}

__global__ void dequantize_int4_kernel(const int4_weights w, int32_t n, int32_t k, bf16* out) {
  // The previous projection may still read `out`.
  pdl_wait();
  const int32_t row_words = k / 8;
  const int64_t total = int64_t(n) * row_words;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t r = int32_t(i / row_words), j = int32_t(i % row_words);
    const uint32_t q = w.q[i];
    const uint32_t sz = w.sz[int64_t(r) * w.groups + (8 * j) / w.group_size];
    const float scale = __half2float(__ushort_as_half(uint16_t(sz & 0xFFFFu)));
    const int32_t zero = int32_t((sz >> 16) & 0xFFu);
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e)
      v[e] = scale * float(int32_t((q >> (4 * e)) & 0xFu) - zero);
    bf16* row = out + int64_t(r) * k;
    if (w.perm) {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        row[w.perm[8 * j + e]] = __float2bfloat16_rn(v[e]);
    } else {
      bf16x8 o;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        o.w[e] = pack_bf16x2(v[2 * e], v[2 * e + 1]);
      store16(row + 8 * j, o);
    }
  }
  // A late trigger, after this thread's writes are visible: the kernel
  // after it reads `out` as its weights, which GEMMs may load before their
  // own wait (the skinny GEMM's bulk copies; gemv_common.cuh).
  __threadfence();
  pdl_trigger();
}

// -- launch ----------------------------------------------------------------------------

template <int M, gemv_epilogue Ep, int KS>
void launch_ks(const gemv_args& a, const int4_weights& w, size_t smem, int32_t tiles,
               int32_t kslice, const gemv_launch_info& info, cudaStream_t stream) {
  const int32_t grid = std::max(1, std::min(tiles, info.blocks_per_sm * info.num_sms));
  launch_kernel("gemv_int4_kernel", gemv_int4_kernel<M, Ep, KS>, dim3(grid),
                dim3(threads_per_block), smem, stream, a, w, kslice, tiles,
                stream_hint_on(hint_gemv_weights),
                Ep == gemv_epilogue::swiglu && late_triggers());
}

template <int M, gemv_epilogue Ep>
void launch(const gemv_args& a, const int4_weights& w, cudaStream_t stream) {
  const size_t smem = smem_bytes(M, a.k);
  const gemv_launch_info info[4] = {
    gemv_occupancy(gemv_int4_kernel<M, Ep, 1>, smem, int4_smem_limit),
    gemv_occupancy(gemv_int4_kernel<M, Ep, 2>, smem, int4_smem_limit),
    gemv_occupancy(gemv_int4_kernel<M, Ep, 4>, smem, int4_smem_limit),
    gemv_occupancy(gemv_int4_kernel<M, Ep, 8>, smem, int4_smem_limit)};
  // As gemv.cu, with one 16-byte load a lane covering 32 inputs.
  const auto [ks, tiles, kslice] = choose_gemv_split(num_pairs<Ep>(a), a.k, warp_cols, info);
  switch (ks) {
    case 1: return launch_ks<M, Ep, 1>(a, w, smem, tiles, kslice, info[0], stream);
    case 2: return launch_ks<M, Ep, 2>(a, w, smem, tiles, kslice, info[1], stream);
    case 4: return launch_ks<M, Ep, 4>(a, w, smem, tiles, kslice, info[2], stream);
    default: return launch_ks<M, Ep, 8>(a, w, smem, tiles, kslice, info[3], stream);
  }
}

int32_t padded_m(int32_t m) {
  return m <= 2 ? m : m <= 4 ? 4 : 8;
}

bool fits(int32_t m, int32_t k) {
  return m >= 1 && m <= gemv_max_m && k % lane_cols == 0
         && smem_bytes(padded_m(m), k) <= size_t(int4_smem_limit);
}

} // namespace

bool gemv_int4_takes(gemv_epilogue epilogue, int32_t m, int32_t k) {
  return fits(m, k)
         || (epilogue != gemv_epilogue::qkv_rope && m > 4 && m <= gemv_max_m && fits(4, k));
}

void launch_gemv_int4(gemv_epilogue epilogue, const gemv_args& a, const int4_weights& w,
                      cudaStream_t stream) {
  check_gemv_args(a);
  if (!gemv_int4_takes(epilogue, a.m, a.k))
    throw cuda_error("launch_gemv_int4: m = " + std::to_string(a.m) + ", k = "
                     + std::to_string(a.k) + " does not fit (gemv_int4_takes)");
  if (w.group_size <= 0 || w.group_size % lane_cols != 0)
    throw cuda_error("launch_gemv_int4: group size " + std::to_string(w.group_size)
                     + " is not a multiple of 32");
  if (epilogue == gemv_epilogue::qkv_rope && a.kv.k8 && !a.kv.stage)
    throw cuda_error("launch_gemv_int4: qkv_rope with the fp8 cache needs kv.stage");
  // PDL as launch_gemv: the residual-adding projections launch early only
  // with late triggers.
  const pdl_scope no_early_launch(
    epilogue == gemv_epilogue::residual_add && !late_triggers() ? false : pdl_active());
  // One launch of up to 8 tokens, on tensor cores where the groups allow.
  const bool tensor_cores = gemv_int4_tensor_cores(w, a.k);
  auto run = [&](const gemv_args& part) {
    if (tensor_cores)
      launch_gemv_int4_tc(epilogue, part, w, stream);
    else
      dispatch_gemv(epilogue, part.m,
                    [&]<int M, gemv_epilogue Ep>() { launch<M, Ep>(part, w, stream); });
  };
  if (!fits(a.m, a.k)) {
    // Rows of 4 tokens at a time: each launch reads the weights again, which
    // at 5-8 tokens still costs less than dequantizing them for cuBLAS.
    for (int32_t m0 = 0; m0 < a.m; m0 += 4) {
      gemv_args part = a;
      part.m = std::min(4, a.m - m0);
      if (part.x)
        part.x += int64_t(m0) * a.k;
      if (part.residual_in)
        part.residual_in += int64_t(m0) * a.k;
      if (part.out_f32)
        part.out_f32 += int64_t(m0) * a.n;
      if (part.out_bf16)
        part.out_bf16 += int64_t(m0) * (a.n / 2); // swiglu: [m][n / 2]
      run(part);
    }
    return;
  }
  run(a);
}

void launch_dequantize_int4(const int4_weights& w, int32_t n, int32_t k, bf16* out,
                            cudaStream_t stream) {
  if (k % 8 != 0 || w.group_size <= 0 || w.group_size % 8 != 0)
    throw cuda_error("launch_dequantize_int4: k and the group size must be multiples of 8");
  const int64_t words = int64_t(n) * (k / 8);
  const int32_t threads = 256;
  const int32_t blocks = int32_t(std::min<int64_t>((words + threads - 1) / threads, 8192));
  launch_kernel("dequantize_int4_kernel", dequantize_int4_kernel, dim3(std::max(blocks, 1)),
                dim3(threads), 0, stream, w, n, k, out);
}

} // namespace metronome::gpu
