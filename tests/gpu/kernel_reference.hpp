#pragma once
// Reference helpers shared by the GPU kernel tests: a tensor_view over host
// bf16 bits, a random linear problem with its reference output, the skinny
// GEMM's split-k scratch, and the expected q, k, v of the fused qkv + RoPE
// epilogues.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "model/cpu_ops.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/paged_kv.hpp"

namespace metronome::test {

/// A tensor_view over host bf16 bits (for the reference ops).
inline tensor_view bf16_view(const std::vector<uint16_t>& bits, std::vector<int64_t> shape) {
  tensor_view v;
  v.name = "test";
  v.type = dtype::bf16;
  v.shape = std::move(shape);
  v.data = reinterpret_cast<const std::byte*>(bits.data());
  v.nbytes = bits.size() * 2;
  return v;
}

/// y = x W^T + b on random bf16 data, uploaded, with the CPU reference.
struct linear_problem {
  int32_t n, k, m;
  std::vector<float> ref; // [m][n], bias included
  dev_array<gpu::bf16> w, x, bias;

  linear_problem(std::mt19937_64& rng, int32_t n_, int32_t k_, int32_t m_)
    : n(n_), k(k_), m(m_), w(upload_bf16(random_floats(rng, size_t(n_) * k_, -0.05f, 0.05f))),
      x(upload_bf16(random_floats(rng, size_t(m_) * k_, -1, 1))),
      bias(upload_bf16(random_floats(rng, size_t(n_), -1, 1))) {
    const auto wb = to_bf16(w_host()), bb = to_bf16(bias_host());
    const auto xb = x_host();
    tensor_view wv = bf16_view(wb, {n, k}), bv = bf16_view(bb, {n});
    ref.resize(size_t(m) * n);
    ref::linear(wv, &bv, xb.data(), m, ref.data());
  }

  std::vector<float> w_host() const { return download_bf16(w); }
  std::vector<float> x_host() const { return download_bf16(x); }
  std::vector<float> bias_host() const { return download_bf16(bias); }

  /// Arguments for this problem with a plain bf16 input and `out` as output.
  gpu::gemv_args args(float* out) const {
    gpu::gemv_args a;
    a.w = w.get();
    a.n = n;
    a.k = k;
    a.m = m;
    a.bias = bias.get();
    a.x = x.get();
    a.out_f32 = out;
    return a;
  }
};

/// The SwiGLU of a projection over m tokens: act[t][j] = bf16(silu(y_j) *
/// y_{inter + j}) with y = x[t] W^T, W [n][k] as bf16 bits, x as the kernel
/// sees it (already rounded to bf16), inter = n / 2.
inline std::vector<float> reference_swiglu(const std::vector<uint16_t>& wb, int32_t n, int32_t k,
                                           const std::vector<float>& x, int32_t m) {
  std::vector<float> y(size_t(m) * n);
  ref::linear(bf16_view(wb, {n, k}), nullptr, x.data(), m, y.data());
  const int32_t inter = n / 2;
  std::vector<float> act(size_t(m) * inter);
  for (int32_t t = 0; t < m; ++t)
    ref::silu_mul(y.data() + size_t(t) * n, y.data() + size_t(t) * n + inter, inter,
                  act.data() + size_t(t) * inter);
  for (auto& v : act)
    v = round_bf16(v);
  return act;
}

/// The skinny GEMM's split-k scratch sized for a shape as the engine sizes
/// it (skinny_gemm_workspace), counters at zero.
struct skinny_scratch {
  gpu::skinny_gemm_workspace_size ws;
  dev_array<float> partials;
  dev_array<int32_t> counters;
  gpu::skinny_gemm_scratch view;

  skinny_scratch(gpu::gemv_epilogue ep, int32_t n, int32_t k, int32_t m)
    : skinny_scratch(gpu::skinny_gemm_workspace(ep, n, k, m)) {
  }

  explicit skinny_scratch(gpu::skinny_gemm_workspace_size w)
    : ws(w), partials(std::max<size_t>(ws.partial_bytes / 4, 1)),
      counters(std::vector<int32_t>(size_t(std::max(ws.counters, 1)), 0)) {
    view.partials = partials.get();
    view.partial_bytes = ws.partial_bytes;
    view.counter_data = counters.get();
    view.counters = ws.counters;
  }

