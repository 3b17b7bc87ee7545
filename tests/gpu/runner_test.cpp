// The CUDA runner end to end on the tiny presets of all three families:
// against Hugging Face transformers (tools/golden/*.json: greedy ids and
// logits within bf16 tolerance), against the CPU runner (greedy ids for 32
// steps), batched against alone, chunked against whole prompts, graphs
// against eager launches, and its handling of bad plans.

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "model/cpu_engine.hpp"
#include "model/make_model.hpp"
#include "model/model_weights.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/runner_support.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

using namespace ::metronome::test;

using nlohmann::json;

json load_golden(const std::string& preset) {
  std::ifstream in(test::env("SOURCE_DIR") + "/tools/golden/" + preset + ".json");
  EXPECT_TRUE(in) << "no golden file for " << preset;
  return json::parse(in);
}

class gpu_runner : public ::testing::TestWithParam<std::string> {};

// logprobs on the GPU against transformers' generate() (the CPU runner's
// golden test uses the same file), eager prefill then captured decode steps,
// beside a sequence that asks for none and must sample the same tokens.
TEST_P(gpu_runner, logprobs_match_transformers) {
  METRONOME_REQUIRE_GPU();
  const auto ref = test::load_reference_logprobs(GetParam());
  auto model = model_folder::open(test::tiny_model(GetParam(), 7));
  auto runner = make_cuda_runner(model, test::small_runner_options());
  driver d(*runner, 1 << 20);
  const size_t n = ref.runs.size();
  for (size_t i = 0; i < n; ++i) {
    auto p = greedy();
    p.logprobs = ref.top;
    d.add(i, ref.runs[i].prompt, p, 0);
  }
  d.add(n, ref.runs[0].prompt, greedy(), 0); // no logprobs
  std::vector<bool> diverged(n, false);
  const double tolerance = 0.1; // bf16 weights and activations
  for (size_t s = 0; s < ref.runs[0].steps.size(); ++s) {
    auto got = d.step();
    ASSERT_EQ(got.size(), n + 1);
    EXPECT_EQ(got[n], got[0]) << "step " << s;
    EXPECT_TRUE(d.last_logprobs[n].empty()) << "step " << s;
    for (size_t i = 0; i < n; ++i) {
      if (diverged[i])
        continue;
      const auto& want = ref.runs[i].steps[s];
      const auto& lp = d.last_logprobs[i];
      test::expect_logprobs_near(want, lp, size_t(ref.top), tolerance,
                                 GetParam() + " prompt " + std::to_string(i) + " step "
                                   + std::to_string(s));
      ASSERT_FALSE(lp.empty());
      EXPECT_EQ(lp[0].token, got[i]);
      if (got[i] != want.token) {
        EXPECT_LE(want.logprob - lp[0].logprob, tolerance) << "prompt " << i << " step " << s;
        diverged[i] = true;
      }
    }
  }
}

