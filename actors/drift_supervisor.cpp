#include "actors/drift_supervisor.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "actors/engine_metrics.hpp"
#include "actors/messages.hpp"
#include "actors/scheduler_actor.hpp"

namespace metronome {

// -- the actor ------------------------------------------------------------------------

namespace {

struct drift_supervisor_state {
  std::unique_ptr<drift_detector> detector;
  drift_supervisor_config config;
  policy_control_actor scheduler;
  std::shared_ptr<engine_metrics> metrics;
  std::vector<drift_event> events;
  int64_t samples_seen = 0;
  static inline const char* name = "drift_supervisor";
};

using self_ptr = drift_supervisor_actor::stateful_pointer<drift_supervisor_state>;

double seconds(sched_time t) {
  return std::chrono::duration<double>(t).count();
}

/// Orders the scheduler to run `policy`; logs a refusal or a silent scheduler.
void switch_policy(self_ptr self, policy_kind policy) {
  self->request(self->state.scheduler, std::chrono::seconds(10), policy_atom::value, policy)
    .then(
      [=](bool ok) {
        if (!ok)
          spdlog::error("drift supervisor: the scheduler refused policy {}", to_string(policy));
      },
      [=](caf::error& err) {
        spdlog::error("drift supervisor: switching to {} failed: {}", to_string(policy),
                      self->system().render(err));
      });
}

void act(self_ptr self, const drift_verdict& v, sched_time now) {
  auto& st = self->state;
  const auto& o = st.config.drift;
  auto order = drift_order_of(v, now, o, st.config.policy, st.config.fallback);
  if (!order)
    return;
  if (order->recalibrate_window) {
    spdlog::warn("drift supervisor: mean relative error {:.3f} of {} predictions above {:.3f} "
                 "for {:g} s: recalibrating the predictor and running {} for {:g} s",
                 v.error, v.samples, v.limit, seconds(o.sustain), to_string(order->policy),
                 seconds(o.disable_for));
    self->send(st.scheduler, recalibrate_atom::value, int64_t(order->recalibrate_window->count()));
  } else {
    spdlog::info("drift supervisor: {:g} s of {} are over: back to {}", seconds(o.disable_for),
                 to_string(st.config.fallback), to_string(order->policy));
  }
  switch_policy(self, order->policy);
  if (st.metrics)
    st.metrics->on_policy_switch(order->event.policy, order->event.cause);
  st.events.push_back(std::move(order->event));
}

drift_supervisor_actor::behavior_type drift_supervisor(self_ptr self,
                                                       policy_control_actor scheduler,
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
  self->delayed_send(drift_supervisor_actor{self}, st.config.tick, tick_atom::value, uint64_t{0});
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
      self->delayed_send(drift_supervisor_actor{self}, s.config.tick, tick_atom::value,
                         uint64_t{0});
    },
    [=](stats_atom) -> drift_status {
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

drift_supervisor_actor spawn_drift_supervisor(caf::actor_system& sys,
                                              policy_control_actor scheduler,
                                              drift_supervisor_config config,
                                              std::shared_ptr<engine_metrics> metrics) {
  return sys.spawn(drift_supervisor, std::move(scheduler), std::move(config), std::move(metrics));
}

} // namespace metronome
