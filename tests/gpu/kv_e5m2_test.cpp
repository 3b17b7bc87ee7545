// The fp8_e5m2 KV cache on the GPU (gpu/kv_e5m2.cuh): e5m2 bytes with a
// power-of-two scale per window of 256 positions of a sequence, fixed from
// the window's first row and the three windows before it, against the CPU
// engine's reference of the format (cpu_engine::set_kv_dtype), and its
// overflow counts against the CPU runner's on a model made to overflow.

#include <cmath>
#include <cstdio>
#include <random>
#include <set>

#include "gpu/kernels.hpp"
#include "model/cpu_ops.hpp"
#include "model/dtype.hpp"

#include "model/model_runner.hpp"
#include "model/model_weights.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/runner_support.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

using namespace ::metronome::test;

// Every decode path, graphs and eager, prefix sharing included: short
// prompts, so every row lies in its sequence's first window.
TEST(gpu_kv_e5m2, every_decode_path_follows_the_cpu_engine) {
  METRONOME_REQUIRE_GPU();
  for (const std::string preset : {"tiny-llama3", "tiny-qwen2"}) {
    auto model = model_folder::open(tiny_model(preset, 11));
    expect_every_decode_path_follows_the_cpu_engine(model, preset + " fp8_e5m2 KV",
                                                    kv_cache_dtype_kind::fp8_e5m2);
  }
}

TEST(gpu_kv_e5m2, every_decode_path_follows_the_cpu_engine_at_head_dim_128) {
  METRONOME_REQUIRE_GPU();
  expect_every_decode_path_follows_the_cpu_engine(
    head_dim_128_model(), "tiny-llama3, head dim 128, fp8_e5m2 KV", kv_cache_dtype_kind::fp8_e5m2);
}

/// `n` tokens below `vocab` from a fixed stream (seed `seed`).
std::vector<int32_t> tokens(int32_t n, int32_t vocab, uint32_t seed) {
  std::vector<int32_t> out;
  uint32_t x = seed * 2654435761u + 1;
  for (int32_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out.push_back(int32_t((x >> 8) % uint32_t(vocab)));
  }
  return out;
}

// Windows: prompts whose chunks hold several window starts (a window's
// history then lies partly in the chunk itself: e5m2_window_scales_kernel),
// chunks that start mid-window, and decodes that cross a window start (the
// history read back from the cache's bytes), on the GEMV path and on cuBLAS
// (the fused-RoPE attention writes there), graphs and eager.
TEST(gpu_kv_e5m2, window_scales_across_chunks_and_decodes_follow_the_cpu_engine) {
  METRONOME_REQUIRE_GPU();
  for (const bool wide : {false, true}) {
    auto model = wide ? head_dim_128_model() : model_folder::open(tiny_model("tiny-llama3", 11));
    const int32_t vocab = model->config.vocab_size;
    // 250: its decodes cross 256; 700: chunks across windows 0-2; 1030:
    // windows 0-4, the last start (1024) decoded after a chunk ends at 1030.
    const std::vector<std::vector<int32_t>> prompts = {
      tokens(250, vocab, 1), tokens(700, vocab, 2), tokens(1030, vocab, 3)};
    for (const std::string path : {"gemv", "cublas"}) {
      for (const int32_t chunk : {512, 100}) {
        auto o = small_runner_options();
        o.limits.max_batch_size = 8;
        o.limits.kv_cache_tokens = 8192;
        o.limits.max_num_batched_tokens = 1536; // three chunks of 512
        o.small_batch_path = path;
        o.kv_cache_dtype = kv_cache_dtype_kind::fp8_e5m2;
        auto gpu = make_cuda_runner(model, o);
        for (const bool graphs : {true, false}) {
          ASSERT_TRUE(set_cuda_graphs(*gpu, graphs));
          const auto got = generate(*gpu, prompts, 12, chunk, false);
          ASSERT_EQ(got.size(), prompts.size());
          int32_t exact = 0, steps = 0;
          for (size_t i = 0; i < prompts.size(); ++i) {
            const std::string what = std::string(wide ? "head dim 128" : "tiny-llama3") + " "
                                     + path + " chunk " + std::to_string(chunk)
                                     + (graphs ? "" : " eager") + " prompt of "
                                     + std::to_string(prompts[i].size());
            EXPECT_EQ(got[i].size(), 12u) << what;
            exact += expect_greedy_matches_cpu(model, prompts[i], got[i], what,
                                               kv_cache_dtype_kind::fp8_e5m2);
            steps += int32_t(got[i].size());
          }
          EXPECT_GE(exact, steps * 8 / 10) << path << " chunk " << chunk;
        }
      }
    }
  }
}

