// The remaining-steps predictor: the cold-start rule, online learning from
// finished requests, warm-up and refit interval, recalibration, and the
// accuracy figures (checked against values computed by hand).

#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "sched/predictor.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;

request_features features(int32_t prompt, int32_t max_tokens = 1000, std::string cls = "") {
  return {prompt, max_tokens, 0.0f, std::move(cls)};
}

TEST(predictor, cold_start_is_the_original_rule_capped_by_max_tokens) {
  predictor p;
  EXPECT_FALSE(p.learned());
  EXPECT_DOUBLE_EQ(p.predict(features(100)), 0.8 * 100 + 5);
  EXPECT_DOUBLE_EQ(p.predict(features(10)), 13.0);
  EXPECT_DOUBLE_EQ(p.predict(features(1000, 64)), 64.0) << "capped by max_tokens";
  predictor_options o;
  o.cold_start_slope = 0.0;
  o.cold_start_intercept = 0.0;
  EXPECT_DOUBLE_EQ(predictor(o).predict(features(50)), 1.0) << "at least one step";
  EXPECT_LT(p.expected_error(), 0) << "no calibration baseline yet";
}

TEST(predictor, learns_after_warmup_from_finished_requests) {
  predictor_options o;
  o.warmup_steps = 50;
  predictor p(o);
  std::mt19937 rng(1);
  std::uniform_int_distribution<int32_t> prompt(10, 4000);
  sched_time now{0};
  // Two classes with very different lengths, unrelated to prompt length.
  auto truth = [](const std::string& cls) { return cls == "chat" ? 200 : 12; };
  for (int i = 0; i < 49; ++i) {
    const std::string cls = i % 2 ? "chat" : "code";
    p.observe(features(prompt(rng), 1000, cls), truth(cls), std::nullopt, -1, now += 10ms);
  }
  EXPECT_FALSE(p.learned()) << "49 < warmup_steps";
  p.observe(features(prompt(rng), 1000, "chat"), 200, std::nullopt, -1, now += 10ms);
  ASSERT_TRUE(p.learned());
  EXPECT_NEAR(p.predict(features(3000, 1000, "chat")), 200, 20);
  EXPECT_NEAR(p.predict(features(20, 1000, "code")), 12, 2);
  EXPECT_GE(p.expected_error(), 0.0);
  EXPECT_LT(p.expected_error(), 0.1);
}

TEST(predictor, refits_only_every_update_interval) {
  predictor_options o;
  o.warmup_steps = 10;
  o.update_interval = 1s;
  predictor p(o);
  sched_time now{0};
  for (int i = 0; i < 10; ++i)
    p.observe(features(100), 10, std::nullopt, -1, now);
  ASSERT_TRUE(p.learned());
  const double before = p.predict(features(100));
  EXPECT_NEAR(before, 10, 0.5);
  for (int i = 0; i < 200; ++i)
    p.observe(features(100), 100, std::nullopt, -1, now + 500ms);
  EXPECT_DOUBLE_EQ(p.predict(features(100)), before) << "no refit within update_interval";
  p.observe(features(100), 100, std::nullopt, -1, now + 1s);
  EXPECT_GT(p.predict(features(100)), 50) << "refitted once the interval passed";
  EXPECT_EQ(p.refits(), 2);
}

TEST(predictor, recalibration_forgets_what_came_before_the_window) {
  predictor_options o;
  o.warmup_steps = 20;
  o.update_interval = 0s;
  o.half_life = 1e9; // no forgetting: only recalibration helps
  predictor p(o);
  sched_time now{0};
  for (int i = 0; i < 2000; ++i)
    p.observe(features(100 + i % 50), 10, std::nullopt, -1, now += 10ms);
  for (int i = 0; i < 40; ++i)
    p.observe(features(100 + i % 50), 300, std::nullopt, -1, now += 10ms);
  EXPECT_LT(p.predict(features(120)), 20) << "2000 old samples outweigh 40 new ones";
  p.recalibrate(now, 300ms); // the last 300 ms hold only the new regime
  EXPECT_EQ(p.recalibrations(), 1);
  ASSERT_TRUE(p.learned());
  EXPECT_NEAR(p.predict(features(120)), 300, 15);
  EXPECT_LT(p.expected_error(), 0.05);
}

TEST(predictor, recalibration_with_too_little_recent_history_reverts_to_the_rule) {
  predictor_options o;
  o.warmup_steps = 20;
  predictor p(o);
  sched_time now{0};
  for (int i = 0; i < 30; ++i)
    p.observe(features(100), 10, std::nullopt, -1, now += 1s);
  ASSERT_TRUE(p.learned());
  p.recalibrate(now, 5s);
  EXPECT_FALSE(p.learned());
  EXPECT_DOUBLE_EQ(p.predict(features(100)), 85.0);
}

TEST(predictor, outcomes_with_predictions_are_drained_once) {
  predictor p;
  p.observe(features(10), 7, 9.0, 0.25, sched_time{5});
  p.observe(features(10), 7, std::nullopt, -1, sched_time{6}); // ran unpredicted
  auto out = p.drain_outcomes();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_DOUBLE_EQ(out[0].predicted, 9.0);
  EXPECT_EQ(out[0].actual, 7);
  EXPECT_DOUBLE_EQ(out[0].expected_error, 0.25);
  EXPECT_EQ(out[0].finished, sched_time{5});
  EXPECT_TRUE(p.drain_outcomes().empty());
  EXPECT_EQ(p.observations(), 2);
}

TEST(predictor, accuracy_figures_match_hand_computed_values) {
  // predicted vs actual: (2,1) (4,2) (3,3) (10,4): MAE = (1+2+0+6)/4.
  std::vector<prediction_outcome> xs = {{2, 1}, {4, 2}, {3, 3}, {10, 4}};
  auto a = measure_accuracy(xs);
  EXPECT_EQ(a.samples, 4);
  EXPECT_DOUBLE_EQ(a.mae, 9.0 / 4);
  EXPECT_DOUBLE_EQ(a.mean_relative_error, (1.0 + 1.0 + 0.0 + 1.5) / 4);
  // Ranks: predicted 1,3,2,4 vs actual 1,2,3,4: rho = 1 - 6*2/(4*15) = 0.8.
  EXPECT_NEAR(a.spearman, 0.8, 1e-12);
  std::vector<prediction_outcome> reversed = {{1, 3}, {2, 2}, {3, 1}};
  EXPECT_NEAR(measure_accuracy(reversed).spearman, -1.0, 1e-12);
  // Ties get their mean rank: predicted (1,1,2) vs actual (1,2,3) ->
  // ranks (1.5,1.5,3) vs (1,2,3): Pearson of ranks = 0.866...
  std::vector<prediction_outcome> ties = {{1, 1}, {1, 2}, {2, 3}};
  EXPECT_NEAR(measure_accuracy(ties).spearman, std::sqrt(3.0) / 2, 1e-12);
  EXPECT_EQ(measure_accuracy({}).samples, 0);
}

} // namespace
} // namespace metronome
