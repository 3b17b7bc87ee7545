#include "actors/drift_supervisor.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "actors/engine_metrics.hpp"
#include "actors/messages.hpp"
#include "actors/scheduler_actor.hpp"

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

drift_event drift_event_of(const drift_verdict& v, sched_time now, const std::string& policy,
                           const std::string& fallback) {
  drift_event ev;
  ev.at_ns = now.count();
  ev.error = v.error;
  ev.limit = v.limit;
  ev.samples = v.samples;
  const bool disable = v.action == drift_action::disable;
  ev.action = disable ? "disable" : "enable";
  ev.policy = disable ? fallback : policy;
  ev.cause = disable ? "drift" : "recovered";
  return ev;
}

// -- the actor ------------------------------------------------------------------------

namespace {

struct drift_supervisor_state {
  std::unique_ptr<drift_detector> detector;
  drift_supervisor_config config;
  caf::actor scheduler;
  std::shared_ptr<engine_metrics> metrics;
  std::vector<drift_event> events;
  int64_t samples_seen = 0;
  static inline const char* name = "drift_supervisor";
};

using self_ptr = caf::stateful_actor<drift_supervisor_state>*;

double seconds(sched_time t) {
  return std::chrono::duration<double>(t).count();
}

/// Orders the scheduler to run `policy`; logs a refusal or a silent scheduler.
void switch_policy(self_ptr self, const std::string& policy) {
  self->request(self->state.scheduler, std::chrono::seconds(10), policy_atom::value, policy)
    .then(
      [=](bool ok) {
        if (!ok)
          spdlog::error("drift supervisor: the scheduler does not know policy {}", policy);
      },
      [=](caf::error& err) {
        spdlog::error("drift supervisor: switching to {} failed: {}", policy,
                      self->system().render(err));
      });
}

void act(self_ptr self, const drift_verdict& v, sched_time now) {
  auto& st = self->state;
  if (v.action == drift_action::none)
    return;
  drift_event ev = drift_event_of(v, now, st.config.policy, st.config.fallback);
  const auto& o = st.config.drift;
  if (v.action == drift_action::disable) {
    spdlog::warn("drift supervisor: mean relative error {:.3f} of {} predictions above {:.3f} "
                 "for {:g} s: recalibrating the predictor and running {} for {:g} s",
                 v.error, v.samples, v.limit, seconds(o.sustain), st.config.fallback,
                 seconds(o.disable_for));
    self->send(st.scheduler, recalibrate_atom::value, int64_t(o.window.count()));
    switch_policy(self, st.config.fallback);
  } else {
    spdlog::info("drift supervisor: {:g} s of {} are over: back to {}", seconds(o.disable_for),
                 st.config.fallback, st.config.policy);
    switch_policy(self, st.config.policy);
  }
  if (st.metrics)
    st.metrics->on_policy_switch(ev.policy, ev.cause);
  st.events.push_back(std::move(ev));
}

caf::behavior drift_supervisor(self_ptr self, caf::actor scheduler,
                               drift_supervisor_config config,
                               std::shared_ptr<engine_metrics> metrics) {
  auto& st = self->state;
  st.detector = std::make_unique<drift_detector>(config.drift);
  st.config = std::move(config);
  st.scheduler = std::move(scheduler);
  st.metrics = std::move(metrics);
  self->monitor(st.scheduler);
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source == self->state.scheduler.address())
      self->quit(dm.reason);
  });
  self->send(st.scheduler, watch_atom::value);
  self->delayed_send(self, st.config.tick, tick_atom::value, uint64_t{0});
  return {
    [=](std::vector<drift_sample>& samples) {
      auto& s = self->state;
      for (const auto& x : samples)
        s.detector->record({x.predicted, x.actual, x.expected_error, sched_time{x.finished_ns}});
      s.samples_seen += int64_t(samples.size());
      const auto now = engine_now(self);
      act(self, s.detector->evaluate(now), now);
    },
    [=](tick_atom, uint64_t) {
      auto& s = self->state;
      const auto now = engine_now(self);
      act(self, s.detector->evaluate(now), now);
      self->delayed_send(self, s.config.tick, tick_atom::value, uint64_t{0});
    },
    [=](stats_atom) {
      auto& s = self->state;
      drift_status out;
      out.disabled = s.detector->disabled();
      out.window_error = s.detector->window_error();
      out.window_limit = s.detector->window_limit();
      out.window_samples = s.detector->window_samples();
      out.samples_seen = s.samples_seen;
      out.events = s.events;
      return out;
    },
  };
}

} // namespace

caf::actor spawn_drift_supervisor(caf::actor_system& sys, caf::actor scheduler,
                                  drift_supervisor_config config,
                                  std::shared_ptr<engine_metrics> metrics) {
  return sys.spawn(drift_supervisor, std::move(scheduler), std::move(config), std::move(metrics));
}

} // namespace metronome