/// The step inputs of one sequence in slot 0 computing positions [from, to).
class chunk_batch {
public:
  chunk_batch(int32_t from, int32_t to)
    : pos_(positions(from, to)), seq_(std::vector<int32_t>(size_t(to - from), 0)),
      slot_(std::vector<int32_t>{0}), q_start_(std::vector<int32_t>{0, to - from}),
      len_(std::vector<int32_t>{to}), tokens_(to - from) {
  }

  gpu::batch_view view() const {
    gpu::batch_view b;
    b.num_tokens = tokens_;
    b.num_seqs = 1;
    b.positions = pos_.get();
    b.token_seq = seq_.get();
    b.seq_slot = slot_.get();
    b.seq_q_start = q_start_.get();
    b.seq_len = len_.get();
    return b;
  }

private:
  static std::vector<int32_t> positions(int32_t from, int32_t to) {
    std::vector<int32_t> p;
    for (int32_t i = from; i < to; ++i)
      p.push_back(i);
    return p;
  }

  dev_array<int32_t> pos_, seq_, slot_, q_start_, len_;
  int32_t tokens_;
};

// The writers against the format's rule computed here from the same inputs
// (model/dtype.hpp): one sequence on scattered pages, written by the prompt
// writer (launch_rope_kv_write: e5m2_row_max_kernel,
// e5m2_window_scales_kernel, rope_kv_write8_kernel) in three calls, [0, 300)
// (window 256's history inside the chunk), [300, 800) (windows 512 and 768:
// history partly cached, partly in the chunk) and [800, 1024), then position
// 1024 by the decode attention's staged writer (store_row_e5m2: a window
// start, its history read back from the cache's bytes). Window 0's values
// are 64 times the others', so later windows' scales depend on their
// history. Every row's scale is the rule's exactly, and so are its bytes
// (the prompt writer's rotation uses sincosf as this test does); the values
// past the range are counted.
TEST(gpu_kv_e5m2, the_writers_fix_window_scales_as_the_rule_does) {
  METRONOME_REQUIRE_GPU();
  constexpr int32_t heads = 2, kvh = 2, d = 64, ps = 16, pages = 80, total = 1025;
  const int32_t width = (heads + 2 * kvh) * d;
  std::mt19937_64 rng(7);
  // The raw projection of every position (bf16), window 0's 64x larger.
  std::vector<float> raw = random_floats(rng, size_t(total) * width, -2, 2);
  for (int32_t t = 0; t < kv_e5m2_window; ++t)
    for (int32_t c = 0; c < width; ++c)
      raw[size_t(t) * width + c] *= 64.0f;
  raw[size_t(5) * width + (heads + kvh) * d + 3] = 1e9f; // a value of row 5 past the range
  for (auto& x : raw)
    x = round_bf16(x);
  std::vector<float> inv_freq(d / 2);
  for (int32_t i = 0; i < d / 2; ++i)
    inv_freq[size_t(i)] = 1.0f / std::pow(10000.0f, float(2 * i) / float(d));
  // Each position's rotated k and its v, fp32: [pos][2][kvh][d].
  std::vector<float> kv_rows(size_t(total) * 2 * kvh * d);
  for (int32_t pos = 0; pos < total; ++pos)
    for (int32_t which = 0; which < 2; ++which)
      for (int32_t h = 0; h < kvh; ++h) {
        const float* src = raw.data() + size_t(pos) * width + (heads + which * kvh + h) * d;
        float* x = kv_rows.data() + ((size_t(pos) * 2 + which) * kvh + h) * d;
        for (int32_t i = 0; i < d / 2; ++i) {
          float a = src[i], c = src[i + d / 2];
          if (which == 0) {
            float sn, cs;
            sincosf(float(pos) * inv_freq[size_t(i)], &sn, &cs);
            const float ra = a * cs - c * sn, rc = c * cs + a * sn;
            a = ra;
            c = rc;
          }
          x[i] = a;
          x[i + d / 2] = c;
        }
      }
  // Pages in a scattered order; slot 0's table.
  std::vector<int32_t> table(pages);
  for (int32_t i = 0; i < pages; ++i)
    table[size_t(i)] = (i * 37 + 11) % pages;
  const size_t rows = size_t(pages) * kvh * ps;
  dev_array<uint8_t> k8(rows * d), v8(rows * d);
  dev_array<float> ks(rows), vs(rows);
  dev_array<int32_t> d_table(table);
  dev_array<float> d_inv(inv_freq);
  dev_array<uint32_t> overflow(std::vector<uint32_t>(2, 0));
  dev_array<float> rows_max(size_t(total) * kvh * 4);
  gpu::kv_view kv;
  kv.k8 = k8.get();
  kv.v8 = v8.get();
  kv.k_scale = ks.get();
  kv.v_scale = vs.get();
  kv.e5m2 = true;
  kv.overflow = overflow.get();
  kv.e5m2_rows = rows_max.get();
  kv.page_table = d_table.get();
  kv.page_table_stride = pages;
  kv.page_size = ps;
  kv.kv_heads = kvh;
  kv.head_dim = d;
  for (const auto& [from, to] : std::vector<std::pair<int32_t, int32_t>>{
         {0, 300}, {300, 800}, {800, 1024}}) {
    const int32_t n = to - from;
    std::vector<float> chunk(raw.begin() + int64_t(from) * width, raw.begin() + int64_t(to) * width);
    auto d_qkv = upload_bf16(chunk);
    const chunk_batch batch(from, to);
    dev_array<gpu::bf16> q_out(size_t(n) * heads * d);
    gpu::launch_rope_kv_write(d_qkv.get(), nullptr, d_inv.get(), batch.view(), kv, heads,
                              q_out.get(), nullptr);
    sync_check();
  }
  {
    // Position 1024 through the decode attention, from the stage.
    constexpr int32_t pos = total - 1;
    std::vector<float> stage(kv_rows.begin() + int64_t(pos) * 2 * kvh * d, kv_rows.end());
    dev_array<float> d_stage(stage);
    auto d_q = upload_bf16(random_floats(rng, size_t(heads) * d, -1, 1));
    const chunk_batch batch(pos, total);
    gpu::kv_view staged = kv;
    staged.stage = d_stage.get();
    const gpu::attention_shape sh{heads, kvh, d, 0, 1.0f / std::sqrt(float(d))};
    dev_array<gpu::bf16> out(size_t(heads) * d);
    gpu::launch_decode_attention(sh, d_q.get(), staged, batch.view(), 1, 4, nullptr, nullptr,
                                 nullptr, out.get(), nullptr);
    sync_check();
  }
  const auto got_k8 = k8.download(), got_v8 = v8.download();
  const auto got_ks = ks.download(), got_vs = vs.download();
  const auto counts = overflow.download();

  // The rule, position by position: rotated k and v in fp32, each window's
  // scale from its first row and the stored values of the 3 windows before.
  int64_t byte_mismatches = 0, saturated = 0, non_finite = 0;
  std::vector<float> scale(2 * kvh, 1.0f), window_max(size_t(total / kv_e5m2_window + 1) * 2 * kvh, 0.0f);
  for (int32_t pos = 0; pos < total; ++pos) {
    const int32_t w = pos / kv_e5m2_window;
    for (int32_t which = 0; which < 2; ++which)
      for (int32_t h = 0; h < kvh; ++h) {
        const float* xr = kv_rows.data() + ((size_t(pos) * 2 + which) * kvh + h) * d;
        const std::vector<float> x(xr, xr + d);
        float& s = scale[size_t(which * kvh + h)];
        if (pos % kv_e5m2_window == 0) {
          float reference = 0.0f;
          for (float v : x)
            if (std::isfinite(v))
              reference = std::max(reference, std::fabs(v));
          for (int32_t k = 1; k <= kv_e5m2_history && w - k >= 0; ++k)
            reference = std::max(reference, window_max[size_t((w - k) * 2 * kvh + which * kvh + h)]);
          s = e5m2_window_scale(reference);
        }
        const int64_t r = (int64_t(table[size_t(pos / ps)]) * kvh + h) * ps + pos % ps;
        ASSERT_EQ((which ? got_vs : got_ks)[size_t(r)], s)
          << (which ? "v" : "k") << " scale of position " << pos << " head " << h;
        kv_overflow_count count;
        std::vector<float> rounded = x;
        ref::round_to_e5m2(rounded.data(), d, s, count);
        saturated += count.saturated;
        non_finite += count.non_finite;
        for (int32_t e = 0; e < d; ++e) {
          const uint8_t want = f32_to_e5m2(x[size_t(e)] / s);
          const uint8_t byte = (which ? got_v8 : got_k8)[size_t(r) * d + e];
          if (byte != want) {
            ++byte_mismatches;
            ASSERT_LE(std::abs(int(byte & 0x7f) - int(want & 0x7f)), 1)
              << (which ? "v" : "k") << " of position " << pos << " head " << h;
          }
          float& m = window_max[size_t(w * 2 * kvh + which * kvh + h)];
          const float v = rounded[size_t(e)]; // as the rule stores it
          if (std::isfinite(v))
            m = std::max(m, std::fabs(v));
        }
      }
  }
  EXPECT_EQ(byte_mismatches, 0) << "bytes one code off the rule";
  EXPECT_EQ(saturated, 1) << "row 5's 1e9";
  EXPECT_EQ(int64_t(counts[0]), saturated);
  EXPECT_EQ(int64_t(counts[1]), non_finite);
}