/// Greedy decoding of the golden's prompts in one batch on the CUDA runner:
/// every step's logits within logit_tolerance of transformers' while the
/// sequence is the reference's, and each id the reference's or a near-tie.
void expect_matches_transformers(const std::shared_ptr<const model_folder>& model,
                                 const json& ref, const std::string& label) {
  auto runner = make_cuda_runner(model, test::small_runner_options());
  const auto& runs = ref["runs"];
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& r : runs)
    prompts.push_back(r["prompt"].get<std::vector<int32_t>>());
  const int32_t steps = ref["steps_per_prompt"].get<int32_t>();
  driver d(*runner, 1 << 20);
  for (size_t i = 0; i < prompts.size(); ++i)
    d.add(i, prompts[i], greedy(), 0);
  double worst = 0;
  std::vector<bool> diverged(prompts.size(), false);
  for (int32_t s = 0; s < steps; ++s) {
    auto got = d.step();
    auto logits = cuda_runner_logits(*runner, int32_t(prompts.size()));
    ASSERT_EQ(got.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (diverged[i])
        continue; // its sequence is no longer the reference's
      const auto& want = runs[i]["steps"][size_t(s)];
      std::span<const float> row(logits.data() + i * size_t(model->config.vocab_size),
                                 size_t(model->config.vocab_size));
      double err = 0;
      for (size_t j = 0; j < want["top_ids"].size(); ++j)
        err = std::max(err, std::abs(double(row[want["top_ids"][j].get<size_t>()])
                                     - want["top_logits"][j].get<double>()));
      for (size_t j = 0; j < ref["probe_ids"].size(); ++j)
        err = std::max(err, std::abs(double(row[ref["probe_ids"][j].get<size_t>()])
                                     - want["probe_logits"][j].get<double>()));
      const double scale = want["max_abs"].get<double>();
      err /= scale;
      worst = std::max(worst, err);
      EXPECT_LE(err, logit_tolerance) << label << " prompt " << i << " step " << s;
      const int32_t expected = want["argmax"].get<int32_t>();
      if (got[i] == expected)
        continue;
      // Accept only a near-tie of the reference: our token among its top
      // logits, within tie_tolerance of the best.
      double ref_logit = -INFINITY;
      for (size_t j = 0; j < want["top_ids"].size(); ++j)
        if (want["top_ids"][j].get<int32_t>() == got[i])
          ref_logit = want["top_logits"][j].get<double>();
      EXPECT_LE((want["top_logits"][0].get<double>() - ref_logit) / scale, tie_tolerance)
        << label << " prompt " << i << " step " << s << ": chose " << got[i] << ", reference "
        << expected;
      std::printf("[ note     ] prompt %zu: near-tie at step %d (%d vs reference %d)\n", i, s,
                  got[i], expected);
      diverged[i] = true;
    }
  }
  std::printf("[ metric   ] %s: largest logit error vs transformers %.2e of max |logit|\n",
              label.c_str(), worst);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(runs[i]["greedy_ids"].size(), size_t(steps));
}

TEST_P(gpu_runner, greedy_ids_and_logits_match_transformers) {
  METRONOME_REQUIRE_GPU();
  auto ref = load_golden(GetParam());
  auto model = model_folder::open(test::tiny_model(GetParam(), ref["seed"].get<uint64_t>()));
  expect_matches_transformers(model, ref, GetParam());
}

// The fp8 KV cache against transformers (its cache unrounded): the logits of
// every step within fp8_logit_tolerance of the largest logit while the
// greedy sequence is still the reference's, and not the bf16 cache's logits
// (the cache really is rounded): both runners step in lockstep.
TEST_P(gpu_runner, an_fp8_kv_cache_keeps_the_logits_near_transformers) {
  METRONOME_REQUIRE_GPU();
  auto ref = load_golden(GetParam());
  auto model = model_folder::open(test::tiny_model(GetParam(), ref["seed"].get<uint64_t>()));
  auto o8 = test::small_runner_options();
  o8.kv_cache_dtype = kv_cache_dtype_kind::fp8;
  auto fp8 = make_cuda_runner(model, o8);
  auto bf16 = make_cuda_runner(model, test::small_runner_options());
  const auto& runs = ref["runs"];
  const size_t n = runs.size(), vocab = size_t(model->config.vocab_size);
  driver d8(*fp8, 1 << 20), d16(*bf16, 1 << 20);
  for (size_t i = 0; i < n; ++i) {
    d8.add(i, runs[i]["prompt"].get<std::vector<int32_t>>(), greedy(), 0);
    d16.add(i, runs[i]["prompt"].get<std::vector<int32_t>>(), greedy(), 0);
  }
  double worst = 0, moved = 0;
  int32_t compared = 0;
  std::vector<bool> diverged(n, false);
  for (int32_t s = 0; s < ref["steps_per_prompt"].get<int32_t>(); ++s) {
    auto got8 = d8.step();
    auto got16 = d16.step();
    const auto l8 = cuda_runner_logits(*fp8, int32_t(n));
    const auto l16 = cuda_runner_logits(*bf16, int32_t(n));
    for (size_t i = 0; i < n; ++i) {
      if (diverged[i])
        continue;
      const auto& want = runs[i]["steps"][size_t(s)];
      const double scale = want["max_abs"].get<double>();
      double err = 0;
      for (size_t j = 0; j < want["top_ids"].size(); ++j)
        err = std::max(err, std::abs(double(l8[i * vocab + want["top_ids"][j].get<size_t>()])
                                     - want["top_logits"][j].get<double>()));
      worst = std::max(worst, err / scale);
      EXPECT_LE(err / scale, fp8_logit_tolerance) << "prompt " << i << " step " << s;
      for (size_t v = 0; v < vocab; ++v)
        moved = std::max(moved, std::abs(double(l8[i * vocab + v]) - l16[i * vocab + v]) / scale);
      ++compared;
      const int32_t expected = want["argmax"].get<int32_t>();
      diverged[i] = got8[i] != expected || got16[i] != expected;
    }
  }
  std::printf("[ metric   ] %s: fp8 KV cache, largest logit error vs transformers %.2e of max "
              "|logit| over %d steps; largest difference from the bf16 cache %.2e\n",
              GetParam().c_str(), worst, compared, moved);
  // At least every prompt's first step (tiny-llama3's first prompt reaches a
  // near-tie of transformers' at its second step, where the comparison ends).
  EXPECT_GE(compared, int32_t(n));
  EXPECT_GT(moved, 1e-4);
}

