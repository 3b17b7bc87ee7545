// Sampling on the GPU with the semantics of model/sampling.cpp, so that only
// token ids and log-probabilities travel back to the host.
//
// Design note. Two kernels per step. stats_kernel splits each row of logits
// into 32 parts: it applies the temperature (in place, as the CPU does),
// finds each part's maximum and first argmax and the part's sum of
// exp(l - part max). select_kernel (one block per row) combines the parts:
// greedy rows are done (argmax, -log(sum)); unfiltered rows find the part
// whose running mass crosses u * sum, then the token inside it by a block
// scan, in index order as the CPU's inverse CDF. Rows with top-k, top-p or
// min-p never sort the vocabulary: the kept set is always a prefix of the
// order (logit descending, index ascending), so each boundary is found by a
// radix select over the 32-bit order key of the logit (four 8-bit passes of
// counts, or of probability mass for top-p and the final draw), with ties at
// the boundary resolved by index. Random numbers come from the sequence's
// counter-based stream (model/random.hpp), the same values as on the CPU.
//
// The model's log-probabilities (rows whose request asked for logprobs) come
// from model_logprobs_kernel, launched before the penalties: per asking row
// it keeps the logits as the model made them (a scratch row), their
// log-sum-exp, and the top n by the same radix select, then sorts those n
// (n <= 20) by (logit desc, index asc). select_kernel, having picked the
// token, reads its kept logit. A row that does not ask leaves at its first
// instruction, so every decode graph carries the kernel at the cost of one
// empty launch.

#include <algorithm>
#include <cfloat>

#include "gpu/cuda_check.hpp"
#include "gpu/kernel_util.cuh"
#include "gpu/kernels.hpp"
#include "gpu/launch.cuh"
#include "model/random.hpp"
#include "model/sampling.hpp"

