// The 4-bit GEMV, the skinny GEMM's 4-bit form and the dequantization
// kernels (gpu/gemv_int4*.cu, gpu/skinny_gemm.cu) against the host: random 4-bit matrices in int4_layout's form, dequantized exactly on
// the host (gpu/int4_layout.cpp, itself checked against the checkpoints'
// published formulas in tests/model), multiplied in double.

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "gpu/int4_layout.hpp"
#include "model/cpu_ops.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/kernel_reference.hpp"
#include "tests/gpu/paged_kv.hpp"

namespace metronome {
namespace {

using gpu::bf16;
using test::dev_array;

struct int4_case {
  int32_t n, k, m, group; // group -1: one group a row
  bool perm;
};

/// A random 4-bit matrix: q and zeros over their whole ranges (zero 16
/// occurs in GPTQ v1), fp16 scales around 0.01, a random act-order
/// permutation where asked.
gpu::int4_layout random_int4(std::mt19937_64& rng, const int4_case& c) {
  gpu::int4_layout m;
  m.rows = c.n;
  m.cols = c.k;
  m.group_size = c.group < 0 ? c.k : c.group;
  m.q.resize(size_t(c.n) * (c.k / 8));
  for (auto& w : m.q)
    w = uint32_t(rng());
  std::uniform_real_distribution<float> scale(0.002f, 0.02f);
  m.scale_zero.resize(size_t(c.n * m.groups()));
  for (auto& sz : m.scale_zero)
    sz = uint32_t(f32_to_f16(scale(rng))) | (uint32_t(rng() % 17) << 16);
  if (c.perm) {
    m.perm.resize(size_t(c.k));
    std::iota(m.perm.begin(), m.perm.end(), 0);
    std::shuffle(m.perm.begin(), m.perm.end(), rng);
  }
  return m;
}

struct device_int4 {
  dev_array<uint32_t> q, sz;
  dev_array<int32_t> perm;
  gpu::int4_weights view;

