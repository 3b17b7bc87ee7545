// Paged attention for decode, first generation (2026-11-30; CUDA cores, one
// block per sequence, kv head and context split). Kept for A/B measurement and
// as the path for head_dim 256 and GQA groups over 8; see decode_attention.cu
// for the tensor-core kernel launched by default.
//
// Design note. A block serves one (sequence, kv head, context split) and all
// the query heads that share that kv head (GQA), so each key and value is read
// once per block. Inside the block each warp streams its own batches of keys
// with no block-wide barrier: a key is spread over D/8 lanes (16 bytes each),
// the keys of the next batch are loaded while this batch is scored, and page
// ids are fetched two batches ahead, so a warp always has loads in flight.
// Each group of lanes keeps an online softmax (log2 domain: q is scaled by
// scale * log2 e) per head in registers, one rescale per batch; groups merge by
// shuffles and warps through shared memory at the end. The number of splits
// in use is derived on the device from each sequence's length (at least 128
// keys each), so one captured graph serves any context; with one split the
// block writes the output, otherwise the last split to finish (an atomic
// ticket) merges the partials with all its threads, with no second launch.

#include <algorithm>
#include <cfloat>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/kernel_util.cuh"
#include "gpu/kernels.hpp"
#include "gpu/kernels_v1.hpp"
#include "gpu/launch.cuh"
#include "gpu/split_merge.cuh"

namespace metronome::gpu {

using namespace dev;

namespace {

constexpr int threads = 128;
constexpr int warps = threads / 32;
/// A split covers at least this many keys (shorter contexts use fewer splits).
constexpr int32_t min_split_tokens = 128;
/// Most splits (partials buffer and merge are sized for it).
constexpr int32_t max_splits = 64;
constexpr float log2e = 1.4426950408889634f;

template <int D, int GM>
struct decode_config {
  static constexpr int lanes_per_token = D / 8;          // lanes holding one key (8 dims each)
  static constexpr int groups = 32 / lanes_per_token;    // keys a warp reads side by side
  static constexpr int per_lane = GM <= 4 ? 4 : 2;       // keys per lane per batch
  static constexpr int batch = groups * per_lane;        // keys per warp per batch
};

/// Online-softmax state of one lane for the GM heads it serves.
template <int GM>
struct softmax_state {
  float m[GM], l[GM], acc[GM][8];
};

/// Merges state `o` (weights relative to its own max) into `s`.
template <int GM>
__device__ __forceinline__ void merge_into(softmax_state<GM>& s, const float (&om)[GM],
                                           const float (&ol)[GM], const float (&oacc)[GM][8]) {
#pragma unroll
  for (int h = 0; h < GM; ++h) {
    const float mm = fmaxf(s.m[h], om[h]);
    if (mm == -INFINITY)
      continue;
    const float a = s.m[h] == -INFINITY ? 0.0f : exp2f(s.m[h] - mm);
    const float b = om[h] == -INFINITY ? 0.0f : exp2f(om[h] - mm);
    s.l[h] = s.l[h] * a + ol[h] * b;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      s.acc[h][e] = s.acc[h][e] * a + oacc[h][e] * b;
    s.m[h] = mm;
  }
}

template <int D, int GM>
__global__ void __launch_bounds__(threads)
  decode_attention_kernel(attention_shape sh, const bf16* __restrict__ q, kv_view kv,
                          batch_view batch, int32_t splits, float* __restrict__ part_o,
                          float* __restrict__ part_ml, int32_t* __restrict__ counters,
                          bf16* __restrict__ out) {
  using cfg = decode_config<D, GM>;
  constexpr int lpt = cfg::lanes_per_token, groups = cfg::groups, U = cfg::per_lane;
  constexpr int nb = cfg::batch;

  __shared__ float sm_m[warps][GM], sm_l[warps][GM];
  __shared__ float sm_acc[warps][GM][D];
  __shared__ float mg_w[GM][max_splits];
  __shared__ float mg_l[GM];
  __shared__ bool last;

  const int split = blockIdx.x, b = blockIdx.z;
  const int group = sh.num_heads / sh.kv_heads;
  const int blocks_per_kv = (group + GM - 1) / GM;
  const int kvh = blockIdx.y / blocks_per_kv;
  const int h0 = kvh * group + (blockIdx.y % blocks_per_kv) * GM;
  const int nh = min(GM, kvh * group + group - h0);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane / lpt, ds = lane % lpt;

  pdl_wait();
  pdl_trigger();
  const int32_t len = batch.seq_len[b];
  const int32_t qrow = batch.seq_q_start[b];
  const int32_t pos = len - 1;
  const int32_t lo = sh.window > 0 ? max(0, pos - sh.window + 1) : 0;
  const int32_t active =
    max(1, min(splits, (len - lo + min_split_tokens - 1) / min_split_tokens));
  if (split >= active)
    return;
  const int32_t chunk = (len - lo + active - 1) / active;
  const int32_t start = lo + split * chunk;
  const int32_t end = min(len, start + chunk);

  // This lane's slice of q for each head, scaled into the log2 domain.
  const float qscale = sh.scale * log2e;
  float qr[GM][8];
#pragma unroll
  for (int h = 0; h < GM; ++h) {
    if (h < nh) {
      unpack(load_global(q + (int64_t(qrow) * sh.num_heads + h0 + h) * D + ds * 8), qr[h]);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        qr[h][e] *= qscale;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        qr[h][e] = 0.0f;
    }
  }
  softmax_state<GM> st;
#pragma unroll
  for (int h = 0; h < GM; ++h) {
    st.m[h] = -INFINITY;
    st.l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      st.acc[h][e] = 0.0f;
  }

  // Each warp streams batches warp, warp + 4, ... of nb keys. Page ids run two
  // batches ahead of the keys, keys one batch ahead of the math.
  const int32_t* pt = kv.page_table + int64_t(batch.seq_slot[b]) * kv.page_table_stride;
  const int32_t ps = kv.page_size;
  const int32_t nbatches = (end - start + nb - 1) / nb;
  auto key_of = [&](int32_t bi, int u) { return start + bi * nb + u * groups + g; };
  auto load_pages = [&](int32_t bi, int32_t (&pg)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int32_t j = key_of(bi, u);
      pg[u] = (bi < nbatches && j < end) ? pt[j / ps] : -1;
    }
  };
  auto load_kv = [&](int32_t bi, const int32_t (&pg)[U], bf16x8 (&kr)[U], bf16x8 (&vr)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (pg[u] >= 0) {
        const int32_t j = key_of(bi, u);
        const int64_t off = ((int64_t(pg[u]) * kv.kv_heads + kvh) * ps + j % ps) * D + ds * 8;
        kr[u] = load_global(kv.k + off);
        vr[u] = load_global(kv.v + off);
      } else {
        kr[u] = vr[u] = bf16x8{{0, 0, 0, 0}};
      }
    }
  };