/// One step that computes each prompt whole, on `runner`; its output.
step_output prompts_step(model_runner& runner, const std::vector<std::vector<int32_t>>& prompts) {
  step_plan plan;
  plan.step = 1;
  int32_t page = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const uint64_t id = i + 1;
    plan.added.push_back({id, prompts[i], greedy(), 0});
    scheduled_chunk c{id, int32_t(prompts[i].size()), {}};
    for (int32_t p = 0; p * runner.page_size() < int32_t(prompts[i].size()); ++p)
      c.new_pages.push_back(page++);
    plan.chunks.push_back(c);
  }
  return runner.execute(plan);
}

// Fault injection (test::overflowing_model): overflow_token's values are
// ~1e5 times the window's first row's, mid-window. The GPU counts what
// saturated for that sequence only, as the CPU runner does, in a prompt
// chunk and in one-token steps; a plan asking for full-precision pages is refused
// (the CUDA runner keeps none beside fp8 ones).
TEST(gpu_kv_e5m2, values_past_a_window_are_counted_for_their_sequence) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(overflowing_model());
  auto o = small_runner_options();
  o.kv_cache_dtype = kv_cache_dtype_kind::fp8_e5m2;
  auto gpu = make_cuda_runner(model, o);
  auto cpu = make_cpu_runner(model, o.limits, kv_cache_dtype_kind::fp8_e5m2);
  const std::vector<std::vector<int32_t>> prompts = {{100, 200, 300, 400, 500},
                                                     {100, overflow_token, 200, 300, 400},
                                                     {7, 8, 9}};
  const auto g = prompts_step(*gpu, prompts);
  const auto c = prompts_step(*cpu, prompts);
  auto ids = [](const step_output& out) {
    std::set<uint64_t> s;
    for (const auto& o : out.kv_overflows)
      s.insert(o.id);
    return s;
  };
  EXPECT_EQ(ids(c), std::set<uint64_t>{2}) << "the fault as the reference sees it";
  EXPECT_EQ(ids(g), ids(c));
  for (const auto& o : g.kv_overflows)
    for (const auto& r : c.kv_overflows)
      if (o.id == r.id) {
        std::printf("[ metric   ] sequence %llu: saturated %lld (CPU %lld), not finite %lld "
                    "(CPU %lld)\n",
                    static_cast<unsigned long long>(o.id), static_cast<long long>(o.saturated),
                    static_cast<long long>(r.saturated), static_cast<long long>(o.non_finite),
                    static_cast<long long>(r.non_finite));
        EXPECT_GT(o.saturated + o.non_finite, 0);
        // The GPU's bf16 activations and the CPU's fp32 ones may put a
        // value on either side of a window's range, not many.
        EXPECT_NEAR(double(o.saturated), double(r.saturated), 2.0 + 0.1 * double(r.saturated));
      }

  // One token a step (the last one a decode step: the GEMV path's staged
  // writer; the others the fused-RoPE attention's): counted in the step that
  // writes overflow_token's values, and only there.
  const std::vector<int32_t> prompt = {100, 200, overflow_token, 300};
  std::vector<bool> gpu_steps, cpu_steps;
  for (size_t t = 0; t < prompt.size(); ++t) {
    step_plan p;
    p.step = 10 + t;
    if (t == 0)
      p.added.push_back({5, prompt, greedy(), 0});
    p.chunks.push_back({5, 1, t == 0 ? std::vector<int32_t>{60} : std::vector<int32_t>{}});
    gpu_steps.push_back(!gpu->execute(p).kv_overflows.empty());
    cpu_steps.push_back(!cpu->execute(p).kv_overflows.empty());
  }
  EXPECT_EQ(cpu_steps, (std::vector<bool>{false, false, true, false}));
  EXPECT_EQ(gpu_steps, cpu_steps);

  step_plan full;
  full.step = 3;
  new_sequence n{9, {1, 2, 3}, greedy(), 0};
  n.precision = kv_precision::full;
  full.added.push_back(n);
  full.chunks.push_back({9, 3, {70}});
  EXPECT_THROW(gpu->execute(full), plan_error);
}

} // namespace
} // namespace metronome