  explicit device_int4(const gpu::int4_layout& m)
    : q(m.q), sz(m.scale_zero), perm(m.perm.empty() ? std::vector<int32_t>(1) : m.perm) {
    view.q = q.get();
    view.sz = sz.get();
    view.perm = m.perm.empty() ? nullptr : perm.get();
    view.group_size = m.group_size;
    view.groups = int32_t(m.groups());
  }
};

/// y [m][n] = x W^T in double, W [n][k] fp32.
std::vector<float> product(const std::vector<float>& w, const std::vector<float>& x, int32_t n,
                           int32_t k, int32_t m) {
  std::vector<float> y(size_t(m) * n);
  for (int32_t t = 0; t < m; ++t)
    for (int32_t r = 0; r < n; ++r) {
      double s = 0;
      for (int32_t i = 0; i < k; ++i)
        s += double(w[size_t(r) * k + i]) * double(x[size_t(t) * k + i]);
      y[size_t(t) * n + r] = float(s);
    }
  return y;
}

TEST(gpu_int4, gemv_matches_the_exactly_dequantized_product) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("gemv_int4");
  // Every padded batch (1, 2, 4, 8), every group size, odd row counts, k
  // from one lane's run to the 8B shape's down projection, act-order.
  // Groups of 128 and more run on tensor cores (generation 2), the rest in
  // fp32 (generation 1, which also runs every case).
  std::vector<int4_case> cases = {
    {64, 64, 1, 32, false},        {130, 96, 3, 32, true},        {4096, 4096, 1, 128, false},
    {6144, 4096, 2, -1, false},    {1000, 14336, 4, 128, true},   {512, 1024, 8, 64, true},
    {4096, 14336, 1, 128, false},  {257, 2048, 5, 64, false},     {28672, 4096, 1, 128, false},
    {512, 14336, 8, 128, false},   {300, 14336, 6, 128, true},    {257, 2048, 3, 128, false},
    {130, 1024, 7, -1, true},      {1000, 4096, 8, 128, false},   {72, 384, 5, 128, true},
    {96, 256, 2, 256, false}};
  if (test::quick_mode())
    cases.resize(3);
  const gpu::kernel_generations saved = gpu::active_kernels();
  for (const int gen : {2, 1})
  for (const auto& c : cases) {
    gpu::active_kernels().gemv_int4 = gen;
    SCOPED_TRACE("generation " + std::to_string(gen) + " n " + std::to_string(c.n) + " k "
                 + std::to_string(c.k) + " m " + std::to_string(c.m) + " group "
                 + std::to_string(c.group) + (c.perm ? " act-order" : ""));
    ASSERT_TRUE(gpu::gemv_int4_takes(gpu::gemv_epilogue::residual_add, c.m, c.k));
    const gpu::int4_layout m = random_int4(rng, c);
    std::vector<float> w(size_t(c.n) * c.k);
    gpu::dequantize(m, w.data());
    const device_int4 d(m);
    EXPECT_EQ(gpu::gemv_int4_tensor_cores(d.view, c.k),
              gen >= 2 && c.k % 128 == 0 && m.group_size % 128 == 0);
    // Plain bf16 inputs.
    const auto x = test::from_bf16(test::to_bf16(test::random_floats(rng, size_t(c.m) * c.k, -1, 1)));
    const auto want = product(w, x, c.n, c.k, c.m);
    auto d_x = test::upload_bf16(x);
    dev_array<float> d_y(size_t(c.m) * c.n);
    gpu::gemv_args a;
    a.n = c.n;
    a.k = c.k;
    a.m = c.m;
    a.x = d_x.get();
    a.out_f32 = d_y.get();
    gpu::launch_gemv_int4(gpu::gemv_epilogue::store_f32, a, d.view, nullptr);
    test::sync_check();
    EXPECT_LT(test::relative_error(d_y.download(), want), 1e-5);

    // The residual normalised on the fly, added into: norm in fp32, rounded
    // to bf16 as the staging rounds it.
    auto res = test::random_floats(rng, size_t(c.m) * c.k, -2, 2);
    auto g = test::random_floats(rng, size_t(c.k), 0.8f, 1.2f);
    const auto gb = test::to_bf16(g);
    std::vector<float> xn(res.size());
    for (int32_t t = 0; t < c.m; ++t) {
      double ss = 0;
      for (int32_t i = 0; i < c.k; ++i)
        ss += double(res[size_t(t) * c.k + i]) * res[size_t(t) * c.k + i];
      const float inv = float(1.0 / std::sqrt(ss / c.k + 1e-5));
      for (int32_t i = 0; i < c.k; ++i)
        xn[size_t(t) * c.k + i] =
          test::round_bf16(test::from_bf16(gb[size_t(i)]) * (res[size_t(t) * c.k + i] * inv));
    }
    const auto y = product(w, xn, c.n, c.k, c.m);
    // Added into a residual [m][n] of its own.
    auto out = test::random_floats(rng, size_t(c.m) * c.n, -1, 1);
    auto out_want = out;
    for (size_t i = 0; i < out.size(); ++i)
      out_want[i] += y[i];
    dev_array<float> d_res(res), d_out(out);
    auto d_g = test::upload_bf16(g);
    gpu::gemv_args r;
    r.n = c.n;
    r.k = c.k;
    r.m = c.m;
    r.residual_in = d_res.get();
    r.norm_weight = d_g.get();
    r.eps = 1e-5f;
    r.out_f32 = d_out.get();
    gpu::launch_gemv_int4(gpu::gemv_epilogue::residual_add, r, d.view, nullptr);
    test::sync_check();
    // The fp32 residual's inverse RMS is summed in another order: 1e-4.
    EXPECT_LT(test::relative_error(d_out.download(), out_want), 1e-4);
  }
  gpu::active_kernels() = saved;
}

TEST(gpu_int4, swiglu_rows_split_over_launches_match_the_host) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("gemv_int4_swiglu");
  // k = 14,336 at 8 tokens runs as two launches of 4 (gemv_int4_takes); at
  // 3 tokens as one.
  const gpu::kernel_generations saved = gpu::active_kernels();
  for (const int gen : {2, 1})
  for (const int4_case& c : {int4_case{256, 14336, 8, 128, false},
                             int4_case{256, 14336, 3, 128, true}}) {
    gpu::active_kernels().gemv_int4 = gen;
    SCOPED_TRACE("generation " + std::to_string(gen) + " m " + std::to_string(c.m));
    const gpu::int4_layout m = random_int4(rng, c);
    std::vector<float> w(size_t(c.n) * c.k);
    gpu::dequantize(m, w.data());
    const device_int4 d(m);
    const auto x = test::from_bf16(test::to_bf16(test::random_floats(rng, size_t(c.m) * c.k, -1, 1)));
    const auto y = product(w, x, c.n, c.k, c.m);
    const int32_t inter = c.n / 2;
    std::vector<float> want(size_t(c.m) * inter);
    for (int32_t t = 0; t < c.m; ++t)
      ref::silu_mul(y.data() + size_t(t) * c.n, y.data() + size_t(t) * c.n + inter, inter,
                    want.data() + size_t(t) * inter);
    for (auto& v : want)
      v = test::round_bf16(v);
    auto d_x = test::upload_bf16(x);
    dev_array<bf16> d_act(size_t(c.m) * inter);
    gpu::gemv_args a;
    a.n = c.n;
    a.k = c.k;
    a.m = c.m;
    a.x = d_x.get();
    a.out_bf16 = d_act.get();
    gpu::launch_gemv_int4(gpu::gemv_epilogue::swiglu, a, d.view, nullptr);
    test::sync_check();
    EXPECT_LT(test::relative_error(test::download_bf16(d_act), want), 5e-3);
  }
  gpu::active_kernels() = saved;
}