  int32_t pg_next[U], pg_after[U];
  bf16x8 kr[U], vr[U];
  int32_t bi = warp;
  {
    int32_t pg_now[U];
    load_pages(bi, pg_now);
    load_pages(bi + warps, pg_next);
    load_kv(bi, pg_now, kr, vr);
  }
  for (; bi < nbatches; bi += warps) {
    bf16x8 kn[U], vn[U];
    load_pages(bi + 2 * warps, pg_after);
    load_kv(bi + warps, pg_next, kn, vn);

    float sc[GM][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[8];
      unpack(kr[u], kf);
      const bool valid = key_of(bi, u) < end;
#pragma unroll
      for (int h = 0; h < GM; ++h) {
        float x = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e)
          x = fmaf(qr[h][e], kf[e], x);
#pragma unroll
        for (int o = lpt / 2; o > 0; o >>= 1)
          x += __shfl_xor_sync(0xffffffffu, x, o);
        sc[h][u] = valid ? x : -INFINITY;
      }
    }
    float vf[U][8];
#pragma unroll
    for (int u = 0; u < U; ++u)
      unpack(vr[u], vf[u]);
#pragma unroll
    for (int h = 0; h < GM; ++h) {
      float mx = sc[h][0];
#pragma unroll
      for (int u = 1; u < U; ++u)
        mx = fmaxf(mx, sc[h][u]);
      const float m_new = fmaxf(st.m[h], mx);
      if (m_new == -INFINITY)
        continue;
      const float alpha = st.m[h] == -INFINITY ? 0.0f : exp2f(st.m[h] - m_new);
      st.l[h] *= alpha;
#pragma unroll
      for (int e = 0; e < 8; ++e)
        st.acc[h][e] *= alpha;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const float p = exp2f(sc[h][u] - m_new); // 0 for -inf
        st.l[h] += p;
#pragma unroll
        for (int e = 0; e < 8; ++e)
          st.acc[h][e] = fmaf(p, vf[u][e], st.acc[h][e]);
      }
      st.m[h] = m_new;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      kr[u] = kn[u];
      vr[u] = vn[u];
      pg_next[u] = pg_after[u];
    }
  }

  // Merge the key groups of the warp (lanes with the same dims slice).