TEST_P(gpu_runner, greedy_ids_follow_the_cpu_engine_for_32_steps) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model(GetParam(), 11));
  auto prompts = test_prompts(model->config.vocab_size);
  auto cpu = make_cpu_runner(model, {.page_size = 16, .kv_cache_tokens = 256 * 16});
  auto gpu = make_cuda_runner(model, test::small_runner_options());
  auto want = generate(*cpu, prompts, 32, 1 << 20, false);
  auto got = generate(*gpu, prompts, 32, 1 << 20, false);
  int32_t exact = 0, total = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string what = GetParam() + " prompt " + std::to_string(i);
    exact += expect_greedy_matches_cpu(model, prompts[i], got[i], what);
    total += int32_t(got[i].size());
    expect_same_or_near_tie(model, prompts[i], want[i], got[i], what + " (CPU runner vs GPU)");
  }
  std::printf("[ metric   ] %s: %d of %d greedy steps are exactly the CPU's argmax, the rest "
              "near-ties\n",
              GetParam().c_str(), exact, total);
}

TEST_P(gpu_runner, a_mixed_batch_gives_the_same_ids_as_each_request_alone) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model(GetParam(), 11));
  auto prompts = test_prompts(model->config.vocab_size);
  auto gpu = make_cuda_runner(model, test::small_runner_options(8));
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts)
    alone.push_back(generate(*gpu, {p}, 24, 1 << 20, false)[0]);
  // Staggered arrivals (prefill next to decodes) and chunked prompts.
  auto mixed = generate(*gpu, prompts, 24, 5, true);
  for (size_t i = 0; i < prompts.size(); ++i)
    expect_same_or_near_tie(model, prompts[i], alone[i], mixed[i],
                            GetParam() + " prompt " + std::to_string(i) + " (alone vs batched)");
}

TEST_P(gpu_runner, graph_replay_and_eager_launches_give_the_same_ids) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model(GetParam(), 11));
  auto prompts = test_prompts(model->config.vocab_size);
  auto gpu = make_cuda_runner(model, test::small_runner_options());
  auto with_graphs = generate(*gpu, prompts, 16, 1 << 20, false);
  ASSERT_TRUE(set_cuda_graphs(*gpu, false));
  auto eager = generate(*gpu, prompts, 16, 1 << 20, false);
  for (size_t i = 0; i < prompts.size(); ++i)
    expect_same_or_near_tie(model, prompts[i], with_graphs[i], eager[i],
                            GetParam() + " prompt " + std::to_string(i) + " (graph vs eager)");
}

// Steps with prompt chunks beside decodes replay the mixed graphs (padded
// rows, items and sampling rows) and give what the same steps give
// uncaptured; with them off, no step replays one.
TEST_P(gpu_runner, mixed_graph_replays_give_the_ids_of_uncaptured_mixed_steps) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model(GetParam(), 11));
  auto prompts = test_prompts(model->config.vocab_size);
  for (auto p : test_prompts(model->config.vocab_size)) {
    std::reverse(p.begin(), p.end());
    prompts.push_back(p);
  }
  auto o = test::small_runner_options();
  o.limits.max_batch_size = 16;
  auto gpu = make_cuda_runner(model, o);
  auto captured = generate(*gpu, prompts, 20, 7, true);
  const int64_t replays = cuda_mixed_graph_launches(*gpu);
  EXPECT_GT(replays, 10) << "no mixed step replayed a graph";
  ASSERT_TRUE(set_mixed_graphs(*gpu, false));
  auto eager = generate(*gpu, prompts, 20, 7, true);
  EXPECT_EQ(cuda_mixed_graph_launches(*gpu), replays);
  for (size_t i = 0; i < prompts.size(); ++i) {
    expect_same_or_near_tie(model, prompts[i], captured[i], eager[i],
                            GetParam() + " prompt " + std::to_string(i) + " (mixed graph vs eager)");
    expect_greedy_matches_cpu(model, prompts[i], captured[i],
                              GetParam() + " prompt " + std::to_string(i) + " (mixed graph)");
  }
}