TEST(gpu_int4, dequantization_gives_the_exact_weights_rounded_to_bf16) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("dequantize_int4");
  for (const int4_case& c : {int4_case{96, 64, 1, 32, false}, int4_case{300, 512, 1, 128, true},
                             int4_case{2048, 4096, 1, -1, false}}) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " k " + std::to_string(c.k));
    const gpu::int4_layout m = random_int4(rng, c);
    std::vector<float> w(size_t(c.n) * c.k);
    gpu::dequantize(m, w.data());
    const device_int4 d(m);
    dev_array<bf16> out(w.size());
    gpu::launch_dequantize_int4(d.view, c.n, c.k, out.get(), nullptr);
    test::sync_check();
    const auto got = test::download_bf16(out);
    size_t wrong = 0;
    for (size_t i = 0; i < w.size(); ++i)
      wrong += got[i] != test::round_bf16(w[i]);
    EXPECT_EQ(wrong, 0u);
  }
}

using test::skinny_scratch;

TEST(gpu_int4, skinny_gemm_matches_the_exactly_dequantized_product) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("skinny_int4");
  // Token counts on and off the 8-token tiles (9 to 64), every group size,
  // one group a row, k from one chunk's part to the 8B down projection, odd
  // row counts, shapes that split k and that do not.
  std::vector<int4_case> cases = {
    {4096, 4096, 64, 128, false}, {6144, 4096, 24, 128, false}, {512, 14336, 16, 128, false},
    {257, 2048, 9, 64, false},    {130, 1056, 33, 32, false},   {512, 4096, 40, -1, false},
    {2048, 4096, 64, 256, false}, {96, 96, 12, 32, false},      {1000, 14336, 64, 128, false},
    {300, 512, 3, 128, false}};
  if (test::quick_mode())
    cases.resize(3);
  for (const auto& c : cases) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " k " + std::to_string(c.k) + " m "
                 + std::to_string(c.m) + " group " + std::to_string(c.group) + " splits "
                 + std::to_string(gpu::skinny_gemm_splits(gpu::gemv_epilogue::store_f32, c.n,
                                                          c.k, c.m)));
    const gpu::int4_layout m = random_int4(rng, c);
    std::vector<float> w(size_t(c.n) * c.k);
    gpu::dequantize(m, w.data());
    const device_int4 d(m);
    ASSERT_TRUE(gpu::skinny_gemm_int4_takes(d.view, c.k));
    const auto x = test::from_bf16(test::to_bf16(test::random_floats(rng, size_t(c.m) * c.k, -1, 1)));
    const auto want = product(w, x, c.n, c.k, c.m);
    auto d_x = test::upload_bf16(x);
    skinny_scratch sc(gpu::gemv_epilogue::store_f32, c.n, c.k, c.m);
    dev_array<float> d_y(size_t(c.m) * c.n);
    gpu::gemv_args a;
    a.n = c.n;
    a.k = c.k;
    a.m = c.m;
    a.x = d_x.get();
    a.out_f32 = d_y.get();
    d_y.poison();
    gpu::launch_skinny_gemm_int4(gpu::gemv_epilogue::store_f32, a, d.view, sc.view, nullptr);
    test::sync_check();
    const auto first = d_y.download();
    EXPECT_LT(test::relative_error(first, want), 1e-5);
    EXPECT_TRUE(sc.counters_zero());
    // Split or not, the same bits from launch to launch.
    d_y.poison();
    gpu::launch_skinny_gemm_int4(gpu::gemv_epilogue::store_f32, a, d.view, sc.view, nullptr);
    test::sync_check();
    EXPECT_TRUE(d_y.download() == first);
    // Without scratch: one block along k, the same sums within rounding.
    gpu::launch_skinny_gemm_int4(gpu::gemv_epilogue::store_f32, a, d.view, {}, nullptr);
    test::sync_check();
    EXPECT_LT(test::relative_error(d_y.download(), want), 1e-5);

    // Added into a residual, with a bias.
    auto bias = test::random_floats(rng, size_t(c.n), -1, 1);
    const auto bias_b = test::from_bf16(test::to_bf16(bias));
    auto out = test::random_floats(rng, size_t(c.m) * c.n, -1, 1);
    auto out_want = out;
    for (int32_t t = 0; t < c.m; ++t)
      for (int32_t r = 0; r < c.n; ++r)
        out_want[size_t(t) * c.n + r] += want[size_t(t) * c.n + r] + bias_b[size_t(r)];
    dev_array<float> d_out(out);
    auto d_bias = test::upload_bf16(bias);
    gpu::gemv_args r = a;
    r.out_f32 = d_out.get();
    r.bias = d_bias.get();
    skinny_scratch sr(gpu::gemv_epilogue::residual_add, c.n, c.k, c.m);
    gpu::launch_skinny_gemm_int4(gpu::gemv_epilogue::residual_add, r, d.view, sr.view, nullptr);
    test::sync_check();
    EXPECT_LT(test::relative_error(d_out.download(), out_want), 1e-5);

    // SwiGLU over rows (j, n/2 + j), rounded to bf16.
    if (c.n % 2 == 0) {
      const int32_t inter = c.n / 2;
      std::vector<float> act_want(size_t(c.m) * inter);
      for (int32_t t = 0; t < c.m; ++t)
        ref::silu_mul(want.data() + size_t(t) * c.n, want.data() + size_t(t) * c.n + inter, inter,
                      act_want.data() + size_t(t) * inter);
      for (auto& v : act_want)
        v = test::round_bf16(v);
      dev_array<bf16> d_act(size_t(c.m) * inter);
      gpu::gemv_args g = a;
      g.out_f32 = nullptr;
      g.out_bf16 = d_act.get();
      skinny_scratch sg(gpu::gemv_epilogue::swiglu, c.n, c.k, c.m);
      gpu::launch_skinny_gemm_int4(gpu::gemv_epilogue::swiglu, g, d.view, sg.view, nullptr);
      test::sync_check();
      EXPECT_LT(test::relative_error(test::download_bf16(d_act), act_want), 5e-3);
      EXPECT_TRUE(sg.counters_zero());
    }
  }
}