namespace metronome::gpu {

using namespace dev;

namespace {

constexpr int parts = 32;
constexpr int stats_threads = 256;
constexpr int select_threads = 1024;
constexpr float greedy_below = 1e-5f;

struct part_stats {
  float max;
  int32_t argmax;
  double sum; // of exp(l - max) over the part
};

/// A 32-bit key that orders floats as they compare; -0.0 maps to +0.0's key
/// (they compare equal, so the CPU breaks their tie by index as for any other).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ int32_t part_size(int32_t vocab) {
  return ((vocab + parts - 1) / parts + 3) / 4 * 4;
}

// -- penalties -------------------------------------------------------------------------

__global__ void penalties_kernel(float* __restrict__ logits, int32_t vocab,
                                 const penalty_entry* __restrict__ entries,
                                 const int32_t* __restrict__ count, int32_t capacity,
                                 const float* __restrict__ repetition,
                                 const float* __restrict__ frequency,
                                 const float* __restrict__ presence) {
  pdl_wait();
  pdl_trigger();
  const int32_t n = min(*count, capacity);
  for (int32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const penalty_entry e = entries[i];
    if (e.token < 0 || e.token >= vocab)
      continue;
    float& l = logits[int64_t(e.row) * vocab + e.token];
    if (e.repetition) {
      const float r = repetition[e.row];
      l = l > 0 ? l / r : l * r;
    }
    if (e.output_count > 0)
      l -= frequency[e.row] * float(e.output_count) + presence[e.row];
  }
}

// -- per-part statistics ---------------------------------------------------------------

__global__ void __launch_bounds__(stats_threads)
  stats_kernel(float* __restrict__ logits, int32_t vocab, bool vec, sample_rows params,
               part_stats* __restrict__ stats) {
  pdl_wait();
  pdl_trigger();
  __shared__ float s_max[stats_threads / 32];
  __shared__ int32_t s_idx[stats_threads / 32];
  __shared__ double s_sum[stats_threads / 32];
  const int row = blockIdx.y, part = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* l = logits + int64_t(row) * vocab;
  const int32_t size = part_size(vocab);
  const int32_t lo = part * size, hi = min(vocab, lo + size);
  const float temp = params.temperature[row];
  const bool scale = !(temp < greedy_below);
  const float inv_t = scale ? 1.0f / temp : 1.0f;

  // Batches of `batch` elements a thread, all loads of a batch issued before
  // any is used (a part is 4,008 logits for a 128k vocabulary: one batch of
  // 16 per thread, one memory round trip rather than 16). Float4 loads when
  // vec: the parts are whole, aligned float4s (the vocabulary a multiple of
  // 4, the logits 16-byte aligned; launch_sample decides).
  constexpr int batch = 16;
  float best = -INFINITY;
  int32_t best_i = INT32_MAX;
  auto load_batch = [&](int32_t i0, float (&v)[batch]) {
    if (vec) {
#pragma unroll
      for (int u = 0; u < batch / 4; ++u) {
        const int32_t i = i0 + 4 * (u * stats_threads + threadIdx.x);
        const float4 x = i < hi ? *reinterpret_cast<const float4*>(l + i)
                                : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
        v[4 * u] = x.x;
        v[4 * u + 1] = x.y;
        v[4 * u + 2] = x.z;
        v[4 * u + 3] = x.w;
      }
    } else {
#pragma unroll
      for (int u = 0; u < batch; ++u) {
        const int32_t i = i0 + u * stats_threads + threadIdx.x;
        v[u] = i < hi ? l[i] : -INFINITY;
      }
    }
  };
  // Element e of a batch starting at i0 (the layout load_batch used).
  auto index_of = [&](int32_t i0, int e) {
    return vec ? i0 + 4 * ((e / 4) * stats_threads + threadIdx.x) + e % 4
               : i0 + e * stats_threads + threadIdx.x;
  };
  for (int32_t i0 = lo; i0 < hi; i0 += batch * stats_threads) {
    float v[batch];
    load_batch(i0, v);
#pragma unroll
    for (int e = 0; e < batch; ++e) {
      const int32_t i = index_of(i0, e);
      if (i >= hi)
        continue;
      if (scale) {
        v[e] *= inv_t;
        l[i] = v[e];
      }
      if (v[e] > best || (v[e] == best && i < best_i)) {
        best = v[e];
        best_i = i;
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ob > best || (ob == best && oi < best_i)) {
      best = ob;
      best_i = oi;
    }
  }
  if (lane == 0) {
    s_max[warp] = best;
    s_idx[warp] = best_i;
  }
  __syncthreads();
  best = s_max[0];
  best_i = s_idx[0];
  for (int w = 1; w < stats_threads / 32; ++w)
    if (s_max[w] > best || (s_max[w] == best && s_idx[w] < best_i)) {
      best = s_max[w];
      best_i = s_idx[w];
    }
  double sum = 0;
  if (best > -INFINITY) {
    // Each thread reads back the elements it scaled above (the same layout).
    for (int32_t i0 = lo; i0 < hi; i0 += batch * stats_threads) {
      float v[batch];
      load_batch(i0, v);
#pragma unroll
      for (int e = 0; e < batch; ++e)
        if (index_of(i0, e) < hi)
          sum += exp(double(v[e] - best));
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0)
    s_sum[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < stats_threads / 32; ++w)
      total += s_sum[w];
    stats[int64_t(row) * parts + part] = part_stats{best, best_i, total};
  }
}

// -- block primitives of select_kernel (1024 threads) ------------------------------------

struct select_shared {
  int32_t hist_count[256];
  double hist_mass[256];
  double scan_d[select_threads / 32];
  int32_t scan_i[select_threads / 32];
  int32_t digit;
  int32_t above_count;
  double above_mass;
  int32_t found;
  int32_t result_i;
  double result_d;
};

__device__ double block_sum_d(double v, select_shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0)
    sh.scan_d[warp] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < select_threads / 32; ++w)
    total += sh.scan_d[w];
  return total;
}

__device__ int32_t block_sum_i(int32_t v, select_shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0)
    sh.scan_i[warp] = v;
  __syncthreads();
  int32_t total = 0;
  for (int w = 0; w < select_threads / 32; ++w)
    total += sh.scan_i[w];
  return total;
}

/// Exclusive prefix sum over threads in thread order.
template <class T>
__device__ T block_exclusive_scan(T v, T* warp_totals) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o)
      inc += n;
  }
  __syncthreads();
  if (lane == 31)
    warp_totals[warp] = inc;
  __syncthreads();
  T before = 0;
  for (int w = 0; w < warp; ++w)
    before += warp_totals[w];
  return before + inc - v;
}