TEST_P(gpu_runner, every_step_reports_its_device_time_within_its_wall_time) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model(GetParam(), 11));
  auto gpu = make_cuda_runner(model, test::small_runner_options());
  driver d(*gpu, 64);
  auto prompts = test_prompts(model->config.vocab_size);
  for (size_t i = 0; i < prompts.size(); ++i)
    d.add(uint64_t(i + 1), prompts[i], greedy(), 1);
  for (int s = 0; s < 6; ++s) { // prompt steps (eager or mixed graph), then decode graphs
    d.step();
    EXPECT_GT(d.last_device_seconds, 0.0) << "step " << s;
    // The device part of a synchronous step cannot outlast the step
    // (event timing resolves about half a microsecond).
    EXPECT_LE(d.last_device_seconds, d.last_seconds + 1e-5) << "step " << s;
  }
}

TEST_P(gpu_runner, timing_graph_replays_between_steps_changes_no_running_sequence) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model(GetParam(), 11));
  auto prompts = test_prompts(model->config.vocab_size);
  const auto o = test::small_runner_options();
  auto gpu = make_cuda_runner(model, o);
  auto undisturbed = generate(*gpu, prompts, 12, 1 << 20, false);
  // Replays of the last step on its own inputs (idempotent), then on
  // padding rows (the scratch page): the live sequences' pages, slots and
  // outputs must come through untouched.
  int32_t repeated = 0, padded = 0;
  auto timed_run = generate(*gpu, prompts, 12, 1 << 20, false, greedy(), 0, [&] {
    // Five sequences decode in the graph of 8 once every prompt is in.
    const double again = cuda_graph_replay_ms(*gpu, 5, true);
    if (std::isfinite(again)) {
      EXPECT_GT(again, 0.0);
      ++repeated;
    }
    for (int32_t b : {1, 2, o.limits.max_batch_size}) {
      const double ms = cuda_graph_replay_ms(*gpu, b);
      ASSERT_TRUE(std::isfinite(ms)) << "batch " << b;
      ASSERT_GT(ms, 0.0) << "batch " << b;
      ++padded;
    }
    // The padded replays replaced the last step's inputs.
    EXPECT_TRUE(std::isnan(cuda_graph_replay_ms(*gpu, 5, true)));
  });
  EXPECT_GT(repeated, 0);
  EXPECT_GT(padded, 0);
  EXPECT_EQ(timed_run, undisturbed);
  // No graph serves a batch past the largest captured size.
  EXPECT_TRUE(std::isnan(cuda_graph_replay_ms(*gpu, o.limits.max_batch_size + 1)));
}

TEST_P(gpu_runner, every_decode_path_follows_the_cpu_engine) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model(GetParam(), 11));
  expect_every_decode_path_follows_the_cpu_engine(model, GetParam());
}

