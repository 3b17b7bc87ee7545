// The drift logic as a plain class: the rolling window, min_samples, the
// sustain period, the disable / re-enable cycle, the calibration baseline and
// the literal fixed threshold.

#include <gtest/gtest.h>

#include "sched/drift_detector.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;

drift_options options() {
  drift_options o;
  o.window = 10s;
  o.error_threshold = 0.3;
  o.sustain = 5s;
  o.disable_for = 20s;
  o.min_samples = 4;
  return o;
}

/// A sample finishing at `t` with relative error |p - a| / a.
prediction_outcome sample(sched_time t, double predicted, int32_t actual, double baseline = 0.0) {
  return {predicted, actual, baseline, t};
}

TEST(drift_detector, judges_nothing_below_min_samples) {
  drift_detector d(options());
  for (int i = 0; i < 3; ++i)
    d.record(sample(sched_time{i * 1s}, 100, 10));
  EXPECT_EQ(d.evaluate(100s).action, drift_action::none);
  EXPECT_FALSE(d.next_check()) << "not over the limit: nothing pending";
}

TEST(drift_detector, disables_after_sustained_drift_and_reenables_after_the_cool_down) {
  drift_detector d(options());
  sched_time t = 0s;
  for (int i = 0; i < 4; ++i)
    d.record(sample(t += 100ms, 10, 10)); // exact
  EXPECT_EQ(d.evaluate(t).action, drift_action::none);
  // Lengths jump: predicted 10, actual 40 (error 0.75).
  for (int i = 0; i < 20; ++i)
    d.record(sample(t += 100ms, 10, 40));
  auto v = d.evaluate(t);
  EXPECT_EQ(v.action, drift_action::none) << "over the limit, but not for 5 s yet";
  EXPECT_GT(v.error, v.limit);
  EXPECT_DOUBLE_EQ(v.limit, 0.3);
  const auto since = t;
  EXPECT_EQ(d.next_check(), since + 5s);
  d.record(sample(t = since + 4900ms, 10, 40));
  EXPECT_EQ(d.evaluate(t).action, drift_action::none);
  v = d.evaluate(since + 5s);
  EXPECT_EQ(v.action, drift_action::disable);
  EXPECT_GT(v.samples, 4);
  EXPECT_TRUE(d.disabled());
  EXPECT_EQ(d.window_samples(), 0) << "a fresh window after the recalibration";
  // Samples while disabled are ignored; the cool-down ends after 20 s.
  d.record(sample(since + 6s, 10, 40));
  EXPECT_EQ(d.window_samples(), 0);
  EXPECT_EQ(d.next_check(), since + 25s);
  EXPECT_EQ(d.evaluate(since + 24s).action, drift_action::none);
  EXPECT_EQ(d.evaluate(since + 25s).action, drift_action::enable);
  EXPECT_FALSE(d.disabled());
}

TEST(drift_detector, error_that_drops_below_the_limit_resets_the_sustain_clock) {
  drift_detector d(options());
  sched_time t = 0s;
  for (int i = 0; i < 10; ++i)
    d.record(sample(t += 100ms, 10, 40));
  d.evaluate(t);
  ASSERT_TRUE(d.next_check());
  // Good predictions dilute the window below 0.3 before 5 s have passed.
  for (int i = 0; i < 30; ++i)
    d.record(sample(t += 100ms, 40, 40));
  EXPECT_EQ(d.evaluate(t).action, drift_action::none);
  EXPECT_FALSE(d.next_check());
}

TEST(drift_detector, old_samples_leave_the_rolling_window) {
  auto o = options();
  o.sustain = 100s;
  drift_detector d(o);
  for (int i = 0; i < 10; ++i)
    d.record(sample(sched_time{i * 100ms}, 10, 40));
  d.evaluate(1s);
  EXPECT_EQ(d.window_samples(), 10);
  EXPECT_NEAR(d.window_error(), 0.75, 1e-12);
  d.evaluate(10s + 450ms); // samples at <= 450 ms are out of the 10 s window
  EXPECT_EQ(d.window_samples(), 5);
  d.evaluate(30s);
  EXPECT_EQ(d.window_samples(), 0);
}

TEST(drift_detector, the_limit_follows_the_predictors_calibration_baseline) {
  drift_detector d(options());
  sched_time t = 0s;
  // A predictor that expects a 50% error and delivers 50%: no drift.
  for (int i = 0; i < 100; ++i)
    d.record(sample(t += 100ms, i % 2 ? 15 : 5, 10, 0.5));
  auto v = d.evaluate(t);
  EXPECT_NEAR(v.error, 0.5, 1e-12);
  EXPECT_NEAR(v.limit, 0.65, 1e-12); // 0.5 x 1.3
  EXPECT_FALSE(d.next_check());
  // Cold-start predictions (no baseline) are not judged at all.
  drift_detector cold(options());
  for (int i = 0; i < 100; ++i)
    cold.record(sample(t += 100ms, 1000, 10, -1));
  EXPECT_EQ(cold.window_samples(), 0);
}

TEST(drift_detector, literal_rule_uses_the_fixed_threshold_on_every_sample) {
  auto o = options();
  o.relative_to_baseline = false;
  drift_detector d(o);
  sched_time t = 0s;
  for (int i = 0; i < 100; ++i)
    d.record(sample(t += 100ms, i % 2 ? 15 : 5, 10, i < 50 ? -1 : 0.5));
  auto v = d.evaluate(t);
  EXPECT_EQ(v.samples, 100);
  EXPECT_DOUBLE_EQ(v.limit, 0.3);
  EXPECT_TRUE(d.next_check()) << "0.5 > 0.3: the sustain clock runs";
}

} // namespace
} // namespace metronome
