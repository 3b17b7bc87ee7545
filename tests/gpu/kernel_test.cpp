// The elementwise kernels and the fused GEMV against the CPU reference ops
// (model/cpu_ops.hpp) on fresh random inputs, outputs poisoned before each
// run, every launch checked.

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <thread>

#include "bench/gpu/environment_switches.hpp"
#include "model/cpu_ops.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/test_env.hpp"
#include "tests/gpu/paged_kv.hpp"
#include "tests/gpu/kernel_reference.hpp"

namespace metronome {
namespace {

using gpu::bf16;
using test::dev_array;
using test::bf16_view;
using test::rope_case;


TEST(gpu_kernels, embed_gathers_rows_exactly_and_reads_fed_ids) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("embed");
  for (int32_t hidden : {64, 2048, 4104}) {
    const int32_t vocab = 1000, rows = 37;
    auto table = test::random_floats(rng, size_t(vocab) * hidden, -1, 1);
    auto bits = test::to_bf16(table);
    std::vector<int32_t> ids(rows), fed(11), packed(rows);
    for (auto& id : fed)
      id = int32_t(rng() % vocab);
    // Every third row is fed: its id is -1 - a row of `fed` (the previous
    // step's sampled ids), the rest are plain ids.
    for (int32_t r = 0; r < rows; ++r) {
      if (r % 3 == 1) {
        const int32_t f = int32_t(rng() % fed.size());
        packed[size_t(r)] = -1 - f;
        ids[size_t(r)] = fed[size_t(f)];
      } else {
        ids[size_t(r)] = int32_t(rng() % vocab);
        packed[size_t(r)] = ids[size_t(r)];
      }
    }
    auto d_table = test::upload_bf16(table);
    dev_array<int32_t> d_ids(packed), d_fed(fed);
    dev_array<float> d_x(size_t(rows) * hidden);
    d_x.poison();
    gpu::launch_embed(d_table.get(), d_ids.get(), d_fed.get(), rows, hidden, d_x.get(), nullptr);
    test::sync_check();
    std::vector<float> ref(size_t(rows) * hidden);
    ref::embed(bf16_view(bits, {vocab, hidden}), ids, ref.data());
    EXPECT_EQ(d_x.download(), ref) << "hidden " << hidden;
  }
}

TEST(gpu_kernels, rms_norm_matches_reference_with_and_without_row_map) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("rms_norm");
  // 16,384: longer than the registers hold (a second pass over x).
  for (int32_t n : {64, 2048, 4096, 5120, 16384}) {
    const int32_t rows = 19;
    auto x = test::random_floats(rng, size_t(rows) * n, -3, 3);
    auto w = test::random_floats(rng, size_t(n), 0.5f, 1.5f);
    auto wb = test::to_bf16(w);
    dev_array<float> d_x(x);
    auto d_w = test::upload_bf16(w);
    std::vector<int32_t> map = {18, 0, 7, 7, 3};
    dev_array<int32_t> d_map(map);
    dev_array<bf16> d_out(size_t(rows) * n), d_gathered(map.size() * size_t(n));
    gpu::launch_rms_norm(d_x.get(), nullptr, d_w.get(), 1e-5f, rows, n, d_out.get(), nullptr);
    gpu::launch_rms_norm(d_x.get(), d_map.get(), d_w.get(), 1e-5f, int32_t(map.size()), n,
                         d_gathered.get(), nullptr);
    test::sync_check();
    std::vector<float> ref(x.size());
    ref::rms_norm(x.data(), bf16_view(wb, {n}), 1e-5, rows, n, ref.data());
    for (auto& r : ref)
      r = test::round_bf16(r);
    auto got = test::download_bf16(d_out);
    EXPECT_LT(test::relative_error(got, ref), 2e-3) << "n " << n;
    std::vector<float> ref_g;
    for (auto r : map)
      ref_g.insert(ref_g.end(), ref.begin() + int64_t(r) * n, ref.begin() + int64_t(r + 1) * n);
    EXPECT_LT(test::relative_error(test::download_bf16(d_gathered), ref_g), 2e-3) << "n " << n;
  }
}

