#include "actors/kv_precision_supervisor.hpp"

#include <spdlog/spdlog.h>

#include "actors/engine_metrics.hpp"
#include "actors/messages.hpp"
#include "actors/scheduler_actor.hpp"
#include "metrics/log_event.hpp"

namespace metronome {

namespace {

/// How many transitions stats_atom reports (kv_precision_status::events).
constexpr size_t max_kept_events = 64;

struct kv_precision_supervisor_state {
  std::unique_ptr<kv_precision_controller> controller;
  kv_precision_control_actor scheduler;
  std::shared_ptr<engine_metrics> metrics;
  kv_precision_status status;
  /// Bumped at each cool-down start: a timer of an earlier one is stale
  /// (CAF 0.17 timers cannot be cancelled).
  uint64_t timer_epoch = 0;
  static inline const char* name = "kv_precision_supervisor";
};

using self_ptr = kv_precision_supervisor_actor::stateful_pointer<kv_precision_supervisor_state>;

double seconds(sched_time t) {
  return std::chrono::duration<double>(t).count();
}

/// Logs, counts and keeps one transition.
void record(self_ptr self, const std::string& event, uint64_t seq, int32_t in_window,
            sched_time now) {
  auto& st = self->state;
  log_event line("kv_precision");
  line.add("event", event);
  if (seq != 0)
    line.add("seq", int64_t(seq));
  line.add("rematerializations_in_window", in_window);
  line.add("max_rematerializations", st.controller->options().max_rematerializations);
  line.add("window_s", seconds(st.controller->options().window), 0);
  if (event == "cooldown_started")
    line.add("cooldown_s", seconds(st.controller->options().cooldown), 0);
  line.write(event == "rematerialized" || event == "cooldown_ended" ? spdlog::level::info
                                                                    : spdlog::level::warn);
  if (st.metrics)
    st.metrics->on_kv_precision_event(event, st.controller->cooling_down());
  // The latest transitions only: a server runs for months, and the counters
  // (overflows, rematerialized, kept, /metrics) keep the totals.
  if (st.status.events.size() >= max_kept_events)
    st.status.events.erase(st.status.events.begin());
  st.status.events.push_back({now.count(), event, seq, in_window});
  st.status.cooling_down = st.controller->cooling_down();
  st.status.cooldown_until_ns
    = st.controller->next_check() ? st.controller->next_check()->count() : 0;
}

void end_cooldown(self_ptr self, sched_time now) {
  auto& st = self->state;
  self->send(st.scheduler, cooldown_atom::value, false);
  record(self, "cooldown_ended", 0, st.controller->in_window(now), now);
}

void on_overflow(self_ptr self, const kv_overflow_msg& m) {
  auto& st = self->state;
  const auto now = engine_now(self);
  ++st.status.overflows;
  const auto d = st.controller->on_overflow(m.seq_id, now);
  if (d.cooldown_ended)
    end_cooldown(self, now);
  if (d.action == kv_overflow_action::rematerialize) {
    self->send(st.scheduler, remat_atom::value, m.seq_id);
    ++st.status.rematerialized;
    record(self, "rematerialized", m.seq_id, d.in_window, now);
    return;
  }
  self->send(st.scheduler, kv_keep_atom::value, m.seq_id);
  ++st.status.kept;
  record(self, "kept", m.seq_id, d.in_window, now);
  if (d.cooldown_started) {
    self->send(st.scheduler, cooldown_atom::value, true);
    record(self, "cooldown_started", m.seq_id, d.in_window, now);
    self->delayed_send(kv_precision_supervisor_actor{self}, *d.cooldown_until - now,
                       tick_atom::value, ++st.timer_epoch);
  }
}

kv_precision_supervisor_actor::behavior_type
kv_precision_supervisor(self_ptr self, kv_precision_control_actor scheduler,
                        kv_overflow_options options, std::shared_ptr<engine_metrics> metrics) {
  auto& st = self->state;
  st.controller = std::make_unique<kv_precision_controller>(options);
  st.scheduler = std::move(scheduler);
  st.metrics = std::move(metrics);
  if (st.metrics)
    st.metrics->on_kv_precision_event("", false); // the mode gauge from the start
  self->monitor(st.scheduler);
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source == self->state.scheduler.address())
      self->quit(dm.reason);
  });
  self->send(st.scheduler, kv_watch_atom::value);
  return {
    [=](kv_overflow_msg& m) { on_overflow(self, m); },
    [=](tick_atom, uint64_t epoch) {
      auto& s = self->state;
      if (epoch != s.timer_epoch)
        return;
      const auto now = engine_now(self);
      if (s.controller->on_tick(now)) {
        end_cooldown(self, now);
      } else if (auto next = s.controller->next_check(); next && *next > now) {
        // Early (a clock that moved less than asked): look again at the end.
        self->delayed_send(kv_precision_supervisor_actor{self}, *next - now, tick_atom::value,
                           epoch);
      }
    },
    [=](stats_atom) -> kv_precision_status { return self->state.status; },
  };
}

} // namespace

kv_precision_supervisor_actor spawn_kv_precision_supervisor(
  caf::actor_system& sys, kv_precision_control_actor scheduler, kv_overflow_options options,
  std::shared_ptr<engine_metrics> metrics) {
  return sys.spawn(kv_precision_supervisor, std::move(scheduler), options, std::move(metrics));
}

} // namespace metronome
