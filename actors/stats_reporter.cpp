#include "actors/stats_reporter.hpp"

#include "actors/engine.hpp"
#include "actors/messages.hpp"
#include "actors/scheduler_actor.hpp"

namespace metronome {

std::optional<log_event> stats_reporter::sample(const engine_stats_sample& s, clock_time now) {
  auto previous = std::exchange(last_, s);
  auto since = std::exchange(last_time_, now);
  if (!previous)
    return std::nullopt;
  const double seconds = std::chrono::duration<double>(now - since).count();
  const double computed = s.computed_tokens - previous->computed_tokens;
  if (s.running + s.waiting == 0 && computed <= 0)
    return std::nullopt;
  const double per_s = seconds > 0 ? 1.0 / seconds : 0.0;
  const double queried = s.prefix_queries - previous->prefix_queries;
  log_event line("stats");
  line.add("interval_s", seconds, 1)
    .add("tokens_per_s", computed * per_s, 1)
    .add("output_tokens_per_s", (s.sampled_tokens - previous->sampled_tokens) * per_s, 1)
    .add("running", s.running)
    .add("waiting", s.waiting)
    .add("kv_usage", s.kv_total_pages > 0 ? double(s.kv_used_pages) / s.kv_total_pages : 0.0, 3);
  if (queried > 0)
    line.add("prefix_cache_hit_rate", (s.prefix_hits - previous->prefix_hits) / queried, 3);
  else
    line.add_null("prefix_cache_hit_rate"); // nothing looked up in the interval
  return line;
}

namespace {

struct stats_reporter_state {
  stats_reporter reporter;
  static inline const char* name = "stats_reporter";
};

stats_reporter_actor::behavior_type
stats_reporter_behavior(stats_reporter_actor::stateful_pointer<stats_reporter_state> self,
                        caf::actor_addr scheduler, std::shared_ptr<engine_metrics> metrics,
                        std::shared_ptr<engine_status> status, std::chrono::milliseconds interval) {
  if (auto s = caf::actor_cast<caf::strong_actor_ptr>(scheduler))
    self->monitor(s);
  else
    self->quit(); // it is gone already
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source == scheduler)
      self->quit(dm.reason);
  });
  auto take = [=] {
    if (auto line = self->state.reporter.sample(metrics->sample(*status), engine_now(self)))
      line->write(spdlog::level::info);
  };
  take(); // the baseline
  self->delayed_send(stats_reporter_actor{self}, interval, tick_atom::value, uint64_t{0});
  return {
    [=](tick_atom, uint64_t) {
      take();
      self->delayed_send(stats_reporter_actor{self}, interval, tick_atom::value, uint64_t{0});
    },
  };
}

} // namespace

stats_reporter_actor spawn_stats_reporter(caf::actor_system& sys, caf::actor_addr scheduler,
                                          std::shared_ptr<engine_metrics> metrics,
                                          std::shared_ptr<engine_status> status,
                                          std::chrono::milliseconds interval) {
  return sys.spawn(stats_reporter_behavior, std::move(scheduler), std::move(metrics),
                   std::move(status), interval);
}

} // namespace metronome