// The reduction of split-K partials fused with the residual add and the next
// norm: the residual gets exactly x + p_0 + ... + p_(s-1) + bias (summed in
// that order in fp32), the output the reference norm of that residual.
TEST(gpu_kernels, residual_rms_norm_adds_the_partials_then_normalises) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("residual_rms_norm");
  for (int32_t n : {64, 2048, 3584, 4096, 8192})
    for (int32_t splits : {1, 2, 3, 4})
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE("n " + std::to_string(n) + " splits " + std::to_string(splits)
                     + (with_bias ? " bias" : ""));
        ASSERT_TRUE(gpu::residual_rms_norm_supports(n));
        const int32_t rows = 13;
        auto x = test::random_floats(rng, size_t(rows) * n, -3, 3);
        auto parts = test::random_floats(rng, size_t(splits) * rows * n, -2, 2);
        auto w = test::random_floats(rng, size_t(n), 0.5f, 1.5f);
        auto bias = test::random_floats(rng, size_t(n), -1, 1);
        auto wb = test::to_bf16(w), bb = test::to_bf16(bias);
        dev_array<float> d_x(x), d_parts(parts);
        auto d_w = test::upload_bf16(w);
        auto d_b = test::upload_bf16(bias);
        dev_array<bf16> d_out(size_t(rows) * n);
        gpu::launch_residual_rms_norm(d_parts.get(), splits, with_bias ? d_b.get() : nullptr,
                                      d_x.get(), d_w.get(), 1e-5f, rows, n, d_out.get(), nullptr);
        test::sync_check();
        std::vector<float> want(x);
        for (int32_t r = 0; r < rows; ++r)
          for (int32_t i = 0; i < n; ++i) {
            float v = x[size_t(r) * n + i];
            for (int32_t s = 0; s < splits; ++s)
              v += parts[(size_t(s) * rows + r) * n + i];
            if (with_bias)
              v += bf16_to_f32(bb[size_t(i)]);
            want[size_t(r) * n + i] = v;
          }
        EXPECT_EQ(d_x.download(), want);
        std::vector<float> ref(want.size());
        ref::rms_norm(want.data(), bf16_view(wb, {n}), 1e-5, rows, n, ref.data());
        for (auto& r : ref)
          r = test::round_bf16(r);
        EXPECT_LT(test::relative_error(test::download_bf16(d_out), ref), 2e-3);
      }
  EXPECT_FALSE(gpu::residual_rms_norm_supports(16384));
  EXPECT_FALSE(gpu::residual_rms_norm_supports(4098));
  dev_array<float> d_x(64), d_parts(5 * 64);
  dev_array<bf16> d_w(64), d_out(64);
  EXPECT_THROW(gpu::launch_residual_rms_norm(d_parts.get(), 5, nullptr, d_x.get(), d_w.get(),
                                             1e-5f, 1, 64, d_out.get(), nullptr),
               gpu::cuda_error); // at most 4 partials
}

TEST(gpu_kernels, swiglu_matches_reference) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("swiglu");
  for (int32_t inter : {8, 192, 8192, 14336}) {
    const int32_t rows = 5;
    auto gu = test::random_floats(rng, size_t(rows) * 2 * inter, -4, 4);
    auto d_gu = test::upload_bf16(gu);
    auto gub = test::from_bf16(test::to_bf16(gu));
    dev_array<bf16> d_act(size_t(rows) * inter);
    gpu::launch_swiglu(d_gu.get(), rows, inter, d_act.get(), nullptr);
    test::sync_check();
    std::vector<float> ref(size_t(rows) * inter);
    for (int32_t r = 0; r < rows; ++r)
      ref::silu_mul(gub.data() + size_t(r) * 2 * inter, gub.data() + size_t(r) * 2 * inter + inter,
                    inter, ref.data() + size_t(r) * inter);
    for (auto& v : ref)
      v = test::round_bf16(v);
    EXPECT_LT(test::relative_error(test::download_bf16(d_act), ref), 2e-3) << "inter " << inter;
  }
}

// -- RoPE + KV write ---------------------------------------------------------------------

TEST(gpu_kernels, rope_kv_write_matches_reference_and_writes_only_its_slots) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("rope_kv_write");
  const std::vector<rope_case> cases = {
    {4, 2, 16, 16, {{0, 5}, {13, 29}}, false},
    {32, 8, 64, 16, {{0, 17}, {15, 1}, {100, 33}}, false},
    {32, 8, 128, 16, {{4095, 1}, {0, 64}}, true},
    {28, 4, 128, 7, {{6, 9}, {21, 1}}, true},
    {8, 8, 32, 16, {{1, 31}}, false},
    {16, 2, 256, 16, {{3, 5}}, false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE("heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " d "
                 + std::to_string(c.head_dim) + " page " + std::to_string(c.page_size));
    test::paged_kv kv(rng, c.kv_heads, c.head_dim, c.page_size, c.seqs, 2, /*fill=*/false);
    const int32_t width = (c.heads + 2 * c.kv_heads) * c.head_dim;
    const int32_t tokens = kv.num_tokens();
    auto qkv = test::random_floats(rng, size_t(tokens) * width, -2, 2);
    auto qkvb = test::from_bf16(test::to_bf16(qkv));
    auto bias = test::random_floats(rng, size_t(width), -0.5f, 0.5f);
    auto biasb = test::from_bf16(test::to_bf16(bias));
    std::vector<float> inv(size_t(c.head_dim / 2));
    for (size_t i = 0; i < inv.size(); ++i)
      inv[i] = float(std::pow(10000.0, -2.0 * double(i) / c.head_dim));
    auto d_qkv = test::upload_bf16(qkv);
    auto d_bias = test::upload_bf16(bias);
    dev_array<float> d_inv(inv);
    dev_array<bf16> d_q(size_t(tokens) * c.heads * c.head_dim);
    gpu::launch_rope_kv_write(d_qkv.get(), c.bias ? d_bias.get() : nullptr, d_inv.get(),
                              kv.batch(), kv.view(), c.heads, d_q.get(), nullptr);
    test::sync_check();
    auto got_q = test::download_bf16(d_q);
    kv.download();
    // The kernel only rotates and rounds: tighter than a GEMM's error, v exact.
    test::expect_qkv_written(qkvb, width, c.bias ? &biasb : nullptr, inv, c, got_q, kv, 3e-3,
                       /*v_exact=*/true);
  }
}

