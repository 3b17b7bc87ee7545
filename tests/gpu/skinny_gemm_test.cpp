// The tensor-core skinny GEMM (decode batches of up to 64 tokens) against the
// CPU reference ops at many shapes: every epilogue, odd row counts, k split
// across blocks and not, token counts on and off the 8-token tiles. Outputs
// are poisoned first; split runs must be bit-identical from launch to launch
// and leave their counters at zero.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "model/cpu_ops.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/paged_kv.hpp"
#include "tests/gpu/kernel_reference.hpp"

namespace metronome {
namespace {

using gpu::bf16;
using test::bf16_view;
using test::dev_array;

using scratch = test::skinny_scratch;

struct shape {
  int32_t n, k, m;
};

std::string name(const shape& s) {
  return "n " + std::to_string(s.n) + " k " + std::to_string(s.k) + " m " + std::to_string(s.m);
}

TEST(gpu_skinny_gemm, store_and_residual_match_reference_split_or_not) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("skinny_store");
  std::vector<shape> cases = {{128, 64, 3},     {127, 64, 9},     {4096, 4096, 16},
                              {4096, 4096, 64}, {2048, 8192, 33}, {1000, 14336, 40},
                              {130, 544, 5},    {6144, 4096, 24}, {515, 4096, 17},
                              {4096, 14336, 64}, {32000, 256, 64}, {2049, 2048, 1},
                              {3072, 2048, 8},  {4096, 1024, 57}, {300, 1008, 12},
                              {64, 16, 3},      {515, 4112, 64}};
  if (test::quick_mode())
    cases.resize(4);
  bool some_split = false;
  for (const auto& c : cases) {
    SCOPED_TRACE(name(c));
    const int32_t splits = gpu::skinny_gemm_splits(gpu::gemv_epilogue::store_f32, c.n, c.k, c.m);
    some_split |= splits > 1;
    const test::linear_problem lp(rng, c.n, c.k, c.m);
    const auto& ref = lp.ref;
    scratch sc(gpu::gemv_epilogue::store_f32, c.n, c.k, c.m);

    dev_array<float> d_y(size_t(c.m) * c.n); // poisoned
    gpu::gemv_args a = lp.args(d_y.get());
    gpu::launch_skinny_gemm(gpu::gemv_epilogue::store_f32, a, sc.view, nullptr);
    test::sync_check();
    const auto first = d_y.download();
    EXPECT_LT(test::relative_error(first, ref), 1e-5) << "splits " << splits;
    // Again: the same bits (the split sums are added in a fixed order).
    d_y.poison();
    gpu::launch_skinny_gemm(gpu::gemv_epilogue::store_f32, a, sc.view, nullptr);
    test::sync_check();
    const auto second = d_y.download();
    EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * 4));
    EXPECT_TRUE(sc.counters_zero());

    auto res = test::random_floats(rng, size_t(c.m) * c.n, -1, 1);
    auto want = res;
    for (size_t i = 0; i < res.size(); ++i)
      want[i] += ref[i];
    dev_array<float> d_res(res);
    a.out_f32 = d_res.get();
    gpu::launch_skinny_gemm(gpu::gemv_epilogue::residual_add, a, sc.view, nullptr);
    test::sync_check();
    EXPECT_LT(test::relative_error(d_res.download(), want), 1e-5);
    EXPECT_TRUE(sc.counters_zero());
  }
  if (!test::quick_mode()) {
    EXPECT_TRUE(some_split) << "no case split k: the fix-up path went untested";
  }
}

