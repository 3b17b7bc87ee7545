// The step-time model and its estimator: the model's parts, the largest
// prompt chunk within a time limit, and learning a device's scale from the
// steps it measures.

#include <gtest/gtest.h>

#include <random>

#include "sched/step_cost.hpp"

namespace metronome {
namespace {

step_shape decodes(int32_t n, int64_t context) {
  step_shape s;
  for (int32_t i = 0; i < n; ++i)
    s.add_chunk(context, 1, true);
  return s;
}

TEST(step_cost, parts_add_up_and_the_mixed_terms_need_a_prompt) {
  step_cost c;
  c.per_mixed_kv_token_ms = 1e-4;
  c.per_prompt_step_ms = 0.5;
  auto s = decodes(4, 99); // 4 x 100 keys
  EXPECT_EQ(s.decode_kv_tokens, 400);
  EXPECT_DOUBLE_EQ(c.decode_ms(s), c.base_ms + 4 * c.per_decode_seq_ms + 400 * c.per_kv_token_ms);
  EXPECT_EQ(c.prefill_ms(s), 0.0);
  s.add_chunk(100, 10, false); // 10 queries over 100 + 1..10 keys
  EXPECT_DOUBLE_EQ(s.prefill_attention_pairs, 10 * 100 + 55);
  EXPECT_DOUBLE_EQ(c.prefill_ms(s), 10 * c.per_prefill_token_ms + 1055 * c.per_prefill_attention_pair_ms
                                      + 400 * c.per_mixed_kv_token_ms + 0.5);
  EXPECT_DOUBLE_EQ(c.step_ms(s), c.decode_ms(s) + c.prefill_ms(s));
}

TEST(step_cost, prefill_tokens_within_is_the_largest_chunk_that_fits) {
  step_time_estimator est;
  const auto s = decodes(32, 700);
  const double decode = est.predict_decode_ms(s);
  for (double factor : {1.01, 1.2, 1.5, 2.0, 4.0})
    for (int64_t context : {0, 500, 4000}) {
      const double limit = factor * decode;
      const int32_t n = est.prefill_tokens_within(s, context, 8192, limit);
      auto with = [&](int32_t k) {
        step_shape t = s;
        t.add_chunk(context, k, false);
        return est.predict_ms(t);
      };
      if (n > 0)
        EXPECT_LE(with(n), limit) << factor << " " << context;
      if (n < 8192)
        EXPECT_GT(with(n + 1), limit) << factor << " " << context;
    }
  EXPECT_EQ(est.prefill_tokens_within(s, 0, 8192, decode * 0.5), 0) << "nothing fits";
  EXPECT_EQ(est.prefill_tokens_within(s, 0, 100, 1e9), 100) << "capped by the request";
}

TEST(step_cost, estimator_learns_the_devices_scale_from_noisy_steps) {
  // The device runs decodes 3x and prompts 0.5x slower/faster than the
  // prior says, with 10% noise: the factors converge near them.
  step_time_estimator est;
  const step_cost prior = est.prior();
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> noise(0.9, 1.1);
  std::uniform_int_distribution<int32_t> batch(1, 64), prompt(16, 2048);
  for (int i = 0; i < 2000; ++i) {
    auto s = decodes(batch(rng), 500);
    if (i % 3 == 0)
      s.add_chunk(0, prompt(rng), false);
    est.observe(s, (3.0 * prior.decode_ms(s) + 0.5 * prior.prefill_ms(s)) * noise(rng));
  }
  EXPECT_NEAR(est.decode_scale(), 3.0, 0.3);
  EXPECT_NEAR(est.prefill_scale(), 0.5, 0.1);
  EXPECT_EQ(est.observed(), 2000);
  // One stall moves a factor by at most a bounded step.
  const double before = est.decode_scale();
  est.observe(decodes(8, 500), 1e6);
  EXPECT_LT(est.decode_scale(), before * 1.2);
  est.observe(decodes(8, 500), -1.0); // not a time: ignored
  est.observe(decodes(8, 500), std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(est.observed(), 2001);
  est.reset(prior);
  EXPECT_EQ(est.decode_scale(), 1.0);
  EXPECT_EQ(est.observed(), 0);
}

} // namespace
} // namespace metronome
