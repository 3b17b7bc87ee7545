#include "sched/drift_detector.hpp"

#include <algorithm>
#include <cmath>

namespace metronome {

// -- drift_detector ----------------------------------------------------------------

drift_detector::drift_detector(drift_options options) : options_(options) {
  // nop
}

void drift_detector::record(const prediction_outcome& o) {
  if (disabled())
    return; // predictions made before the recalibration say nothing now
  if (options_.relative_to_baseline && o.expected_error < 0)
    return; // the cold-start rule is not calibrated: nothing to drift from
  window_.push_back(o);
  sum_error_ += relative_error(o.predicted, o.actual);
  sum_baseline_ += std::max(o.expected_error, 0.0);
}

void drift_detector::prune(sched_time now) {
  while (!window_.empty() && window_.front().finished <= now - options_.window) {
    const auto& o = window_.front();
    sum_error_ -= relative_error(o.predicted, o.actual);
    sum_baseline_ -= std::max(o.expected_error, 0.0);
    window_.pop_front();
  }
  if (window_.empty())
    sum_error_ = sum_baseline_ = 0; // no drift of the running sums
}

void drift_detector::clear() {
  window_.clear();
  sum_error_ = sum_baseline_ = 0;
  over_since_.reset();
}

double drift_detector::window_error() const {
  return window_.empty() ? 0.0 : sum_error_ / double(window_.size());
}

double drift_detector::window_limit() const {
  if (!options_.relative_to_baseline || window_.empty())
    return options_.error_threshold;
  const double baseline = sum_baseline_ / double(window_.size());
  return std::max(options_.error_threshold, baseline * (1.0 + options_.error_threshold));
}

drift_verdict drift_detector::evaluate(sched_time now) {
  drift_verdict v;
  if (disabled_until_) {
    if (now < *disabled_until_)
      return v;
    disabled_until_.reset();
    clear();
    v.action = drift_action::enable;
    return v;
  }
  prune(now);
  v.samples = window_samples();
  v.error = window_error();
  v.limit = window_limit();
  if (v.samples < options_.min_samples || v.error <= v.limit) {
    over_since_.reset();
    return v;
  }
  if (!over_since_)
    over_since_ = now;
  if (now - *over_since_ < options_.sustain)
    return v;
  v.action = drift_action::disable;
  clear();
  disabled_until_ = now + options_.disable_for;
  return v;
}

std::optional<sched_time> drift_detector::next_check() const {
  if (disabled_until_)
    return disabled_until_;
  if (over_since_)
    return *over_since_ + options_.sustain;
  return std::nullopt;
}

std::optional<drift_order> drift_order_of(const drift_verdict& v, sched_time now,
                                          const drift_options& options, policy_kind policy,
                                          policy_kind fallback) {
  if (v.action == drift_action::none)
    return std::nullopt;
  drift_event ev;
  ev.at_ns = now.count();
  ev.error = v.error;
  ev.limit = v.limit;
  ev.samples = v.samples;
  const bool disable = v.action == drift_action::disable;
  ev.action = disable ? "disable" : "enable";
  drift_order o;
  o.policy = disable ? fallback : policy;
  ev.policy = to_string(o.policy);
  ev.cause = disable ? "drift" : "recovered";
  if (disable)
    o.recalibrate_window = options.window;
  o.event = std::move(ev);
  return o;
}

} // namespace metronome