TEST(gpu_skinny_gemm, swiglu_matches_reference) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("skinny_swiglu");
  const std::vector<shape> cases = {{2 * 192, 64, 3},    {2 * 8192, 2048, 48},
                                    {2 * 1000, 4096, 12}, {2 * 24, 64, 64},
                                    {2 * 1024, 4096, 64}, {2 * 224, 64, 7}};
  for (const auto& c : cases) {
    SCOPED_TRACE(name(c));
    auto w = test::random_floats(rng, size_t(c.n) * c.k, -0.05f, 0.05f);
    auto wb = test::to_bf16(w);
    auto x = test::random_floats(rng, size_t(c.m) * c.k, -2, 2);
    auto xb = test::from_bf16(test::to_bf16(x));
    auto d_w = test::upload_bf16(w);
    auto d_x = test::upload_bf16(x);
    const int32_t inter = c.n / 2;
    const auto ref = test::reference_swiglu(wb, c.n, c.k, xb, c.m);
    scratch sc(gpu::gemv_epilogue::swiglu, c.n, c.k, c.m);
    dev_array<bf16> d_act(size_t(c.m) * inter); // poisoned
    gpu::gemv_args a;
    a.w = d_w.get();
    a.n = c.n;
    a.k = c.k;
    a.m = c.m;
    a.x = d_x.get();
    a.out_bf16 = d_act.get();
    gpu::launch_skinny_gemm(gpu::gemv_epilogue::swiglu, a, sc.view, nullptr);
    test::sync_check();
    EXPECT_LT(test::relative_error(test::download_bf16(d_act), ref), 5e-3);
    EXPECT_TRUE(sc.counters_zero());
  }
}

TEST(gpu_skinny_gemm, qkv_rope_epilogue_matches_linear_rope_and_cache_write) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("skinny_qkv");
  // (heads, kv heads, head dim, page size, sequences, bias); one token each.
  auto seqs = [&](int n, int32_t max_pos) { return test::one_token_seqs(rng, n, max_pos); };
  const std::vector<test::rope_case> cases = {
    {4, 2, 16, 16, seqs(3, 40), true},      {32, 8, 64, 16, seqs(9, 300), false},
    {32, 8, 128, 16, seqs(64, 600), true}, {4, 1, 16, 8, seqs(17, 20), false},
    {28, 4, 128, 16, seqs(33, 100), true},  {32, 8, 128, 16, seqs(16, 1000), false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE("heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " d "
                 + std::to_string(c.head_dim) + " seqs " + std::to_string(c.seqs.size()));
    test::paged_kv kv(rng, c.kv_heads, c.head_dim, c.page_size, c.seqs, 1, false);
    const int32_t m = kv.num_tokens();
    const int32_t width = (c.heads + 2 * c.kv_heads) * c.head_dim;
    const int32_t hidden = c.heads * c.head_dim;
    auto w = test::random_floats(rng, size_t(width) * hidden, -0.05f, 0.05f);
    auto wb = test::to_bf16(w);
    auto x = test::random_floats(rng, size_t(m) * hidden, -2, 2);
    auto xb = test::from_bf16(test::to_bf16(x));
    auto bias = test::random_floats(rng, size_t(width), -0.5f, 0.5f);
    auto biasb = test::from_bf16(test::to_bf16(bias));
    const auto inv = test::rope_inv_freq(c.head_dim);
    auto d_w = test::upload_bf16(w);
    auto d_x = test::upload_bf16(x);
    auto d_bias = test::upload_bf16(bias);
    dev_array<float> d_inv(inv);
    dev_array<bf16> d_q(size_t(m) * hidden); // poisoned
    scratch sc(gpu::gemv_epilogue::qkv_rope, width, hidden, m);
    gpu::gemv_args a;
    a.w = d_w.get();
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
    gpu::launch_skinny_gemm(gpu::gemv_epilogue::qkv_rope, a, sc.view, nullptr);
    test::sync_check();
    auto got_q = test::download_bf16(d_q);
    kv.download();

    std::vector<float> y(size_t(m) * width);
    ref::linear(bf16_view(wb, {width, hidden}), nullptr, xb.data(), m, y.data());
    test::expect_qkv_written(y, width, c.bias ? &biasb : nullptr, inv, c, got_q, kv);
    EXPECT_TRUE(sc.counters_zero());
  }
}

