// Sampling semantics (OpenAI / vLLM): greedy, seeds, temperature, top-k,
// top-p, min-p and the three penalties, checked on distributions whose
// answers are known.

#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "model/sampling.hpp"

namespace metronome {
namespace {

/// Logits whose softmax is exactly `probs`.
std::vector<float> logits_for(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs)
    out.push_back(float(std::log(p)));
  return out;
}

/// Counts of tokens over `n` draws with fresh samplers of consecutive seeds.
std::map<int32_t, int> draw(const sampling_params& p, const std::vector<float>& logits, int n) {
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) {
    sequence_sampler s(p, {}, uint64_t(i) * 7919 + 1);
    auto l = logits;
    ++counts[s.sample(l).first];
  }
  return counts;
}

TEST(sampling, temperature_zero_is_argmax_with_the_first_index_on_ties) {
  sampling_params p;
  p.temperature = 0;
  sequence_sampler s(p, {}, 1);
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f};
  auto [token, logprob] = s.sample(l);
  EXPECT_EQ(token, 1);
  EXPECT_NEAR(logprob, std::log(std::exp(2.0) / (std::exp(0.1) + 2 * std::exp(2.0) + std::exp(-1.0))), 1e-5);
}

TEST(sampling, the_same_seed_gives_the_same_tokens_and_seeds_differ) {
  sampling_params p;
  std::vector<float> l(1000, 0.0f);
  auto run = [&](uint64_t seed) {
    sequence_sampler s(p, {}, seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 50; ++i) {
      auto copy = l;
      out.push_back(s.sample(copy).first);
    }
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(sampling, temperature_one_follows_the_softmax) {
  std::vector<double> probs = {0.5, 0.25, 0.125, 0.0625, 0.0625};
  sampling_params p;
  const int n = 20000;
  auto counts = draw(p, logits_for(probs), n);
  for (size_t i = 0; i < probs.size(); ++i) {
    double expected = probs[i] * n, sd = std::sqrt(n * probs[i] * (1 - probs[i]));
    EXPECT_NEAR(counts[int32_t(i)], expected, 5 * sd) << "token " << i;
  }
}

TEST(sampling, low_temperature_sharpens_and_high_temperature_flattens) {
  std::vector<double> probs = {0.6, 0.3, 0.1};
  sampling_params cold, hot;
  cold.temperature = 0.25f;
  hot.temperature = 2.0f;
  auto c = draw(cold, logits_for(probs), 4000);
  auto h = draw(hot, logits_for(probs), 4000);
  EXPECT_GT(c[0], 3600);       // 0.6^4 / (0.6^4 + 0.3^4 + 0.1^4) = 0.94
  EXPECT_GT(h[2], 4000 * 0.13); // sqrt-flattened: 0.1^.5 / sum = 0.18
}

TEST(sampling, top_k_keeps_only_the_k_most_likely) {
  sampling_params p;
  p.top_k = 2;
  auto counts = draw(p, logits_for({0.1, 0.4, 0.2, 0.3}), 3000);
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_TRUE(counts.contains(1) && counts.contains(3));
  EXPECT_NEAR(counts[1] / 3000.0, 4.0 / 7.0, 0.05);
}

TEST(sampling, top_p_keeps_the_smallest_set_reaching_the_mass) {
  sampling_params p;
  p.top_p = 0.7f;
  auto counts = draw(p, logits_for({0.15, 0.5, 0.3, 0.05}), 3000);
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_TRUE(counts.contains(1) && counts.contains(2));
  p.top_p = 0.85f;
  EXPECT_EQ(draw(p, logits_for({0.15, 0.5, 0.3, 0.05}), 3000).size(), 3u);
}

TEST(sampling, min_p_drops_tokens_below_a_share_of_the_best) {
  sampling_params p;
  p.min_p = 0.5f;
  auto counts = draw(p, logits_for({0.4, 0.3, 0.19, 0.11}), 3000);
  EXPECT_EQ(counts.size(), 2u); // 0.19 < 0.5 * 0.4
  EXPECT_TRUE(counts.contains(0) && counts.contains(1));
}

TEST(sampling, frequency_and_presence_penalties_act_on_output_tokens) {
  sampling_params p;
  p.temperature = 0;
  p.frequency_penalty = 0.6f;
  sequence_sampler s(p, {}, 1);
  std::vector<float> base = {1.0f, 0.5f, 0.0f};
  std::vector<int32_t> got;
  for (int i = 0; i < 3; ++i) {
    auto l = base;
    got.push_back(s.sample(l).first);
  }
  // Token 0 drops by 0.6 per use: 1.0 > 0.5, then 0.4 < 0.5, then 0.4 vs -0.1.
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 0}));

  sampling_params q;
  q.temperature = 0;
  q.presence_penalty = 0.3f;
  sequence_sampler t(q, {}, 1);
  std::vector<int32_t> got2;
  for (int i = 0; i < 3; ++i) {
    auto l = base;
    got2.push_back(t.sample(l).first);
  }
  // Presence subtracts 0.3 once: 0.7 > 0.5 stays ahead.
  EXPECT_EQ(got2, (std::vector<int32_t>{0, 0, 0}));
}