TEST(gpu_int4, skinny_gemm_qkv_rope_writes_what_the_dequantized_product_gives) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("skinny_int4_qkv");
  auto seqs = [&](int n, int32_t max_pos) { return test::one_token_seqs(rng, n, max_pos); };
  // (heads, kv heads, head dim, page size, sequences, bias), group size.
  const std::vector<std::pair<test::rope_case, int32_t>> cases = {
    {{32, 8, 128, 16, seqs(64, 600), true}, 128},
    {{28, 4, 128, 16, seqs(17, 100), false}, 64},
    {{8, 2, 64, 16, seqs(33, 300), true}, -1}};
  for (const auto& [c, group] : cases) {
    SCOPED_TRACE("heads " + std::to_string(c.heads) + " d " + std::to_string(c.head_dim)
                 + " seqs " + std::to_string(c.seqs.size()) + " group "
                 + std::to_string(group));
    test::paged_kv kv(rng, c.kv_heads, c.head_dim, c.page_size, c.seqs, 1, false);
    const int32_t m = kv.num_tokens();
    const int32_t width = (c.heads + 2 * c.kv_heads) * c.head_dim;
    const int32_t hidden = c.heads * c.head_dim;
    const gpu::int4_layout q4 = random_int4(rng, {width, hidden, m, group, false});
    std::vector<float> w(size_t(width) * hidden);
    gpu::dequantize(q4, w.data());
    const device_int4 d(q4);
    const auto x = test::from_bf16(test::to_bf16(test::random_floats(rng, size_t(m) * hidden, -2, 2)));
    auto bias = test::random_floats(rng, size_t(width), -0.5f, 0.5f);
    auto biasb = test::from_bf16(test::to_bf16(bias));
    const auto inv = test::rope_inv_freq(c.head_dim);
    auto d_x = test::upload_bf16(x);
    auto d_bias = test::upload_bf16(bias);
    dev_array<float> d_inv(inv);
    dev_array<bf16> d_q(size_t(m) * hidden);
    d_q.poison();
    skinny_scratch sc(gpu::gemv_epilogue::qkv_rope, width, hidden, m);
    gpu::gemv_args a;
    a.n = width;
    a.k = hidden;
    a.m = m;
    a.bias = c.bias ? d_bias.get() : nullptr;
    a.x = d_x.get();
    a.out_bf16 = d_q.get();
    a.inv_freq = d_inv.get();
    a.batch = kv.batch();
    a.kv = kv.view();
    a.num_heads = c.heads;
    gpu::launch_skinny_gemm_int4(gpu::gemv_epilogue::qkv_rope, a, d.view, sc.view, nullptr);
    test::sync_check();
    auto got_q = test::download_bf16(d_q);
    kv.download();
    const auto y = product(w, x, width, hidden, m);
    test::expect_qkv_written(y, width, c.bias ? &biasb : nullptr, inv, c, got_q, kv);
    EXPECT_TRUE(sc.counters_zero());
  }
}