/// Index (in index order) of the need-th (1-based) element whose key equals `key`.
__device__ int32_t nth_tie(const float* v, int32_t vocab, uint32_t key, int32_t need,
                           select_shared& sh) {
  const int32_t per = (vocab + select_threads - 1) / select_threads;
  const int32_t lo = threadIdx.x * per, hi = min(vocab, lo + per);
  int32_t count = 0;
  for (int32_t i = lo; i < hi; ++i)
    count += order_key(v[i]) == key;
  const int32_t before = block_exclusive_scan<int32_t>(count, sh.scan_i);
  if (threadIdx.x == 0)
    sh.result_i = -1;
  __syncthreads();
  if (before < need && need <= before + count) {
    int32_t seen = before;
    for (int32_t i = lo; i < hi; ++i)
      if (order_key(v[i]) == key && ++seen == need) {
        sh.result_i = i;
        break;
      }
  }
  __syncthreads();
  return sh.result_i;
}

/// A boundary in the order (logit desc, index asc): all keys above `key`,
/// plus the ties at `key` up to index `cut`. `count` elements in all.
struct boundary {
  uint32_t key;
  int32_t cut;
  int32_t count;
};

__device__ __forceinline__ bool inside(const boundary& b, uint32_t key, int32_t i) {
  return key > b.key || (key == b.key && i <= b.cut);
}

/// Picks the digit of one radix pass: scanning bins from the top, the first
/// bin where the running count reaches `need` (by_mass: the running mass
/// reaches `target`, strictly past it if strict). Thread 0 decides.
__device__ void pick_digit(select_shared& sh, bool by_mass, int32_t need, double target,
                           bool strict) {
  if (threadIdx.x == 0) {
    int32_t c = 0;
    double m = 0;
    int d = 255;
    int last_nonempty = -1;
    for (; d >= 0; --d) {
      if (sh.hist_count[d] == 0)
        continue;
      last_nonempty = d;
      const bool hit = by_mass ? (strict ? m + sh.hist_mass[d] > target
                                         : m + sh.hist_mass[d] >= target)
                               : c + sh.hist_count[d] >= need;
      if (hit)
        break;
      c += sh.hist_count[d];
      m += sh.hist_mass[d];
    }
    if (d < 0) { // rounding: the target lies past the last element
      d = last_nonempty;
      c -= sh.hist_count[d];
      m -= sh.hist_mass[d];
    }
    sh.digit = d;
    sh.above_count = c;
    sh.above_mass = m;
  }
  __syncthreads();
}

/// The boundary holding the first `need` elements of the order.
__device__ boundary select_count(const float* v, int32_t vocab, int32_t need, select_shared& sh) {
  uint32_t prefix = 0, mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += select_threads)
      sh.hist_count[i] = 0;
    __syncthreads();
    for (int32_t i = threadIdx.x; i < vocab; i += select_threads) {
      const uint32_t k = order_key(v[i]);
      if ((k & mask) == prefix)
        atomicAdd(&sh.hist_count[(k >> shift) & 255], 1);
    }
    __syncthreads();
    pick_digit(sh, false, need, 0, false);
    need -= sh.above_count;
    prefix |= uint32_t(sh.digit) << shift;
    mask |= 255u << shift;
    __syncthreads();
  }
  const int32_t cut = nth_tie(v, vocab, prefix, need, sh);
  return boundary{prefix, cut, 0};
}

