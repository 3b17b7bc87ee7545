// The step-time cost model: its formula, the shipped model file, parse
// errors, and a lone request's unloaded latency.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "sim/cost_model.hpp"
#include "tests/test_env.hpp"

namespace metronome::sim {
namespace {

cost_model simple() {
  cost_model m;
  m.step.base_ms = 4;
  m.step.per_decode_seq_ms = 0.5;
  m.step.per_kv_token_ms = 0.01;
  m.step.per_prefill_token_ms = 0.1;
  m.step.per_prefill_attention_pair_ms = 0.001;
  m.step.per_mixed_kv_token_ms = 0;
  m.step.per_prompt_step_ms = 0;
  return m;
}

TEST(cost_model, a_step_costs_the_sum_of_its_terms) {
  step_shape s;
  s.add_chunk(10, 4, false); // prompt tokens 10..13: 4 x (10 + 2.5) pairs
  s.add_chunk(99, 1, true);  // a decode reading 100 tokens
  s.add_chunk(49, 1, true);  // and 50
  EXPECT_EQ(s.prefill_tokens, 4);
  EXPECT_DOUBLE_EQ(s.prefill_attention_pairs, 50.0);
  EXPECT_EQ(s.decode_seqs, 2);
  EXPECT_EQ(s.decode_kv_tokens, 150);
  EXPECT_DOUBLE_EQ(simple().step_ms(s), 4 + 2 * 0.5 + 150 * 0.01 + 4 * 0.1 + 50 * 0.001);
}

TEST(cost_model, the_prompt_step_term_is_paid_once_by_a_step_with_a_prompt) {
  auto m = simple();
  m.step.per_prompt_step_ms = 0.75;
  step_shape decode_only;
  decode_only.add_chunk(99, 1, true);
  EXPECT_DOUBLE_EQ(m.step_ms(decode_only), simple().step_ms(decode_only));
  step_shape mixed = decode_only;
  mixed.add_chunk(0, 8, false);
  mixed.add_chunk(0, 8, false); // a second chunk pays no second fixed cost
  EXPECT_DOUBLE_EQ(m.step_ms(mixed), simple().step_ms(mixed) + 0.75);
  // It survives the file format.
  const auto back = cost_model::from_json(m.to_json(), "cm.json");
  EXPECT_DOUBLE_EQ(back.step.per_prompt_step_ms, 0.75);
}

TEST(cost_model, unloaded_latency_is_chunked_prefill_then_one_decode_per_token) {
  const auto m = simple();
  // 10 prompt tokens in chunks of 4: (0,4) (4,4) (8,2); then 2 decodes.
  const double prefill = (4 + 0.1 * 4 + 0.001 * 4 * 2.5) + (4 + 0.1 * 4 + 0.001 * 4 * 6.5)
                         + (4 + 0.1 * 2 + 0.001 * 2 * 9.5);
  const double decodes = (4 + 0.5 + 0.01 * 11) + (4 + 0.5 + 0.01 * 12);
  auto u = unloaded(m, 10, 3, 4);
  EXPECT_NEAR(u.ttft_s * 1e3, prefill, 1e-9);
  EXPECT_NEAR(u.e2e_s * 1e3, prefill + decodes, 1e-9);
  EXPECT_DOUBLE_EQ(unloaded(m, 10, 1, 4).e2e_s, unloaded(m, 10, 1, 4).ttft_s);
}

TEST(cost_model, the_shipped_h200_model_loads_and_says_whether_it_is_measured) {
  auto m = cost_model::load(test::env("SOURCE_DIR") + "/sim/cost_models/h200-llama3-8b.json");
  EXPECT_EQ(m.name, "h200-llama3-8b");
  EXPECT_GT(m.step.base_ms, 1.0);
  EXPECT_LT(m.step.base_ms, 20.0);
  EXPECT_GT(m.step.per_prefill_token_ms, 0.0);
  EXPECT_GT(m.kv_cache_tokens, 100000);
  if (m.provisional) {
    EXPECT_NE(m.note.find("PROVISIONAL"), std::string::npos);
  }
  // A 2048-token prompt chunk on an 8B model: tens of milliseconds.
  step_shape s;
  s.add_chunk(0, 2048, false);
  EXPECT_GT(m.step_ms(s), 20.0);
  EXPECT_LT(m.step_ms(s), 200.0);
}

/// A committed model, by file name under sim/cost_models.
cost_model committed_model(const std::string& file) {
  return cost_model::load(test::env("SOURCE_DIR") + "/sim/cost_models/" + file);
}

/// Its decode step of 64 sequences at 1,024 keys.
double decode_64_at_1024(const cost_model& m) {
  step_shape s;
  for (int i = 0; i < 64; ++i)
    s.add_chunk(1023, 1, true);
  return m.step_ms(s);
}

// The H100's live fit (bench/results/h100-2026-12-06-live-long-prompts.md)
// names its card and puts the same decode step near what the H100 measured
// (64 sequences at 1,024-1,232 keys: 9.0 ms, h100-2026-12-06-overlap.md),
// above the H200's, whose memory is 1.4x faster.
TEST(cost_model, the_live_fitted_h100_model_loads_and_predicts_a_slower_card) {
  const auto h100 = committed_model("h100-llama3-8b-live.json");
  EXPECT_EQ(h100.name, "h100-llama3-8b-live");
  EXPECT_FALSE(h100.provisional);
  EXPECT_GT(decode_64_at_1024(h100), 8.0);
  EXPECT_LT(decode_64_at_1024(h100), 11.0);
  EXPECT_GT(decode_64_at_1024(h100),
            1.2 * decode_64_at_1024(committed_model("h200-llama3-8b-live.json")));
}

// The model fitted to live steps (tools/fit_cost_model.py --trace) predicts
// the same 8B shape within the bounds the grid's does: a decode step of 64
// sequences at 1,024 keys within 5-9 ms (the H200 measured 6.8).
TEST(cost_model, the_live_fitted_h200_model_loads_and_predicts_the_same_shape) {
  const auto live = committed_model("h200-llama3-8b-live.json");
  EXPECT_EQ(live.name, "h200-llama3-8b-live");
  EXPECT_FALSE(live.provisional);
  EXPECT_GT(decode_64_at_1024(live), 5.0);
  EXPECT_LT(decode_64_at_1024(live), 9.0);
}

TEST(cost_model, bad_documents_name_the_field) {
  auto error_of = [](const char* text) {
    try {
      cost_model::from_json(nlohmann::json::parse(text), "cm.json");
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("[]"), "cm.json: : expected a JSON object");
  EXPECT_NE(error_of("{}").find("cm.json: step_ms: missing"), std::string::npos);
  EXPECT_EQ(error_of(R"({"step_ms": {"per_prefill_token": 0.1}})"), "cm.json: step_ms.base: missing");
  EXPECT_EQ(error_of(R"({"step_ms": {"base": 4, "per_prefill_token": -1}})"),
            "cm.json: step_ms.per_prefill_token: expected a finite number >= 0, got -1");
  EXPECT_EQ(error_of(R"({"step_ms": {"base": 0, "per_prefill_token": 1}})"),
            "cm.json: step_ms.base: must be > 0 (a step that takes no time never ends)");
  EXPECT_EQ(error_of(R"({"step_ms": {"base": 1, "per_prefill_token": 1}, "kv_cache_tokens": 0})"),
            "cm.json: kv_cache_tokens: expected a positive integer, got 0");
  EXPECT_EQ(error_of(R"({"step_ms": {"base": 1, "per_prefill_token": 1}})"), "no error");
}

} // namespace
} // namespace metronome::sim