// Spatial sharing (cuda_runner_options::sm_count): two runners on
// complementary shares of the SMs (green contexts), each on its own thread,
// decode 20 sequences at the same time; each follows the CPU engine with
// grids sized to its own share.
TEST(gpu_runner_partition, two_runners_on_complementary_sm_shares_follow_the_cpu_engine) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model("tiny-llama3", 11));
  const auto prompts = twenty_prompts(model->config.vocab_size);
  std::vector<std::vector<int32_t>> got[2];
  std::string share[2];
  std::exception_ptr failed[2];
  auto run = [&](int i) {
    try {
      auto o = test::small_runner_options();
      o.limits.max_batch_size = 24;
      o.limits.kv_cache_tokens = 8192;
      o.limits.max_num_batched_tokens = 512;
      o.sm_count = 16;
      o.sm_rest = i == 1;
      o.small_batch_path = i == 0 ? "skinny" : "auto";
      auto gpu = make_cuda_runner(model, o);
      share[i] = describe_cuda_runner(*gpu);
      got[i] = generate(*gpu, prompts, 12, 1 << 20, false);
    } catch (...) {
      failed[i] = std::current_exception();
    }
  };
  std::thread first(run, 0), rest(run, 1);
  first.join();
  rest.join();
  for (int i = 0; i < 2; ++i) {
    if (failed[i])
      std::rethrow_exception(failed[i]);
  }
  EXPECT_NE(share[0].find("first 16 of "), std::string::npos) << share[0];
  EXPECT_NE(share[1].find("last "), std::string::npos) << share[1];
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(got[i].size(), prompts.size());
    int32_t exact = 0, steps = 0;
    for (size_t p = 0; p < prompts.size(); ++p) {
      EXPECT_EQ(got[i][p].size(), 12u);
      exact += expect_greedy_matches_cpu(model, prompts[p], got[i][p],
                                         share[i] + " prompt " + std::to_string(p));
      steps += int32_t(got[i][p].size());
    }
    EXPECT_GE(exact, steps * 8 / 10) << share[i];
  }
}

TEST(gpu_runner_partition, a_share_the_device_does_not_have_is_refused_by_name) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model("tiny-llama3", 11));
  auto o = test::small_runner_options();
  o.sm_count = 100000;
  try {
    make_cuda_runner(model, o);
    ADD_FAILURE() << "a share of 100000 SMs was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("100000 SMs: expected 1 to "), std::string::npos)
      << e.what();
  }
}


// Llama's attention_bias: biases on q, k, v and o, the o bias on each path
// (the GEMV's residual epilogue, a bias launch after cuBLAS's epilogue, the
// fused residual + norm kernel of the split path). No preset has it.
TEST(gpu_runner_bias, llama_attention_bias_on_every_decode_path_follows_the_cpu_engine) {
  METRONOME_REQUIRE_GPU();
  auto model = tiny_llama3_with("tiny-llama3-attention-bias", 23,
                                [](model_config& c) { c.qkv_bias = c.o_bias = true; });
  ASSERT_TRUE(model->config.o_bias);
  expect_every_decode_path_follows_the_cpu_engine(model, "tiny-llama3 + attention_bias");
}

// Head dim 128: the fused-RoPE decode attention and the GEMV's epilogues at
// that width, on every decode path, against the CPU engine.
TEST(gpu_runner_head_dim_128, every_decode_path_follows_the_cpu_engine) {
  METRONOME_REQUIRE_GPU();
  auto model = head_dim_128_model();
  ASSERT_EQ(model->config.head_dim, 128);
  expect_every_decode_path_follows_the_cpu_engine(model, "tiny-llama3, head dim 128");
}

// The fp8 KV cache (kv_cache_dtype fp8: e4m3 rows with a scale each) on
// every decode path, graphs and eager, prefill chunks included, against the
// CPU engine with its cache rounded the same way (set_kv_fp8): its choices
// are the CPU's argmax or within a near-tie of it, at head_dim 16 (the
// presets) and 128 (the 8B shape's).
TEST_P(gpu_runner, an_fp8_kv_cache_on_every_decode_path_follows_the_cpu_engine) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model(GetParam(), 11));
  expect_every_decode_path_follows_the_cpu_engine(model, GetParam() + " fp8 KV",
                                                  kv_cache_dtype_kind::fp8);
}

TEST(gpu_runner_head_dim_128, an_fp8_kv_cache_on_every_decode_path_follows_the_cpu_engine) {
  METRONOME_REQUIRE_GPU();
  auto model = head_dim_128_model();
  expect_every_decode_path_follows_the_cpu_engine(model, "tiny-llama3, head dim 128, fp8 KV",
                                                  kv_cache_dtype_kind::fp8);
}