/// The shortest prefix of the order whose mass (of exp(l - m)) reaches
/// `target` (strict: exceeds it); returns its boundary, the last element's
/// index in `last` and the prefix length in count.
__device__ boundary select_mass(const float* v, int32_t vocab, float m, double target, bool strict,
                                select_shared& sh) {
  uint32_t prefix = 0, mask = 0;
  int32_t above = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += select_threads) {
      sh.hist_count[i] = 0;
      sh.hist_mass[i] = 0;
    }
    __syncthreads();
    for (int32_t i = threadIdx.x; i < vocab; i += select_threads) {
      const float x = v[i];
      const uint32_t k = order_key(x);
      if ((k & mask) == prefix) {
        const int d = (k >> shift) & 255;
        atomicAdd(&sh.hist_count[d], 1);
        atomicAdd(&sh.hist_mass[d], exp(double(x - m)));
      }
    }
    __syncthreads();
    pick_digit(sh, true, 0, target, strict);
    target -= sh.above_mass;
    above += sh.above_count;
    prefix |= uint32_t(sh.digit) << shift;
    mask |= 255u << shift;
    __syncthreads();
  }
  // Ties at the boundary share one probability: take as many as needed.
  const int32_t ties = sh.hist_count[prefix & 255];
  __syncthreads();
  const float x = prefix & 0x80000000u ? __uint_as_float(prefix & 0x7fffffffu)
                                       : __uint_as_float(~prefix);
  const double e = exp(double(x - m));
  int32_t j = strict ? int32_t(floor(target / e)) + 1 : int32_t(ceil(target / e));
  j = max(1, min(j, ties));
  const int32_t cut = nth_tie(v, vocab, prefix, j, sh);
  return boundary{prefix, cut, above + j};
}

// -- the model's log-probabilities ---------------------------------------------------------

constexpr int lp_stride = 1 + max_logprobs;

__device__ float block_max_f(float v, select_shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0)
    sh.scan_d[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < select_threads / 32; ++w)
    m = fmaxf(m, float(sh.scan_d[w]));
  return m;
}

__global__ void __launch_bounds__(select_threads)
  model_logprobs_kernel(const float* __restrict__ logits, int32_t vocab, logprob_rows lp) {
  pdl_wait();
  pdl_trigger();
  const int row = blockIdx.x;
  const int32_t n = min(lp.count[row], int32_t(max_logprobs));
  if (n < 0)
    return;
  __shared__ select_shared sh;
  __shared__ int32_t cand_i[max_logprobs];
  __shared__ float cand_v[max_logprobs];
  __shared__ int32_t found;
  const float* v = logits + int64_t(row) * vocab;
  float* raw = lp.raw + int64_t(row) * vocab;
  float m = -INFINITY;
  for (int32_t i = threadIdx.x; i < vocab; i += select_threads) {
    const float x = v[i];
    raw[i] = x;
    m = fmaxf(m, x);
  }
  m = block_max_f(m, sh);
  double local = 0;
  if (isfinite(m))
    for (int32_t i = threadIdx.x; i < vocab; i += select_threads)
      local += exp(double(v[i] - m));
  const double total = block_sum_d(local, sh);
  const double lse = isfinite(m) ? double(m) + log(total) : double(m);
  if (threadIdx.x == 0) {
    lp.lse[row] = lse;
    found = 0;
  }
  if (n == 0)
    return;
  __syncthreads();
  // The n most likely (ties by index, as sequence_sampler orders them).
  const boundary b = select_count(v, vocab, min(n, vocab), sh);
  for (int32_t i = threadIdx.x; i < vocab; i += select_threads)
    if (inside(b, order_key(v[i]), i)) {
      const int32_t k = atomicAdd(&found, 1);
      if (k < max_logprobs) {
        cand_i[k] = i;
        cand_v[k] = v[i];
      }
    }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int32_t count = min(found, int32_t(max_logprobs));
    for (int32_t a = 1; a < count; ++a) // insertion sort of at most 20
      for (int32_t c = a; c > 0; --c) {
        const bool before = cand_v[c] > cand_v[c - 1]
                            || (cand_v[c] == cand_v[c - 1] && cand_i[c] < cand_i[c - 1]);
        if (!before)
          break;
        const float tv = cand_v[c];
        cand_v[c] = cand_v[c - 1];
        cand_v[c - 1] = tv;
        const int32_t ti = cand_i[c];
        cand_i[c] = cand_i[c - 1];
        cand_i[c - 1] = ti;
      }
    int32_t* out_t = lp.tokens + int64_t(row) * lp_stride;
    float* out_v = lp.values + int64_t(row) * lp_stride;
    for (int32_t k = 0; k < count; ++k) {
      out_t[1 + k] = cand_i[k];
      out_v[1 + k] = float(double(cand_v[k]) - lse);
    }
  }
}