// -- GEMV ----------------------------------------------------------------------------------

struct gemv_case {
  int32_t n, k, m;
};

TEST(gpu_kernels, gemv_store_and_residual_match_reference) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("gemv");
  std::vector<gemv_case> cases = {{128, 64, 1},    {127, 64, 3},    {4096, 4096, 1},
                                  {4096, 4096, 4},  {2048, 8192, 2}, {1000, 14336, 4},
                                  {130, 520, 2},    {6144, 4096, 1}, {2048, 2048, 1},
                                  {4096, 14336, 1}, {3072, 2048, 8}, {515, 4096, 2},
                                  {20000, 1024, 2}, {3072, 2048, 1}};
  if (test::quick_mode())
    cases.resize(3);
  for (const auto& c : cases) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " k " + std::to_string(c.k) + " m "
                 + std::to_string(c.m));
    const test::linear_problem lp(rng, c.n, c.k, c.m);
    const auto& ref = lp.ref;
    auto res = test::random_floats(rng, size_t(c.m) * c.n, -1, 1);
    auto res_want = res;
    for (size_t i = 0; i < res.size(); ++i)
      res_want[i] += ref[i];
    for (int gen : {2, 1}) {
      test::kernel_generation_scope scope(gen);
      SCOPED_TRACE("generation " + std::to_string(gen));
      dev_array<float> d_y(size_t(c.m) * c.n);
      gpu::gemv_args a = lp.args(d_y.get());
      gpu::launch_gemv(gpu::gemv_epilogue::store_f32, a, nullptr);
      test::sync_check();
      EXPECT_LT(test::relative_error(d_y.download(), ref), 1e-5);

      dev_array<float> d_res(res);
      a.out_f32 = d_res.get();
      gpu::launch_gemv(gpu::gemv_epilogue::residual_add, a, nullptr);
      test::sync_check();
      EXPECT_LT(test::relative_error(d_res.download(), res_want), 1e-5);
    }
  }
}

TEST(gpu_kernels, gemv_with_norm_prologue_and_swiglu_matches_reference) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("gemv_swiglu");
  // One sequence normalises from registers up to k = 4,096 (one or two
  // groups of eight a thread, the second partial at 2,056) and through
  // shared memory beyond (4,104, 8,192), as do larger batches.
  std::vector<gemv_case> cases = {{2 * 192, 64, 1},   {2 * 8192, 2048, 2}, {2 * 1000, 4096, 4},
                                  {2 * 24, 64, 3},    {2 * 1000, 4096, 1}, {2 * 300, 2056, 1},
                                  {2 * 100, 4104, 1}, {2 * 256, 8192, 1}};
  for (const auto& c : cases) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " k " + std::to_string(c.k) + " m "
                 + std::to_string(c.m));
    auto w = test::random_floats(rng, size_t(c.n) * c.k, -0.05f, 0.05f);
    auto wb = test::to_bf16(w);
    auto x = test::random_floats(rng, size_t(c.m) * c.k, -2, 2);
    auto g = test::random_floats(rng, size_t(c.k), 0.8f, 1.2f);
    auto gb = test::to_bf16(g);
    auto d_w = test::upload_bf16(w);
    auto d_g = test::upload_bf16(g);
    dev_array<float> d_x(x);
    // Reference: norm in fp32, rounded to bf16 (what the GEMM sees), linear, SwiGLU.
    std::vector<float> xn(x.size());
    ref::rms_norm(x.data(), bf16_view(gb, {c.k}), 1e-5, c.m, c.k, xn.data());
    for (auto& v : xn)
      v = test::round_bf16(v);
    const int32_t inter = c.n / 2;
    const auto ref = test::reference_swiglu(wb, c.n, c.k, xn, c.m);
    for (int gen : {2, 1}) {
      test::kernel_generation_scope scope(gen);
      SCOPED_TRACE("generation " + std::to_string(gen));
      dev_array<bf16> d_act(size_t(c.m) * inter);
      gpu::gemv_args a;
      a.w = d_w.get();
      a.n = c.n;
      a.k = c.k;
      a.m = c.m;
      a.residual_in = d_x.get();
      a.norm_weight = d_g.get();
      a.eps = 1e-5f;
      a.out_bf16 = d_act.get();
      gpu::launch_gemv(gpu::gemv_epilogue::swiglu, a, nullptr);
      test::sync_check();
      EXPECT_LT(test::relative_error(test::download_bf16(d_act), ref), 5e-3);
    }
  }
}