// The fp8 cache's memory: a token's rows take head_dim + 4 bytes (the scale)
// a kv head in K and in V, against 2 x head_dim in bf16, so the same pool
// holds about twice the tokens (each layer's share rounded up to 256 bytes).
TEST(gpu_runner_plans, an_fp8_kv_cache_takes_its_bytes_a_token) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model("tiny-qwen2", 11));
  const auto& c = model->config;
  std::map<kv_cache_dtype_kind, int64_t> pool;
  for (const auto dtype : {kv_cache_dtype_kind::bf16, kv_cache_dtype_kind::fp8}) {
    const bool fp8 = dtype == kv_cache_dtype_kind::fp8;
    auto o = test::small_runner_options();
    o.kv_cache_dtype = dtype;
    auto gpu = make_cuda_runner(model, o);
    for (const auto& e : gpu->memory_plan())
      if (e.name == "kv_pool")
        pool[dtype] = e.bytes;
    // The pool has one page more than it hands out (the padding rows').
    const int64_t tokens = int64_t(gpu->num_pages() + 1) * gpu->page_size();
    const int64_t per_row = fp8 ? c.head_dim + 4 : 2 * c.head_dim;
    const int64_t layer = tokens * 2 * c.num_kv_heads * per_row;
    EXPECT_EQ(pool[dtype], c.num_layers * (fp8 ? (layer + 255) / 256 * 256 : layer))
      << to_string(dtype);
  }
  EXPECT_LT(pool[kv_cache_dtype_kind::fp8], pool[kv_cache_dtype_kind::bf16]);
}

// Pages of one token with one kv head (tiny-mistral): an odd number of rows a
// layer, whose fp8 pools would start only 8-byte aligned in every other layer
// without the 256-byte rounding, where the prefill copies 16 bytes at a
// time. Chunked prompts and decodes against the CPU engine's fp8 rounding.
TEST(gpu_runner_plans, an_fp8_kv_cache_with_pages_of_one_token_follows_the_cpu_engine) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model("tiny-mistral", 11));
  ASSERT_EQ(model->config.num_kv_heads, 1);
  auto o = test::small_runner_options(1);
  o.kv_cache_dtype = kv_cache_dtype_kind::fp8;
  auto gpu = make_cuda_runner(model, o);
  ASSERT_EQ((gpu->num_pages() + 1) % 2, 1); // odd rows a layer
  const auto prompts = test_prompts(model->config.vocab_size);
  auto got = generate(*gpu, prompts, 8, 7, false);
  for (size_t i = 0; i < prompts.size(); ++i)
    expect_greedy_matches_cpu(model, prompts[i], got[i],
                              "pages of one token, fp8, prompt " + std::to_string(i),
                              kv_cache_dtype_kind::fp8);
}

// A sequence re-admitted with earlier output (new_sequence::num_output): that
// output counts for the frequency and presence penalties, as in the CPU
// runner. The context ends in 16 copies of a token t that plain greedy
// decoding would not pick next; with both penalties at -2 (a bonus of 34 for
// t as earlier output) the first new token must be t, in both runners, and is
// not t when the same tokens are all prompt.
TEST_P(gpu_runner, a_readmitted_sequence_counts_its_earlier_output_for_the_penalties) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model(GetParam(), 11));
  const int32_t vocab = model->config.vocab_size;
  auto cpu = make_cpu_runner(model, {.page_size = 16, .kv_cache_tokens = 256 * 16});
  auto gpu = make_cuda_runner(model, test::small_runner_options());
  auto first_token = [](model_runner& r, const std::vector<int32_t>& prompt,
                        const sampling_params& p, int32_t num_output) {
    driver d(r, 1 << 20);
    d.add(0, prompt, p, 5, num_output);
    int32_t token = -1;
    for (int i = 0; i < 8 && token < 0; ++i)
      if (auto got = d.step(); got.contains(0))
        token = got[0];
    d.release_all();
    return token;
  };
  const auto base = test_prompts(vocab)[2];
  sampling_params bonus = greedy();
  bonus.frequency_penalty = -2.0f;
  bonus.presence_penalty = -2.0f;
  int32_t tried = 0;
  for (int32_t t = 1; t < vocab && tried < 3; t += 97) {
    std::vector<int32_t> prompt = base;
    prompt.insert(prompt.end(), 16, t);
    if (first_token(*gpu, prompt, greedy(), 0) == t)
      continue; // plain greedy picks t anyway: no evidence either way
    ++tried;
    SCOPED_TRACE(GetParam() + " token " + std::to_string(t));
    EXPECT_EQ(first_token(*cpu, prompt, bonus, 16), t);
    EXPECT_EQ(first_token(*gpu, prompt, bonus, 16), t);
    EXPECT_NE(first_token(*gpu, prompt, bonus, 0), t);
  }
  EXPECT_EQ(tried, 3);
}