TEST(gpu_int4, skinny_gemm_refuses_act_order_and_odd_k_by_name) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("skinny_int4_refuse");
  const gpu::int4_layout perm = random_int4(rng, {64, 256, 16, 128, true});
  const device_int4 d(perm);
  EXPECT_FALSE(gpu::skinny_gemm_int4_takes(d.view, 256));
  const gpu::int4_layout plain = random_int4(rng, {64, 256, 16, 128, false});
  const device_int4 p(plain);
  EXPECT_TRUE(gpu::skinny_gemm_int4_takes(p.view, 256));
  EXPECT_FALSE(gpu::skinny_gemm_int4_takes(p.view, 272));
  EXPECT_FALSE(gpu::skinny_gemm_int4_takes(gpu::int4_weights{}, 256));
  auto d_x = test::upload_bf16(std::vector<float>(16 * 256, 0.5f));
  dev_array<float> d_y(16 * 64);
  gpu::gemv_args a;
  a.n = 64;
  a.k = 256;
  a.m = 16;
  a.x = d_x.get();
  a.out_f32 = d_y.get();
  try {
    gpu::launch_skinny_gemm_int4(gpu::gemv_epilogue::store_f32, a, d.view, {}, nullptr);
    ADD_FAILURE() << "launch_skinny_gemm_int4 took an act-order matrix";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("launch_skinny_gemm_int4"), std::string::npos)
      << e.what();
  }
}

TEST(gpu_int4, shapes_off_the_kernels_grid_are_refused_by_name) {
  METRONOME_REQUIRE_GPU();
  using gpu::gemv_epilogue;
  EXPECT_FALSE(gpu::gemv_int4_takes(gemv_epilogue::store_f32, 1, 4104));
  EXPECT_FALSE(gpu::gemv_int4_takes(gemv_epilogue::store_f32, 9, 4096));
  // 8 tokens of 14,336 inputs stage 229 KB: two launches of 4, except for
  // qkv_rope, whose rows are not split.
  EXPECT_TRUE(gpu::gemv_int4_takes(gemv_epilogue::residual_add, 8, 14336));
  EXPECT_FALSE(gpu::gemv_int4_takes(gemv_epilogue::qkv_rope, 8, 14336));
  EXPECT_FALSE(gpu::gemv_int4_takes(gemv_epilogue::residual_add, 8, 28672 * 2));
  gpu::gemv_args a;
  a.n = 64;
  a.k = 4104;
  try {
    gpu::launch_gemv_int4(gpu::gemv_epilogue::store_f32, a, {}, nullptr);
    ADD_FAILURE() << "launch_gemv_int4 took k = 4104";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("k = 4104"), std::string::npos) << e.what();
  }
}

} // namespace
} // namespace metronome