/// The sampled token's model log-probability, where its row asks.
__device__ __forceinline__ void report_sampled(const logprob_rows& lp, int row, int32_t vocab,
                                               int32_t token) {
  if (lp.count && lp.count[row] >= 0) {
    lp.tokens[int64_t(row) * lp_stride] = token;
    lp.values[int64_t(row) * lp_stride] =
      float(double(lp.raw[int64_t(row) * vocab + token]) - lp.lse[row]);
  }
}

// -- selection ---------------------------------------------------------------------------

__global__ void __launch_bounds__(select_threads)
  select_kernel(const float* __restrict__ logits, int32_t vocab, sample_rows params,
                const part_stats* __restrict__ stats, int32_t* __restrict__ tokens,
                float* __restrict__ logprobs, logprob_rows lp) {
  pdl_wait();
  pdl_trigger();
  __shared__ select_shared sh;
  const int row = blockIdx.x;
  const float* v = logits + int64_t(row) * vocab;
  const part_stats* st = stats + int64_t(row) * parts;

  // Combine the parts (deterministic: one fixed order). One lane per part
  // reads its statistics once and computes its mass (a double exp each);
  // thread 0 folds the 32 masses in order into the total, the plain sum of
  // the masses the draw below walks. (Every thread computing all 32 exps
  // itself took 13 us of the step on the H200; every thread folding them
  // kept a double live across the block and spilled.)
  __shared__ float part_max[parts];
  __shared__ int32_t part_arg[parts];
  __shared__ double part_sum[parts], part_mass[parts];
  __shared__ double part_total;
  if (threadIdx.x < parts) {
    const part_stats mine = st[threadIdx.x];
    part_max[threadIdx.x] = mine.max;
    part_sum[threadIdx.x] = mine.sum;
    part_arg[threadIdx.x] = mine.argmax;
  }
  __syncthreads();
  float m = -INFINITY;
  int32_t argmax = 0;
  for (int p = 0; p < parts; ++p)
    if (part_max[p] > m) { // strict: an earlier part wins ties
      m = part_max[p];
      argmax = part_arg[p];
    }
  if (threadIdx.x < parts) {
    const double sum = part_sum[threadIdx.x];
    part_mass[threadIdx.x] = sum > 0 ? sum * exp(double(part_max[threadIdx.x] - m)) : 0.0;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (int p = 0; p < parts; ++p)
      t += part_mass[p]; // an empty part adds 0.0: the sum of skipping it
    part_total = t;
  }
  __syncthreads();
  const double total = part_total;

  const float temp = params.temperature[row];
  if (temp < greedy_below) {
    if (threadIdx.x == 0) {
      tokens[row] = argmax;
      logprobs[row] = float(-log(total));
      report_sampled(lp, row, vocab, argmax);
    }
    return;
  }
  const float u = random_unit(params.seed[row], uint64_t(params.step[row]));
  const int32_t top_k = params.top_k[row];
  const float top_p = params.top_p[row], min_p = params.min_p[row];
  const bool has_k = top_k > 0 && top_k < vocab;
  const bool filtered = has_k || top_p < 1.0f || min_p > 0.0f;

  if (!filtered) {
    // Inverse CDF in index order: the part, then the element.
    const double target = double(u) * total;
    double before = 0;
    int part = parts - 1;
    for (int p = 0; p < parts; ++p) {
      const double s = part_mass[p];
      if (before + s > target) {
        part = p;
        break;
      }
      before += s;
    }
    const int32_t size = part_size(vocab);
    const int32_t lo = part * size, hi = min(vocab, lo + size);
    const int32_t per = (size + select_threads - 1) / select_threads;
    const int32_t t_lo = lo + threadIdx.x * per, t_hi = min(hi, t_lo + per);
    double local = 0;
    for (int32_t i = t_lo; i < t_hi; ++i)
      local += exp(double(v[i] - m));
    const double prefix = before + block_exclusive_scan<double>(local, sh.scan_d);
    if (threadIdx.x == 0)
      sh.found = vocab - 1;
    __syncthreads();
    if (prefix <= target && prefix + local > target) {
      double acc = prefix;
      for (int32_t i = t_lo; i < t_hi; ++i) {
        acc += exp(double(v[i] - m));
        if (acc > target) {
          sh.found = i;
          break;
        }
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int32_t tok = sh.found;
      tokens[row] = tok;
      logprobs[row] = float(double(v[tok] - m) - log(total));
      report_sampled(lp, row, vocab, tok);
    }
    return;
  }

  // Filtered: top-k, then top-p, then min-p, each a prefix of the order.
  const int32_t k = has_k ? top_k : vocab;
  double mass_k = total;
  boundary set_k{0, vocab - 1, vocab}; // everything
  if (has_k) {
    set_k = select_count(v, vocab, k, sh);
    set_k.count = k;
    double local = 0;
    for (int32_t i = threadIdx.x; i < vocab; i += select_threads) {
      const uint32_t key = order_key(v[i]);
      if (inside(set_k, key, i))
        local += exp(double(v[i] - m));
    }
    mass_k = block_sum_d(local, sh);
  }
  int32_t keep = k;
  if (top_p < 1.0f) {
    const boundary b = select_mass(v, vocab, m, double(top_p) * mass_k, false, sh);
    keep = min(keep, b.count);
  }
  if (min_p > 0.0f) {
    int32_t local = 0;
    for (int32_t i = threadIdx.x; i < vocab; i += select_threads)
      local += exp(double(v[i] - m)) >= double(min_p);
    keep = min(keep, max(1, block_sum_i(local, sh)));
  }
  boundary kept_set = set_k;
  double kept = mass_k;
  if (keep < k || !has_k) {
    if (keep < vocab) {
      kept_set = select_count(v, vocab, keep, sh);
      double local = 0;
      for (int32_t i = threadIdx.x; i < vocab; i += select_threads)
        if (inside(kept_set, order_key(v[i]), i))
          local += exp(double(v[i] - m));
      kept = block_sum_d(local, sh);
    }
    kept_set.count = keep;
  }
  boundary pick = select_mass(v, vocab, m, double(u) * kept, true, sh);
  int32_t token = pick.cut;
  if (pick.count > keep) // rounding past the kept set: its last element
    token = kept_set.cut >= 0 ? kept_set.cut : token;
  if (threadIdx.x == 0) {
    tokens[row] = token;
    logprobs[row] = float(log(exp(double(v[token] - m)) / kept));
    report_sampled(lp, row, vocab, token);
  }
}

} // namespace