TEST_P(gpu_runner, seeded_sampling_repeats_for_the_same_schedule_and_follows_the_seed) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model(GetParam(), 11));
  auto prompts = test_prompts(model->config.vocab_size);
  auto gpu = make_cuda_runner(model, test::small_runner_options());
  sampling_params p;
  p.temperature = 1.0f;
  p.top_p = 0.95f;
  p.top_k = 200;
  p.repetition_penalty = 1.1f;
  // Same seeds and the same batches: the same ids (sampling over near-flat
  // distributions of random models is not batch-invariant, so only the same
  // schedule is compared).
  auto a = generate(*gpu, prompts, 16, 1 << 20, true, p, 99);
  auto b = generate(*gpu, prompts, 16, 1 << 20, true, p, 99);
  auto c = generate(*gpu, prompts, 16, 1 << 20, true, p, 1000);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

INSTANTIATE_TEST_SUITE_P(presets, gpu_runner,
                         ::testing::Values("tiny-llama3", "tiny-qwen2", "tiny-mistral"),
                         [](const auto& info) {
                           auto s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

TEST(gpu_runner_plans, bad_plans_are_rejected_and_change_nothing) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model("tiny-llama3", 11));
  auto gpu = make_cuda_runner(model, test::small_runner_options());
  step_plan bad;
  bad.added.push_back({1, {1, 2, model->config.vocab_size}, greedy(), 0});
  bad.chunks.push_back({1, 3, {0}});
  EXPECT_THROW(gpu->execute(bad), plan_error);
  step_plan unknown;
  unknown.chunks.push_back({42, 1, {}});
  EXPECT_THROW(gpu->execute(unknown), plan_error);
  step_plan too_many;
  for (uint64_t i = 0; i < 9; ++i) {
    too_many.added.push_back({100 + i, {1, 2}, greedy(), 0});
    too_many.chunks.push_back({100 + i, 2, {int32_t(i)}});
  }
  EXPECT_THROW(gpu->execute(too_many), plan_error);
  // Still usable: the same ids as a fresh runner (same schedule, same path).
  auto prompts = test_prompts(model->config.vocab_size);
  auto fresh = make_cuda_runner(model, test::small_runner_options());
  EXPECT_EQ(generate(*gpu, prompts, 8, 1 << 20, false),
            generate(*fresh, prompts, 8, 1 << 20, false));
}

TEST(gpu_runner_plans, reports_its_memory_plan) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model("tiny-qwen2", 11));
  auto gpu = make_cuda_runner(model, test::small_runner_options());
  auto plan = gpu->memory_plan();
  std::map<std::string, int64_t> by;
  for (const auto& e : plan)
    by[e.name] = e.bytes;
  EXPECT_GT(by["weights"], 0);
  EXPECT_GT(by["kv_pool"], 0);
  EXPECT_GE(by["graphs"], 0);
  EXPECT_LE(by["weights"] + by["activations"] + by["kv_pool"], by["device_total"]);
  EXPECT_EQ(gpu->num_pages() * gpu->page_size(), 4096);
  EXPECT_EQ(gpu->device(), "cuda:0");
  std::printf("%s%s\n", format_memory_plan(plan).c_str(), describe_cuda_runner(*gpu).c_str());
}

// What the fp8 cache cannot serve, named from the model's shape before any
// device is touched (host arithmetic: runs without a GPU), so that the server
// refuses it at start instead of failing its executor.
TEST(gpu_runner_plans, the_kv_cache_problem_names_what_fp8_cannot_serve) {
  constexpr auto bf16 = kv_cache_dtype_kind::bf16, fp8 = kv_cache_dtype_kind::fp8;
  model_config c = *preset_config("tiny-llama3");
  EXPECT_EQ(cuda_kv_cache_problem(c, bf16), "");
  EXPECT_EQ(cuda_kv_cache_problem(c, fp8), "");
  c.head_dim = 256;
  EXPECT_EQ(cuda_kv_cache_problem(c, bf16), "");
  EXPECT_NE(cuda_kv_cache_problem(c, fp8).find("this model: head_dim 256"), std::string::npos);
  c.head_dim = 128;
  c.num_heads = 16 * c.num_kv_heads;
  EXPECT_NE(cuda_kv_cache_problem(c, fp8).find("16 a kv head"), std::string::npos);
  c.num_heads = 8 * c.num_kv_heads;
  EXPECT_EQ(cuda_kv_cache_problem(c, fp8), "");
  test::kernel_generation_scope first(1);
  EXPECT_NE(cuda_kv_cache_problem(c, fp8).find("second-generation"), std::string::npos);
}