/// One MLP block as a decode step launches it on the GEMV path: gate_up with
/// the RMSNorm prologue of `residual` and SwiGLU into `act`, then down adding
/// into `residual`.
void launch_mlp_block(const bf16* gate_up, const bf16* down, const bf16* norm, float* residual,
                      bf16* act, int32_t hidden, int32_t inter, int32_t m, float eps,
                      cudaStream_t stream) {
  gpu::launch_gemv(gpu::gemv_epilogue::swiglu,
                   {.w = gate_up, .n = 2 * inter, .k = hidden, .m = m, .residual_in = residual,
                    .norm_weight = norm, .eps = eps, .out_bf16 = act},
                   stream);
  gpu::launch_gemv(gpu::gemv_epilogue::residual_add,
                   {.w = down, .n = hidden, .k = inter, .m = m, .x = act, .out_f32 = residual},
                   stream);
}

TEST(gpu_kernels, gemv_chain_on_a_stream_reads_what_the_kernel_before_wrote) {
  // MLP blocks back to back, as a decode step runs them: gate_up with the
  // norm prologue and SwiGLU reads the residual the previous down projection
  // added into, and down reads gate_up's activations. On a stream, launched
  // directly and captured into a graph. With programmatic dependent launch
  // on (METRONOME_PDL=1, run_h200.sh's pdlon step) each GEMV issues its first
  // weight loads before it waits for the kernel before it, so a missing or
  // early wait can give a wrong residual
  // (errors of order 1; the 1e-2 bound leaves room for bf16 rounding that
  // differs from the reference's and compounds over the layers, 2-3e-3).
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("gemv_chain");
  const int32_t hidden = 2048, inter = 5632, layers = 4;
  const float eps = 1e-5f;
  struct layer {
    std::vector<uint16_t> gu_bits, down_bits, g_bits;
    dev_array<bf16> gu, down, g;
  };
  std::vector<layer> ls;
  for (int32_t l = 0; l < layers; ++l) {
    auto gu = test::random_floats(rng, size_t(2 * inter) * hidden, -0.05f, 0.05f);
    auto down = test::random_floats(rng, size_t(hidden) * inter, -0.05f, 0.05f);
    auto g = test::random_floats(rng, size_t(hidden), 0.8f, 1.2f);
    ls.push_back(layer{test::to_bf16(gu), test::to_bf16(down), test::to_bf16(g),
                       test::upload_bf16(gu), test::upload_bf16(down), test::upload_bf16(g)});
  }
  // A blocking stream, and a device synchronisation after each upload: a
  // cudaMemset or a pageable cudaMemcpy may still be running when it returns.
  cudaStream_t stream = nullptr;
  METRONOME_CUDA(cudaStreamCreate(&stream));
  for (int32_t m : {1, 2}) {
    SCOPED_TRACE("m " + std::to_string(m));
    const auto r0 = test::random_floats(rng, size_t(m) * hidden, -2, 2);
    auto want = r0;
    for (const auto& l : ls) {
      std::vector<float> xn(want.size()), y(want.size());
      ref::rms_norm(want.data(), bf16_view(l.g_bits, {hidden}), eps, m, hidden, xn.data());
      for (auto& v : xn)
        v = test::round_bf16(v);
      const auto act = test::reference_swiglu(l.gu_bits, 2 * inter, hidden, xn, m);
      ref::linear(bf16_view(l.down_bits, {hidden, inter}), nullptr, act.data(), m, y.data());
      for (size_t i = 0; i < want.size(); ++i)
        want[i] += y[i];
    }
    dev_array<float> d_r(r0);
    dev_array<bf16> d_act(size_t(m) * inter);
    METRONOME_CUDA(cudaDeviceSynchronize());
    auto chain = [&] {
      for (const auto& l : ls)
        launch_mlp_block(l.gu.get(), l.down.get(), l.g.get(), d_r.get(), d_act.get(), hidden,
                         inter, m, eps, stream);
    };
    chain();
    METRONOME_CUDA(cudaStreamSynchronize(stream));
    EXPECT_LT(test::relative_error(d_r.download(), want), 1e-2) << "launched directly";

    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    METRONOME_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    chain();
    METRONOME_CUDA(cudaStreamEndCapture(stream, &graph));
    METRONOME_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 3; ++replay) {
      SCOPED_TRACE("replay " + std::to_string(replay));
      d_act.poison();
      METRONOME_CUDA(cudaMemcpy(d_r.get(), r0.data(), r0.size() * sizeof(float),
                                cudaMemcpyHostToDevice));
      METRONOME_CUDA(cudaDeviceSynchronize());
      METRONOME_CUDA(cudaGraphLaunch(exec, stream));
      METRONOME_CUDA(cudaStreamSynchronize(stream));
      EXPECT_LT(test::relative_error(d_r.download(), want), 1e-2);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

TEST(gpu_launch, residual_adding_gemvs_wait_for_the_whole_kernel_before_unless_late_triggers) {
  // The rule of gemv.cu, seen in the graph a decode step captures: with PDL
  // on, gate_up (SwiGLU) hangs off the down projection before it by a
  // programmatic edge (it may start early), the down projection (residual
  // add) off gate_up by a full dependency; with late triggers too, every edge
  // is programmatic; with PDL off, every edge is full. Each graph's residual
  // is bit for bit the one of the same launches without a graph or PDL (the
  // GEMVs sum in a fixed order). At 4 tokens the down projection's input
  // (4 x 12,800 bf16) is over the second generation's 96 KiB and takes the
  // first generation's kernel: the rule holds for both.
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("pdl_edges");
  const int32_t hidden = 256, inter = 12800, max_m = 4;
  auto gu = test::upload_bf16(test::random_floats(rng, size_t(2 * inter) * hidden, -0.05f, 0.05f));
  auto down = test::upload_bf16(test::random_floats(rng, size_t(hidden) * inter, -0.05f, 0.05f));
  auto g = test::upload_bf16(test::random_floats(rng, size_t(hidden), 0.8f, 1.2f));
  const auto r0 = test::random_floats(rng, size_t(max_m) * hidden, -2, 2);
  dev_array<float> d_r(r0);
  dev_array<bf16> d_act(size_t(max_m) * inter);
  METRONOME_CUDA(cudaDeviceSynchronize());
  cudaStream_t stream = nullptr;
  METRONOME_CUDA(cudaStreamCreate(&stream));
  // The residual after the two layers, launched plainly, per token count.
  std::vector<float> want[max_m + 1];
  for (int32_t m : {1, max_m}) {
    const gpu::pdl_scope off(false);
    d_r.upload(r0);
    for (int layer = 0; layer < 2; ++layer)
      launch_mlp_block(gu.get(), down.get(), g.get(), d_r.get(), d_act.get(), hidden, inter, m,
                       1e-5f, stream);
    METRONOME_CUDA(cudaStreamSynchronize(stream));
    want[m] = d_r.download();
  }
  struct edge_case {
    bool pdl, late;
    int32_t m;
  };
  const edge_case cases[] = {{true, false, 1},     {false, false, 1},    {true, true, 1},
                             {true, false, max_m}, {false, false, max_m}, {true, true, max_m}};
  for (auto [pdl, late, m] : cases) {
    SCOPED_TRACE(testing::Message() << (pdl ? "PDL on" : "PDL off")
                                    << (late ? " with late triggers" : "") << ", m " << m);
    cudaGraph_t graph = nullptr;
    {
      const gpu::pdl_scope scope(pdl);
      const gpu::late_trigger_scope late_scope(late);
      METRONOME_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int layer = 0; layer < 2; ++layer)
        launch_mlp_block(gu.get(), down.get(), g.get(), d_r.get(), d_act.get(), hidden, inter, m,
                         1e-5f, stream);
      METRONOME_CUDA(cudaStreamEndCapture(stream, &graph));
    }
    size_t count = 0;
    METRONOME_CUDA(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &count));
    ASSERT_EQ(count, 3u) << "a chain of four kernels";
    std::vector<cudaGraphNode_t> from(count), to(count);
    std::vector<cudaGraphEdgeData> data(count);
    METRONOME_CUDA(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &count));
    // The chain's order: the root has no incoming edge.
    std::vector<cudaGraphNode_t> order;
    for (size_t i = 0; i < count; ++i)
      if (std::find(to.begin(), to.end(), from[i]) == to.end())
        order.push_back(from[i]);
    ASSERT_EQ(order.size(), 1u);
    std::vector<unsigned> type_into(4, 99);
    for (int step = 1; step < 4; ++step)
      for (size_t i = 0; i < count; ++i)
        if (from[i] == order.back()) {
          order.push_back(to[i]);
          type_into[size_t(step)] = data[i].type;
          break;
        }
    ASSERT_EQ(order.size(), 4u);
    const unsigned early = pdl ? unsigned(cudaGraphDependencyTypeProgrammatic)
                               : unsigned(cudaGraphDependencyTypeDefault);
    const unsigned into_down = pdl && late ? early : unsigned(cudaGraphDependencyTypeDefault);
    EXPECT_EQ(type_into[1], into_down) << "down after gate_up";
    EXPECT_EQ(type_into[2], early) << "gate_up after down";
    EXPECT_EQ(type_into[3], into_down) << "down after gate_up";
    cudaGraphExec_t exec = nullptr;
    METRONOME_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    d_r.upload(r0);
    METRONOME_CUDA(cudaGraphLaunch(exec, stream));
    METRONOME_CUDA(cudaStreamSynchronize(stream));
    EXPECT_EQ(d_r.download(), want[m]);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

TEST(gpu_launch, every_kernel_waits_for_the_kernel_before_it_then_triggers_the_next) {
  // Host only, on the sources: what launch.cuh's PDL relies on. The decode
  // attention reads what the kernels before its predecessor wrote before it
  // waits, which is safe only if every kernel calls pdl_wait() and triggers
  // its dependents after it (right after, or with late triggers at the end
  // of its work), never before: then a kernel's dependent starts only once
  // the kernel's own predecessor has finished.
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(test::env("SOURCE_DIR")) / "gpu";
  if (!fs::is_directory(dir))
    GTEST_SKIP() << "no sources at " << dir << " (set METRONOME_SOURCE_DIR)";
  int kernels = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".cu")
      continue;
    std::ifstream in(entry.path());
    std::string src((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Comments out (their braces and mentions would confuse the scan).
    std::string code;
    for (size_t i = 0; i < src.size();) {
      if (src.compare(i, 2, "//") == 0) {
        i = src.find('\n', i);
        i = i == std::string::npos ? src.size() : i;
      } else if (src.compare(i, 2, "/*") == 0) {
        i = src.find("*/", i);
        i = i == std::string::npos ? src.size() : i + 2;
      } else {
        code += src[i++];
      }
    }
    for (size_t at = code.find("__global__"); at != std::string::npos;
         at = code.find("__global__", at + 1)) {
      const size_t open = code.find('{', at);
      ASSERT_NE(open, std::string::npos);
      size_t close = open;
      for (int depth = 0; close < code.size(); ++close) {
        depth += code[close] == '{' ? 1 : code[close] == '}' ? -1 : 0;
        if (depth == 0)
          break;
      }
      std::string body;
      for (char c : code.substr(open, close - open))
        if (!std::isspace(static_cast<unsigned char>(c)))
          body += c;
      const std::string name = entry.path().filename().string() + ": kernel at offset "
                               + std::to_string(at) + " " + code.substr(at, 80);
      ++kernels;
      EXPECT_NE(body.find("pdl_wait();"), std::string::npos) << name;
      size_t triggers = 0;
      for (size_t t = body.find("pdl_trigger();"); t != std::string::npos;
           t = body.find("pdl_trigger();", t + 1)) {
        ++triggers;
        // Right after the wait, or (late triggers) later, never before it.
        const size_t wait = body.find("pdl_wait();");
        EXPECT_TRUE(wait != std::string::npos && wait < t)
          << name << ": a trigger before the wait";
      }
      EXPECT_GE(triggers, 1u) << name;
    }
  }
  EXPECT_GE(kernels, 15) << "the scan found too few kernels in " << dir;
}

/// A per-thread switch and its scope: on and off nest, the outer choice
/// returns at the end, another thread sees only the process setting.
template <class Scope>
void expect_scope_nests(bool (*active)(), bool expected_outside) {
  const bool outside = active();
  EXPECT_EQ(outside, expected_outside);
  {
    const Scope on(true);
    EXPECT_TRUE(active());
    {
      const Scope off(false);
      EXPECT_FALSE(active());
    }
    EXPECT_TRUE(active());
    bool other = !outside;
    std::thread t([&] { other = active(); });
    t.join();
    EXPECT_EQ(other, outside) << "a scope is this thread's only";
  }
  EXPECT_EQ(active(), outside);
}

TEST(gpu_launch, pdl_scope_sets_this_threads_choice_and_nests) {
  // Host logic only (no device needed): the engine captures each decode
  // graph inside a pdl_scope (and a late_trigger_scope); launches elsewhere
  // follow the process's mode (METRONOME_PDL in this binary).
  const gpu::pdl_mode mode = gpu::pdl_setting();
  expect_scope_nests<gpu::pdl_scope>(&gpu::pdl_active,
                                     mode == gpu::pdl_mode::on || mode == gpu::pdl_mode::late);
  expect_scope_nests<gpu::late_trigger_scope>(&gpu::late_triggers, mode == gpu::pdl_mode::late);
}

TEST(gpu_launch, benchmark_switches_act_only_through_their_reader) {
  // Host logic only: the GPU library reads no environment (the server must
  // not change kernels because of a stray variable); gpu_bench and gpu_tests
  // apply METRONOME_KERNELS and METRONOME_PDL through
  // bench::apply_environment_switches().
  const gpu::kernel_generations kernels = gpu::active_kernels();
  const gpu::pdl_mode mode = gpu::pdl_setting();
  const char* old_kernels = std::getenv("METRONOME_KERNELS");
  const char* old_pdl = std::getenv("METRONOME_PDL");
  const std::string saved_kernels = old_kernels ? old_kernels : "";
  const std::string saved_pdl = old_pdl ? old_pdl : "";
  const gpu::pdl_mode other = mode == gpu::pdl_mode::off ? gpu::pdl_mode::on : gpu::pdl_mode::off;
  setenv("METRONOME_KERNELS", kernels.gemv == 1 ? "gemv=2" : "gemv=1", 1);
  setenv("METRONOME_PDL", other == gpu::pdl_mode::off ? "0" : "1", 1);
  EXPECT_EQ(gpu::active_kernels().gemv, kernels.gemv);
  EXPECT_EQ(gpu::pdl_setting(), mode);
  bench::apply_environment_switches();
  EXPECT_NE(gpu::active_kernels().gemv, kernels.gemv);
  EXPECT_EQ(gpu::pdl_setting(), other);
  gpu::active_kernels() = kernels;
  gpu::set_pdl_mode(mode);
  old_kernels ? setenv("METRONOME_KERNELS", saved_kernels.c_str(), 1)
              : unsetenv("METRONOME_KERNELS");
  old_pdl ? setenv("METRONOME_PDL", saved_pdl.c_str(), 1) : unsetenv("METRONOME_PDL");
}

TEST(gpu_launch, environment_switches_parse_and_name_what_they_ignore) {
  // Host logic only: the benchmark switches' syntax; what is not understood
  // is named (on stderr), never a silent change of meaning.
  std::vector<std::string> bad;
  auto g = gpu::parse_kernel_generations("gemv=1,decode=1", &bad);
  EXPECT_EQ(g.gemv, 1);
  EXPECT_EQ(g.decode_attention, 1);
  EXPECT_EQ(g.prefill_attention, 2);
  EXPECT_EQ(g.decode_rope, 2);
  EXPECT_EQ(g.gemm_splits, 2);
  EXPECT_EQ(g.attention_warps, 0);
  EXPECT_EQ(g.gemv_int4, 2);
  EXPECT_TRUE(bad.empty());
  g = gpu::parse_kernel_generations("int4=1", &bad);
  EXPECT_EQ(g.gemv_int4, 1);
  g = gpu::parse_kernel_generations("int4=2,int4=3", &bad);
  EXPECT_EQ(g.gemv_int4, 2);
  EXPECT_EQ(bad, (std::vector<std::string>{"int4=3"}));
  bad.clear();
  g = gpu::parse_kernel_generations("awarps=2", &bad);
  EXPECT_EQ(g.attention_warps, 2);
  g = gpu::parse_kernel_generations("awarps=4,awarps=1,awarps=3,rope=4", &bad);
  EXPECT_EQ(g.attention_warps, 4);
  EXPECT_EQ(g.decode_rope, 2);
  EXPECT_EQ(bad, (std::vector<std::string>{"awarps=1", "awarps=3", "rope=4"}));
  bad.clear();
  g = gpu::parse_kernel_generations("gemv=3,splits=3,,rope,fast=1,prefill=1", &bad);
  EXPECT_EQ(g.gemv, 2);
  EXPECT_EQ(g.gemm_splits, 3);
  EXPECT_EQ(g.decode_rope, 2);
  EXPECT_EQ(g.prefill_attention, 1);
  EXPECT_EQ(bad, (std::vector<std::string>{"gemv=3", "rope", "fast=1"}));
  bad.clear();
  g = gpu::parse_kernel_generations("rope=1,splits=1,gemv=1,gemv=2", &bad);
  EXPECT_EQ(g.decode_rope, 1);
  EXPECT_EQ(g.gemm_splits, 1);
  EXPECT_EQ(g.gemv, 2) << "the last item for a key wins";
  EXPECT_EQ(g.decode_attention, 2);
  EXPECT_TRUE(bad.empty());

  const std::pair<const char*, gpu::pdl_mode> understood[] = {
    {nullptr, gpu::pdl_mode::per_graph}, {"", gpu::pdl_mode::per_graph},
    {"auto", gpu::pdl_mode::per_graph},  {"0", gpu::pdl_mode::off},
    {"off", gpu::pdl_mode::off},         {"false", gpu::pdl_mode::off},
    {"no", gpu::pdl_mode::off},          {"1", gpu::pdl_mode::on},
    {"on", gpu::pdl_mode::on},           {"true", gpu::pdl_mode::on},
    {"yes", gpu::pdl_mode::on},          {"late", gpu::pdl_mode::late}};
  for (const auto& [value, mode] : understood) {
    bool ignored = true;
    EXPECT_EQ(gpu::parse_pdl_mode(value, &ignored), mode) << (value ? value : "unset");
    EXPECT_FALSE(ignored) << (value ? value : "unset");
  }
  bool ignored = false;
  EXPECT_EQ(gpu::parse_pdl_mode("2", &ignored), gpu::pdl_mode::per_graph);
  EXPECT_TRUE(ignored);
}

TEST(gpu_kernels, gemv_qkv_rope_epilogue_matches_norm_linear_rope_and_cache_write) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("gemv_qkv");
  const std::vector<rope_case> cases = {
    {4, 2, 16, 16, {{0, 1}, {20, 1}, {33, 1}}, true},
    {32, 8, 64, 16, {{127, 1}}, false},
    {32, 8, 128, 16, {{15, 1}, {16, 1}, {4000, 1}, {1, 1}}, true},
    {4, 1, 16, 8, {{7, 1}, {8, 1}}, false},
    {32, 8, 128, 16, {{100, 1}}, false},
    {28, 4, 128, 16, {{31, 1}, {32, 1}}, true},
  };
  for (const auto& c : cases) {
    for (int gen : {2, 1}) {
      test::kernel_generation_scope scope(gen);
      SCOPED_TRACE("generation " + std::to_string(gen));
      SCOPED_TRACE("heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " d "
                   + std::to_string(c.head_dim));
      test::paged_kv kv(rng, c.kv_heads, c.head_dim, c.page_size, c.seqs, 1, false);
      const int32_t m = kv.num_tokens();
      const int32_t width = (c.heads + 2 * c.kv_heads) * c.head_dim;
      const int32_t hidden = c.heads * c.head_dim;
      auto w = test::random_floats(rng, size_t(width) * hidden, -0.05f, 0.05f);
      auto wb = test::to_bf16(w);
      auto x = test::random_floats(rng, size_t(m) * hidden, -2, 2);
      auto g = test::random_floats(rng, size_t(hidden), 0.8f, 1.2f);
      auto gb = test::to_bf16(g);
      auto bias = test::random_floats(rng, size_t(width), -0.5f, 0.5f);
      auto biasb = test::from_bf16(test::to_bf16(bias));
      const auto inv = test::rope_inv_freq(c.head_dim);
      auto d_w = test::upload_bf16(w);
      auto d_g = test::upload_bf16(g);
      auto d_bias = test::upload_bf16(bias);
      dev_array<float> d_x(x), d_inv(inv);
      dev_array<bf16> d_q(size_t(m) * hidden);
      gpu::gemv_args a;
      a.w = d_w.get();
      a.n = width;
      a.k = hidden;
      a.m = m;
      a.bias = c.bias ? d_bias.get() : nullptr;
      a.residual_in = d_x.get();
      a.norm_weight = d_g.get();
      a.eps = 1e-5f;
      a.out_bf16 = d_q.get();
      a.inv_freq = d_inv.get();
      a.batch = kv.batch();
      a.kv = kv.view();
      a.num_heads = c.heads;
      gpu::launch_gemv(gpu::gemv_epilogue::qkv_rope, a, nullptr);
      test::sync_check();
      auto got_q = test::download_bf16(d_q);
      kv.download();

      std::vector<float> xn(x.size());
      ref::rms_norm(x.data(), bf16_view(gb, {hidden}), 1e-5, m, hidden, xn.data());
      for (auto& v : xn)
        v = test::round_bf16(v);
      std::vector<float> y(size_t(m) * width);
      ref::linear(bf16_view(wb, {width, hidden}), nullptr, xn.data(), m, y.data());
      test::expect_qkv_written(y, width, c.bias ? &biasb : nullptr, inv, c, got_q, kv);
    }
  }
}

} // namespace
} // namespace metronome