void launch_penalties(float* logits, int32_t vocab, const penalty_entry* entries,
                      const int32_t* count, int32_t capacity, const float* repetition,
                      const float* frequency, const float* presence, cudaStream_t stream) {
  if (capacity <= 0)
    return;
  const int32_t blocks = std::min<int32_t>((capacity + 255) / 256, 256);
  launch_kernel("penalties_kernel", penalties_kernel, dim3(blocks), dim3(256), 0, stream, logits,
                vocab, entries, count, capacity, repetition, frequency, presence);
}

/// Scratch bytes launch_sample needs per row (part statistics).
size_t sample_workspace_bytes(int32_t rows) {
  return size_t(rows) * parts * sizeof(part_stats);
}

void launch_model_logprobs(const float* logits, int32_t rows, int32_t vocab,
                           const logprob_rows& lp, cudaStream_t stream) {
  if (rows <= 0)
    return;
  launch_kernel("model_logprobs_kernel", model_logprobs_kernel, dim3(unsigned(rows)),
                dim3(select_threads), 0, stream, logits, vocab, lp);
}

void launch_sample(float* logits, int32_t rows, int32_t vocab, const sample_rows& params,
                   int32_t* tokens, float* logprobs, void* workspace, cudaStream_t stream,
                   const logprob_rows* lp) {
  if (rows <= 0)
    return;
  auto* stats = static_cast<part_stats*>(workspace);
  const bool vec = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  launch_kernel("stats_kernel", stats_kernel, dim3(parts, unsigned(rows)), dim3(stats_threads), 0,
                stream, logits, vocab, vec, params, stats);
  launch_kernel("select_kernel", select_kernel, dim3(unsigned(rows)), dim3(select_threads), 0,
                stream, logits, vocab, params, stats, tokens, logprobs,
                lp ? *lp : logprob_rows{});
}

} // namespace metronome::gpu