TEST(gpu_runner_plans, no_device_count_means_skip) {
  // Always runs: cuda_device_count() answers without throwing, GPU or not.
  EXPECT_GE(cuda_device_count(), 0);
  EXPECT_EQ(parse_cuda_device("cuda:3"), 3);
  EXPECT_EQ(parse_cuda_device("cuda"), 0);
  EXPECT_EQ(parse_cuda_device("cpu"), -1);
  EXPECT_EQ(parse_cuda_device("cuda:x"), -1);
}

// -- 4-bit checkpoints (GPTQ, AWQ) -----------------------------------------------------
//
// The goldens of tools/golden/int4_goldens.tar.xz: seven tiny checkpoints
// and transformers' fp32 logits on their exactly dequantized weights.

class gpu_runner_int4 : public ::testing::TestWithParam<std::string> {};

TEST_P(gpu_runner_int4, greedy_ids_and_logits_match_transformers) {
  METRONOME_REQUIRE_GPU();
  const auto dir = test::int4_goldens();
  std::ifstream in(dir / (GetParam() + ".json"));
  ASSERT_TRUE(in) << "no golden for " << GetParam();
  const json ref = json::parse(in);
  auto model = model_folder::open(dir / GetParam());
  // Every matrix in 4 bits, except where a fused matrix's act-order parts
  // each have their own permutation (the goldens draw one a projection):
  // qkv and gate_up then stay bf16, o and down read their input permuted.
  {
    auto gpu = make_cuda_runner(model, test::small_runner_options());
    const std::string d = describe_cuda_runner(*gpu);
    const int32_t all = 4 * model->config.num_layers;
    const bool act_order = GetParam().find("actorder") != std::string::npos;
    EXPECT_NE(d.find(std::to_string(act_order ? all / 2 : all) + " of " + std::to_string(all)
                     + " matrices in 4 bits"),
              std::string::npos)
      << d;
    if (act_order) {
      EXPECT_NE(d.find("bf16 layer 0 qkv: their act-order input permutations (g_idx) differ"),
                std::string::npos)
        << d;
    }
  }
  expect_matches_transformers(model, ref, GetParam());
}

TEST_P(gpu_runner_int4, every_decode_path_follows_the_cpu_engine) {
  METRONOME_REQUIRE_GPU();
  // The CPU engine dequantizes exactly (and matches the goldens in CI); the
  // 4-bit GEMV multiplies the exact weights, the skinny GEMM and cuBLAS
  // their bf16 form.
  expect_every_decode_path_follows_the_cpu_engine(
    model_folder::open(test::int4_goldens() / GetParam()), GetParam());
}

// `--quantize int4`: a float model's projections rounded to nearest into
// AWQ's layout at load (model/rtn_quantize), the preset whose inputs hold
// whole groups of 128; every matrix runs in 4 bits.
TEST(gpu_runner_int4_at_load, every_decode_path_follows_the_cpu_engine) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(test::tiny_model("tiny-llama3-g128", 11),
                                  model_load_options{weight_quantization::int4});
  ASSERT_TRUE(model->config.quantization);
  {
    auto gpu = make_cuda_runner(model, test::small_runner_options());
    const std::string d = describe_cuda_runner(*gpu);
    const std::string all = std::to_string(4 * model->config.num_layers);
    EXPECT_NE(d.find(all + " of " + all + " matrices in 4 bits"), std::string::npos) << d;
  }
  expect_every_decode_path_follows_the_cpu_engine(model, "tiny-llama3-g128, int4 at load");
}

INSTANTIATE_TEST_SUITE_P(variants, gpu_runner_int4,
                         ::testing::ValuesIn(test::int4_golden_variants()), [](const auto& info) {
                           auto s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

} // namespace
} // namespace metronome