TEST(gpu_skinny_gemm, too_little_scratch_means_no_split_and_the_same_result) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("skinny_scratch");
  const shape c{4096, 4096, 64};
  ASSERT_GT(gpu::skinny_gemm_splits(gpu::gemv_epilogue::store_f32, c.n, c.k, c.m), 1);
  const test::linear_problem lp(rng, c.n, c.k, c.m);
  dev_array<float> d_y(size_t(c.m) * c.n);
  gpu::launch_skinny_gemm(gpu::gemv_epilogue::store_f32, lp.args(d_y.get()), {}, nullptr);
  test::sync_check();
  EXPECT_LT(test::relative_error(d_y.download(), lp.ref), 1e-5);
}

TEST(gpu_skinny_gemm, split_launches_replayed_from_a_graph_share_their_counters) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("skinny_graph");
  // Two shapes that both split k, one scratch, captured once, replayed
  // three times: each replay must find the counters at zero again.
  const test::linear_problem a(rng, 4096, 4096, 64), b(rng, 6144, 4096, 24);
  ASSERT_GT(gpu::skinny_gemm_splits(gpu::gemv_epilogue::store_f32, a.n, a.k, a.m), 1);
  ASSERT_GT(gpu::skinny_gemm_splits(gpu::gemv_epilogue::store_f32, b.n, b.k, b.m), 1);
  const auto wa = gpu::skinny_gemm_workspace(gpu::gemv_epilogue::store_f32, a.n, a.k, a.m);
  const auto wb = gpu::skinny_gemm_workspace(gpu::gemv_epilogue::store_f32, b.n, b.k, b.m);
  scratch sc(gpu::skinny_gemm_workspace_size{std::max(wa.partial_bytes, wb.partial_bytes),
                                             std::max(wa.counters, wb.counters)});
  dev_array<float> ya(size_t(a.m) * a.n), yb(size_t(b.m) * b.n);
  cudaStream_t stream = nullptr;
  METRONOME_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  METRONOME_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  gpu::launch_skinny_gemm(gpu::gemv_epilogue::store_f32, a.args(ya.get()), sc.view, stream);
  gpu::launch_skinny_gemm(gpu::gemv_epilogue::store_f32, b.args(yb.get()), sc.view, stream);
  METRONOME_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  METRONOME_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    ya.poison();
    yb.poison();
    // The poison is a cudaMemset on the legacy stream, which a non-blocking
    // stream does not wait for.
    METRONOME_CUDA(cudaDeviceSynchronize());
    METRONOME_CUDA(cudaGraphLaunch(exec, stream));
    METRONOME_CUDA(cudaStreamSynchronize(stream));
    EXPECT_LT(test::relative_error(ya.download(), a.ref), 1e-5);
    EXPECT_LT(test::relative_error(yb.download(), b.ref), 1e-5);
    EXPECT_TRUE(sc.counters_zero());
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(gpu_skinny_gemm, rejects_what_it_cannot_compute) {
  METRONOME_REQUIRE_GPU();
  EXPECT_FALSE(gpu::skinny_gemm_supports(gpu::gemv_epilogue::store_f32, 128, 68, 0));
  EXPECT_FALSE(gpu::skinny_gemm_supports(gpu::gemv_epilogue::swiglu, 127, 64, 0));
  EXPECT_TRUE(gpu::skinny_gemm_supports(gpu::gemv_epilogue::store_f32, 127, 64, 0));
  EXPECT_FALSE(gpu::skinny_gemm_supports(gpu::gemv_epilogue::qkv_rope, 6144 + 64, 4096, 128));
  EXPECT_TRUE(gpu::skinny_gemm_supports(gpu::gemv_epilogue::qkv_rope, 6144, 4096, 128));
  gpu::gemv_args a;
  a.n = 128;
  a.k = 64;
  a.m = 65;
  EXPECT_THROW(gpu::launch_skinny_gemm(gpu::gemv_epilogue::store_f32, a, {}, nullptr),
               gpu::cuda_error);
}

} // namespace
} // namespace metronome