TEST(sampling, repetition_penalty_covers_the_prompt) {
  sampling_params p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  std::vector<int32_t> prompt = {0};
  sequence_sampler s(p, prompt, 1);
  std::vector<float> l = {1.0f, 0.6f, -0.5f};
  EXPECT_EQ(s.sample(l).first, 1); // 1.0 / 2 = 0.5 < 0.6
  EXPECT_FLOAT_EQ(l[0], 0.5f);
}

// The model's log-probabilities are the log-softmax of the logits as given:
// the same whatever penalties, temperature or filters pick the token.
TEST(sampling, model_logprobs_ignore_penalties_temperature_and_filters) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(500);
  for (auto& l : logits)
    l = normal(rng);
  logits[7] = logits[9] = 20.0f; // a tie at the top: index order
  double sum = 0;
  for (float l : logits)
    sum += std::exp(double(l));
  auto log_softmax = [&](int32_t i) { return double(logits[size_t(i)]) - std::log(sum); };
  for (int variant = 0; variant < 4; ++variant) {
    sampling_params p;
    p.logprobs = 5;
    if (variant == 1)
      p.temperature = 0;
    if (variant == 2) {
      p.temperature = 0.3f;
      p.top_k = 3;
      p.repetition_penalty = 1.8f;
      p.presence_penalty = 1.0f;
    }
    if (variant == 3) {
      p.temperature = 1.7f;
      p.top_p = 0.5f;
      p.frequency_penalty = -1.0f;
    }
    sequence_sampler s(p, std::vector<int32_t>{7, 9, 3}, 99, std::vector<int32_t>{7, 7});
    auto l = logits;
    std::vector<token_logprob> got;
    const auto [token, final_logprob] = s.sample(l, &got);
    ASSERT_EQ(got.size(), 6u) << "variant " << variant;
    EXPECT_EQ(got[0].token, token);
    EXPECT_NEAR(got[0].logprob, log_softmax(token), 1e-5) << "variant " << variant;
    // The top 5 by logit, ties by index: 7 before 9.
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
    for (size_t k = 0; k < 5; ++k) {
      EXPECT_EQ(got[1 + k].token, order[k]) << "variant " << variant << " entry " << k;
      EXPECT_NEAR(got[1 + k].logprob, log_softmax(order[k]), 1e-5);
    }
    EXPECT_EQ(got[1].token, 7);
    EXPECT_EQ(got[2].token, 9);
    if (variant >= 2) // the sampler's own logprob is under its final distribution
      EXPECT_GT(std::abs(final_logprob - got[0].logprob), 1e-3) << "variant " << variant;
  }
  // Not asked (-1), or no place to put them: nothing reported.
  sampling_params quiet;
  sequence_sampler s(quiet, {}, 1);
  std::vector<token_logprob> got = {{1, 1.0f}};
  auto l = logits;
  s.sample(l, &got);
  EXPECT_EQ(got.size(), 1u);
  sampling_params zero;
  zero.logprobs = 0;
  sequence_sampler z(zero, {}, 1);
  l = logits;
  z.sample(l, &got);
  ASSERT_EQ(got.size(), 1u); // the sampled token alone
  l = logits;
  EXPECT_NO_THROW(z.sample(l));
}

TEST(sampling, validation_names_the_parameter) {
  sampling_params p;
  EXPECT_EQ(p.validate(), "");
  p.temperature = -1;
  EXPECT_TRUE(p.validate().starts_with("temperature"));
  p = {};
  p.top_p = 0;
  EXPECT_TRUE(p.validate().starts_with("top_p"));
  p = {};
  p.presence_penalty = 3;
  EXPECT_TRUE(p.validate().starts_with("presence_penalty"));
  p = {};
  p.max_tokens = 0;
  EXPECT_TRUE(p.validate().starts_with("max_tokens"));
  p = {};
  p.min_p = 1.5f;
  EXPECT_TRUE(p.validate().starts_with("min_p"));
  p = {};
  p.logprobs = max_logprobs + 1;
  EXPECT_TRUE(p.validate().starts_with("logprobs"));
  p.logprobs = -2;
  EXPECT_TRUE(p.validate().starts_with("logprobs"));
  p.logprobs = max_logprobs;
  EXPECT_EQ(p.validate(), "");
}

TEST(sampling, penalised_means_any_penalty_is_on) {
  sampling_params p;
  p.temperature = 0.5f;
  p.top_k = 3;
  EXPECT_FALSE(p.penalised());
  p.repetition_penalty = 1.1f;
  EXPECT_TRUE(p.penalised());
  p = {};
  p.frequency_penalty = -0.5f;
  EXPECT_TRUE(p.penalised());
  p = {};
  p.presence_penalty = 0.2f;
  EXPECT_TRUE(p.penalised());
}

} // namespace
} // namespace metronome
