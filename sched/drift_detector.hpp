#pragma once
// The drift logic of the latency-aware policies, as plain C++ (time
// injected): the detector judges predictions against outcomes, and
// drift_order_of maps its verdicts to orders. The drift supervisor actor
// (actors/drift_supervisor.hpp) and the replay loop (sim/replay.cpp) both run
// them.
//
// Design note. Every finished request that was predicted yields a sample
// (predicted, actual steps). Over a rolling window of `window` the detector
// takes the mean relative error |predicted - actual| / actual. It compares
// that with a limit: the configured error_threshold (0.3), or, when the
// predictor reports a calibration baseline (the error its current model had
// on recent history when it was fitted), that baseline x (1 +
// error_threshold) if larger. The baseline matters: on real traces the
// output length is barely predictable from what is known at arrival (the
// best predictor of the Azure code trace has a mean relative error of 0.5,
// Mooncake's 4), so a fixed 30% would disable LADB forever although nothing
// drifted. Samples predicted by the uncalibrated cold-start rule are not
// judged (it is replaced after warmup anyway). When the error stays above
// the limit for `sustain`, the detector orders a recalibration and an
// emergency disable: the scheduler runs fcfs for `disable_for`, then the
// latency-aware policy again, with a fresh window. `relative_to_baseline =
// false` gives the literal rule (fixed threshold, every sample).

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "sched/admission_policy.hpp"
#include "sched/predictor.hpp"

namespace metronome {

/// Settings (config section `supervisor.drift`).
struct drift_options {
  bool enabled = true;
  /// Rolling window over which the mean relative error is measured.
  sched_time window = std::chrono::seconds(300);
  /// Mean relative error above this (or above baseline x (1 + this)) is drift.
  double error_threshold = 0.3;
  /// Drift must last this long before the policy is disabled.
  sched_time sustain = std::chrono::seconds(300);
  /// How long fcfs runs before the latency-aware policy is restored.
  sched_time disable_for = std::chrono::seconds(300);
  /// Samples in the window before drift is judged at all.
  int32_t min_samples = 50;
  /// Judge against the predictor's calibration baseline (see the note).
  bool relative_to_baseline = true;
};

enum class drift_action : uint8_t { none, disable, enable };

/// What evaluate() decided, with the figures it decided on.
struct drift_verdict {
  drift_action action = drift_action::none;
  double error = 0;
  double limit = 0;
  int64_t samples = 0;
};

/// The drift logic. One owner (the supervisor actor or the replay loop).
class drift_detector {
public:
  explicit drift_detector(drift_options options);

  /// A finished request's prediction and truth. Ignored while disabled.
  void record(const prediction_outcome& o);

  /// Re-evaluates at `now` (after records, or on a timer).
  drift_verdict evaluate(sched_time now);

  /// When the state may change without new samples (the end of a disable
  /// or of the sustain period); nullopt when only samples can change it.
  std::optional<sched_time> next_check() const;

  bool disabled() const {
    return disabled_until_.has_value();
  }

  /// Mean relative error, limit and samples of the current window.
  double window_error() const;
  double window_limit() const;
  int64_t window_samples() const {
    return int64_t(window_.size());
  }

  const drift_options& options() const {
    return options_;
  }

private:
  void prune(sched_time now);
  void clear();

  drift_options options_;
  std::deque<prediction_outcome> window_;
  double sum_error_ = 0;
  double sum_baseline_ = 0;
  std::optional<sched_time> over_since_;
  std::optional<sched_time> disabled_until_;
};

/// A decision of the drift supervisor.
struct drift_event {
  /// Engine clock, ns.
  int64_t at_ns = 0;
  /// "disable" (recalibrate, switch to the fallback) or "enable".
  std::string action;
  /// The policy switched to (its name: the event is logged and reported).
  std::string policy;
  /// "drift" or "recovered".
  std::string cause;
  /// Mean relative error of the window and the limit it was judged against.
  double error = 0;
  double limit = 0;
  int64_t samples = 0;
};

/// What a verdict orders (the drift controller: one mapping for the actor
/// and the replay). A disable recalibrates the predictor on the last
/// `recalibrate_window` and switches to the fallback; an enable switches
/// back to the latency-aware policy.
struct drift_order {
  policy_kind policy = policy_kind::fcfs;
  std::optional<sched_time> recalibrate_window;
  drift_event event;
};

/// The order for verdict `v` at `now`; nullopt for drift_action::none.
std::optional<drift_order> drift_order_of(const drift_verdict& v, sched_time now,
                                          const drift_options& options, policy_kind policy,
                                          policy_kind fallback);

} // namespace metronome
