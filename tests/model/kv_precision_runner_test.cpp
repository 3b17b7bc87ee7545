// Tier 1: per-sequence KV precision in the CPU runner (model/step_plan.hpp,
// kv_precision), on a model made to overflow fp8_e5m2 (test::
// overflowing_model): a sequence written in full precision computes what a
// bf16 cache would, beside sequences rounded to fp8_e5m2 in the same step
// and cache, and the runner reports per sequence what overflowed.

#include <gtest/gtest.h>

#include "model/model_runner.hpp"
#include "model/model_weights.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

std::vector<token_logprob> first_step(model_runner& runner, const std::vector<new_sequence>& seqs,
                                      uint64_t id, step_output* out = nullptr) {
  step_plan plan;
  int32_t page = 0;
  for (const auto& s : seqs) {
    plan.added.push_back(s);
    plan.chunks.push_back({s.id, int32_t(s.prompt.size()), {page++}});
  }
  auto o = runner.execute(plan);
  if (out)
    *out = o;
  for (const auto& t : o.tokens)
    if (t.id == id)
      return t.logprobs;
  ADD_FAILURE() << "no token for " << id;
  return {};
}

new_sequence sequence(uint64_t id, std::vector<int32_t> prompt, kv_precision p) {
  sampling_params greedy;
  greedy.temperature = 0;
  greedy.logprobs = 5;
  new_sequence s{id, std::move(prompt), greedy, 0};
  s.precision = p;
  return s;
}

TEST(kv_precision_runner, full_precision_sequences_match_bf16_beside_rounded_ones) {
  auto model = model_folder::open(test::overflowing_model());
  const engine_limits limits{.page_size = 16, .kv_cache_tokens = 8 * 16};
  const std::vector<int32_t> overflowing = {100, test::overflow_token, 200, 300, 400};
  const std::vector<int32_t> plain = {100, 200, 300, 400, 500};

  auto e5m2 = make_cpu_runner(model, limits, kv_cache_dtype_kind::fp8_e5m2);
  step_output out;
  const auto got = first_step(*e5m2,
                              {sequence(1, overflowing, kv_precision::configured),
                               sequence(2, overflowing, kv_precision::full),
                               sequence(3, plain, kv_precision::configured)},
                              2, &out);
  // Only sequence 1 overflowed: the full-precision one with the same
  // tokens was not rounded, the plain one stayed within its range.
  ASSERT_EQ(out.kv_overflows.size(), 1u);
  EXPECT_EQ(out.kv_overflows[0].id, 1u);
  EXPECT_GT(out.kv_overflows[0].saturated, 0);
  EXPECT_EQ(out.kv_overflows[0].non_finite, 0);

  auto bf16 = make_cpu_runner(model, limits, kv_cache_dtype_kind::bf16);
  const auto want = first_step(*bf16, {sequence(2, overflowing, kv_precision::configured)}, 2);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].token, want[i].token) << i;
    EXPECT_EQ(got[i].logprob, want[i].logprob) << i; // bit-identical: batch-invariant engine
  }
  // The saturated sequence computes something else: the fault matters.
  auto e5m2_alone = make_cpu_runner(model, limits, kv_cache_dtype_kind::fp8_e5m2);
  const auto saturated
    = first_step(*e5m2_alone, {sequence(1, overflowing, kv_precision::configured)}, 1);
  ASSERT_FALSE(saturated.empty());
  EXPECT_NE(saturated[0].logprob, want[0].logprob);
}

TEST(kv_precision_runner, a_bf16_cache_counts_nothing) {
  auto model = model_folder::open(test::overflowing_model());
  auto bf16 = make_cpu_runner(model, {.page_size = 16, .kv_cache_tokens = 8 * 16});
  step_output out;
  first_step(*bf16, {sequence(1, {100, test::overflow_token, 200}, kv_precision::configured)}, 1,
             &out);
  EXPECT_TRUE(out.kv_overflows.empty());
}

} // namespace
} // namespace metronome