  /// Whether every launch left the counters at zero, as they must.
  bool counters_zero() {
    const auto c = counters.download();
    return std::all_of(c.begin(), c.end(), [](int32_t v) { return v == 0; });
  }
};

struct rope_case {
  int32_t heads, kv_heads, head_dim, page_size;
  std::vector<std::pair<int32_t, int32_t>> seqs; // (start_pos, tokens)
  bool bias;
};

/// n sequences of one token each at random positions in [0, max_pos].
inline std::vector<std::pair<int32_t, int32_t>> one_token_seqs(std::mt19937_64& rng, int n,
                                                                int32_t max_pos) {
  std::vector<std::pair<int32_t, int32_t>> s;
  std::uniform_int_distribution<int32_t> pos(0, max_pos);
  for (int i = 0; i < n; ++i)
    s.push_back({pos(rng), 1});
  return s;
}

/// RoPE's inverse frequencies for head_dim, Llama 3's base (500,000).
inline std::vector<float> rope_inv_freq(int32_t head_dim) {
  std::vector<float> inv(size_t(head_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i)
    inv[i] = float(std::pow(500000.0, -2.0 * double(i) / head_dim));
  return inv;
}

/// The expected q, k, v of one token: bias, then RoPE on q and k, then bf16.
inline void reference_qkv(const std::vector<float>& row, const std::vector<float>* bias,
                   const std::vector<float>& inv_freq, const rope_case& c, int32_t pos,
                   std::vector<float>& q, std::vector<float>& k, std::vector<float>& v) {
  const int32_t d = c.head_dim, qs = c.heads * d, kvs = c.kv_heads * d;
  std::vector<float> r = row;
  if (bias)
    for (size_t i = 0; i < r.size(); ++i)
      r[i] += (*bias)[i];
  q.assign(r.begin(), r.begin() + qs);
  k.assign(r.begin() + qs, r.begin() + qs + kvs);
  v.assign(r.begin() + qs + kvs, r.end());
  ref::rope(q.data(), c.heads, d, pos, inv_freq.data());
  ref::rope(k.data(), c.kv_heads, d, pos, inv_freq.data());
  for (auto* vec : {&q, &k, &v})
    for (auto& x : *vec)
      x = test::round_bf16(x);
}

/// Checks what a fused qkv + RoPE epilogue wrote for m tokens against the
/// projections y [m][width] it was fed: q rows, and k and v in the cache
/// (downloaded) at each token's position, nothing else written. q and k (and
/// v unless v_exact) within relative error `tol`.
inline void expect_qkv_written(const std::vector<float>& y, int32_t width,
                               const std::vector<float>* bias,
                               const std::vector<float>& inv_freq, const rope_case& c,
                               const std::vector<float>& got_q, paged_kv& kv,
                               double tol = 5e-3, bool v_exact = false) {
  const int32_t m = kv.num_tokens();
  std::vector<float> ref_q, got_k, ref_k, got_v, ref_v;
  for (int32_t t = 0; t < m; ++t) {
    std::vector<float> row(y.begin() + int64_t(t) * width, y.begin() + int64_t(t + 1) * width);
    std::vector<float> q, k, v;
    reference_qkv(row, bias, inv_freq, c, kv.position(t), q, k, v);
    ref_q.insert(ref_q.end(), q.begin(), q.end());
    ref_k.insert(ref_k.end(), k.begin(), k.end());
    ref_v.insert(ref_v.end(), v.begin(), v.end());
    for (int32_t h = 0; h < c.kv_heads; ++h)
      for (int32_t d = 0; d < c.head_dim; ++d) {
        got_k.push_back(kv.k_at(kv.seq_of(t), kv.position(t), h, d));
        got_v.push_back(kv.v_at(kv.seq_of(t), kv.position(t), h, d));
      }
  }
  EXPECT_LT(relative_error(got_q, ref_q), tol);
  EXPECT_LT(relative_error(got_k, ref_k), tol);
  if (v_exact)
    EXPECT_EQ(got_v, ref_v);
  else
    EXPECT_LT(relative_error(got_v, ref_v), tol);
  // Every slot not written this step is still poison.
  EXPECT_EQ(kv.count_written(), size_t(m) * 2 * c.kv_heads * c.head_dim);
}

} // namespace metronome::test