#pragma unroll
  for (int off = lpt; off < 32; off <<= 1) {
    float om[GM], ol[GM], oacc[GM][8];
#pragma unroll
    for (int h = 0; h < GM; ++h) {
      om[h] = __shfl_xor_sync(0xffffffffu, st.m[h], off);
      ol[h] = __shfl_xor_sync(0xffffffffu, st.l[h], off);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        oacc[h][e] = __shfl_xor_sync(0xffffffffu, st.acc[h][e], off);
    }
    merge_into<GM>(st, om, ol, oacc);
  }
  if (lane < lpt) {
#pragma unroll
    for (int h = 0; h < GM; ++h) {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        sm_acc[warp][h][ds * 8 + e] = st.acc[h][e];
      if (lane == 0) {
        sm_m[warp][h] = st.m[h];
        sm_l[warp][h] = st.l[h];
      }
    }
  }
  __syncthreads();

  // Merge the warps; write the output (one split) or this split's partial.
  merge_warps<false, threads>(sm_m, sm_l, sm_acc, nh, tid, out, part_o, part_ml, sh.num_heads,
                              qrow, b, h0, splits, split, active);
  if (active == 1)
    return;

  // The last split to finish merges all of them (split_merge.cuh) and
  // resets the counter for the next step or graph replay.
  int32_t* counter = counters + int64_t(b) * gridDim.y + blockIdx.y;
  if (!arrive_last(counter, active, tid, last))
    return;
  // Per head: the weight of each split (warp h handles heads h, h + 4, ...).
  split_weights<false, max_splits>(part_ml, int64_t(b) * sh.num_heads + h0, splits, active, nh,
                                   warp, warps, lane, mg_w, mg_l);
  __syncthreads();
  for (int i = tid; i < nh * (D / 4); i += threads) {
    const int h = i / (D / 4), d4 = (i % (D / 4)) * 4;
    const int64_t base = (int64_t(b) * sh.num_heads + h0 + h) * splits;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
    for (int s2 = 0; s2 < active; ++s2)
      fma4(mg_w[h][s2], __ldcg(reinterpret_cast<const float4*>(part_o + (base + s2) * D + d4)),
           o);
    store_merged(out + (int64_t(qrow) * sh.num_heads + h0 + h) * D + d4, o, mg_l[h]);
  }
  if (tid == 0)
    *counter = 0;
}

template <int D, int GM>
void launch_decode(const attention_shape& sh, const bf16* q, const kv_view& kv,
                   const batch_view& batch, int32_t splits, float* part_o, float* part_ml,
                   int32_t* counters, bf16* out, cudaStream_t stream) {
  const int group = sh.num_heads / sh.kv_heads;
  const dim3 grid(unsigned(splits), unsigned(sh.kv_heads * ((group + GM - 1) / GM)),
                  unsigned(batch.num_seqs));
  launch_kernel("decode_attention_kernel", decode_attention_kernel<D, GM>, grid, dim3(threads), 0,
                stream, sh, q, kv, batch, splits, part_o, part_ml, counters, out);
}

template <int D>
void launch_decode_d(const attention_shape& sh, const bf16* q, const kv_view& kv,
                     const batch_view& batch, int32_t splits, float* part_o, float* part_ml,
                     int32_t* counters, bf16* out, cudaStream_t stream) {
  const int group = sh.num_heads / sh.kv_heads;
  if (group <= 1)
    launch_decode<D, 1>(sh, q, kv, batch, splits, part_o, part_ml, counters, out, stream);
  else if (group <= 2)
    launch_decode<D, 2>(sh, q, kv, batch, splits, part_o, part_ml, counters, out, stream);
  else if (group <= 4)
    launch_decode<D, 4>(sh, q, kv, batch, splits, part_o, part_ml, counters, out, stream);
  else
    launch_decode<D, 8>(sh, q, kv, batch, splits, part_o, part_ml, counters, out, stream);
}

} // namespace

int32_t decode_attention_splits_v1(const attention_shape& sh, int32_t num_seqs, int32_t num_sms) {
  const int32_t group = sh.num_heads / sh.kv_heads;
  const int32_t gm = group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8;
  const int32_t blocks = num_seqs * sh.kv_heads * ((group + gm - 1) / gm);
  // Aim at about two blocks per SM at long contexts (shorter ones use fewer
  // splits on the device); never more than max_splits.
  int32_t splits = (2 * num_sms + blocks - 1) / std::max(blocks, 1);
  return std::max(1, std::min(splits, max_splits));
}

void launch_decode_attention_v1(const attention_shape& sh, const bf16* q, const kv_view& kv,
                             const batch_view& batch, int32_t splits, float* part_o,
                             float* part_ml, int32_t* counters, bf16* out, cudaStream_t stream) {
  if (batch.num_seqs <= 0)
    return;
  if (sh.num_heads % sh.kv_heads != 0 || sh.head_dim != kv.head_dim)
    throw cuda_error("launch_decode_attention: inconsistent head counts or head_dim");
  if (splits < 1 || splits > max_splits)
    throw cuda_error("launch_decode_attention: splits must lie in 1.." + std::to_string(max_splits));
  if (splits > 1 && (!part_o || !part_ml || !counters))
    throw cuda_error("launch_decode_attention: splits > 1 needs partial buffers and counters");
  switch (sh.head_dim) {
    case 16:
      return launch_decode_d<16>(sh, q, kv, batch, splits, part_o, part_ml, counters, out, stream);
    case 32: return launch_decode_d<32>(sh, q, kv, batch, splits, part_o, part_ml, counters, out, stream);
    case 64: return launch_decode_d<64>(sh, q, kv, batch, splits, part_o, part_ml, counters, out, stream);
    case 128: return launch_decode_d<128>(sh, q, kv, batch, splits, part_o, part_ml, counters, out, stream);
    case 256: return launch_decode_d<256>(sh, q, kv, batch, splits, part_o, part_ml, counters, out, stream);
    default:
      throw cuda_error("launch_decode_attention: head_dim " + std::to_string(sh.head_dim)
                       + " is not supported (16, 32, 64, 128, 256)");
  }
}

} // namespace metronome::gpu
