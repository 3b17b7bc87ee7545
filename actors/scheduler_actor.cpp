#include "actors/scheduler_actor.hpp"

#include <stdexcept>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "actors/engine.hpp"
#include "actors/engine_metrics.hpp"
#include "sched/ladb_policy.hpp"

namespace metronome {

sched_time engine_now(caf::local_actor* self) {
  return std::chrono::duration_cast<sched_time>(self->clock().now().time_since_epoch());
}

namespace {

struct scheduler_actor_state {
  std::unique_ptr<scheduler> core;
  scheduler_actor_config config;
  executor_actor executor;
  std::shared_ptr<engine_status> status;
  std::shared_ptr<engine_metrics> metrics;
  /// Bumped whenever the executor changes: answers for an older one are stale.
  uint64_t epoch = 0;
  uint64_t timer_epoch = 0;
  std::unordered_map<uint64_t, request_actor> requests;
  std::unordered_map<caf::actor_addr, uint64_t> by_addr;
  int64_t finished = 0;
  int64_t cancelled = 0;
  int64_t reported_preemptions = 0;
  int64_t reported_limited = 0;
  token_group_stats reported_groups;
  int64_t reported_prefix_queries = 0, reported_prefix_hits = 0;
  int64_t reported_bucket_admissions = 0, reported_bucket_overflows = 0;
  int64_t reported_kv_overflow_values = 0;
  latency_aware_stats reported_stats;
  /// Receives prediction outcomes (the drift supervisor), if any.
  drift_watcher_actor drift_watcher;
  /// Receives KV overflow reports and decides on them (the kv precision
  /// supervisor), if any; monitored.
  kv_overflow_watcher_actor kv_watcher;
  /// The step trace's time zero (the actor's start).
  sched_time trace_origin{0};
  /// The executor is gone for good (a permanent executor_down_msg): new
  /// admissions are refused until an executor comes up again (a removed
  /// replica's retry, data parallel).
  bool gone = false;
  static inline const char* name = "scheduler";
};

using self_ptr = scheduler_actor::stateful_pointer<scheduler_actor_state>;

void publish(self_ptr self) {
  auto& st = self->state;
  if (st.status)
    st.status->publish_load(st.config.replica, st.core->num_waiting(), st.core->num_running(),
                            st.core->used_pages(), st.core->num_pages());
  if (st.metrics) {
    st.metrics->on_preemptions(st.core->preemptions() - st.reported_preemptions);
    st.reported_preemptions = st.core->preemptions();
    st.metrics->on_scheduling_event("limited_step",
                                    st.core->limited_steps() - st.reported_limited);
    st.reported_limited = st.core->limited_steps();
    const auto& groups = st.core->group_stats();
    st.metrics->on_scheduling_event("group_admission",
                                    groups.admissions - st.reported_groups.admissions);
    st.metrics->on_scheduling_event("group_preemption",
                                    groups.preemptions - st.reported_groups.preemptions);
    st.metrics->on_scheduling_event("group_decode", groups.decodes - st.reported_groups.decodes);
    st.reported_groups = groups;
    st.metrics->on_prefix_cache(st.core->prefix_queries() - st.reported_prefix_queries,
                                st.core->prefix_hits() - st.reported_prefix_hits,
                                st.core->pages().cached_pages());
    st.reported_prefix_queries = st.core->prefix_queries();
    st.reported_prefix_hits = st.core->prefix_hits();
    st.metrics->on_kv_buckets(st.core->bucket_admissions() - st.reported_bucket_admissions,
                              st.core->bucket_overflows() - st.reported_bucket_overflows,
                              st.core->reserved_unused_pages());
    st.reported_bucket_admissions = st.core->bucket_admissions();
    st.reported_bucket_overflows = st.core->bucket_overflows();
    st.metrics->on_kv_overflow_values(st.core->kv_overflow_values()
                                      - st.reported_kv_overflow_values);
    st.reported_kv_overflow_values = st.core->kv_overflow_values();
    if (st.config.policies && st.config.policies->state.stats) {
      const auto& now = *st.config.policies->state.stats;
      auto& was = st.reported_stats;
      st.metrics->on_scheduling_event("long_step", now.long_steps - was.long_steps);
      st.metrics->on_scheduling_event("relaxed_step", now.relaxed_steps - was.relaxed_steps);
      st.metrics->on_scheduling_event("promotion", now.promotions - was.promotions);
      st.metrics->on_scheduling_event("reclassification",
                                      now.reclassifications - was.reclassifications);
      st.metrics->on_scheduling_event("timeout_dispatch",
                                      now.timeout_dispatches - was.timeout_dispatches);
      was = now;
    }
    const auto& est = st.core->step_times();
    st.metrics->on_step_model(est.decode_scale(), est.prefill_scale());
  }
}

void forget(self_ptr self, uint64_t id) {
  auto& st = self->state;
  if (auto i = st.requests.find(id); i != st.requests.end()) {
    self->demonitor(i->second.address());
    st.by_addr.erase(i->second.address());
    st.requests.erase(i);
  }
}

void fail_request(self_ptr self, uint64_t id, request_errc code, const std::string& message) {
  auto& st = self->state;
  if (auto i = st.requests.find(id); i != st.requests.end())
    self->send(i->second, generation_error{{}, code, message, {}});
  forget(self, id);
}

void pump(self_ptr self);

std::unique_ptr<admission_policy> make_policy(const scheduler_actor_config& c, policy_kind p) {
  return c.policies ? make_admission_policy(p, *c.policies) : make_admission_policy(p);
}

/// Sends the predictions of requests finished since the last call to the
/// drift supervisor.
void report_outcomes(self_ptr self) {
  auto& st = self->state;
  if (!st.config.policies || !st.config.policies->state.model)
    return;
  auto outcomes = st.config.policies->state.model->drain_outcomes();
  if (outcomes.empty() || !st.drift_watcher)
    return;
  std::vector<drift_sample> samples;
  samples.reserve(outcomes.size());
  for (const auto& o : outcomes)
    samples.push_back({o.predicted, o.actual, o.expected_error, o.finished.count()});
  self->send(st.drift_watcher, std::move(samples));
}

/// Sends the tokens of `u` to their request actors and forgets the
/// requests that finished.
void deliver(self_ptr self, step_update& u) {
  auto& st = self->state;
  for (auto& ev : u.tokens) {
    auto i = st.requests.find(ev.id);
    if (i == st.requests.end())
      continue;
    token_msg m;
    m.seq_id = ev.id;
    m.tokens = {ev.token};
    if (!ev.logprobs.empty())
      m.logprobs.push_back(std::move(ev.logprobs));
    m.batch_size = ev.batch_size;
    m.finish_reason = ev.finish_reason;
    if (ev.first_scheduled)
      m.queue_ns = std::max<int64_t>(0, (*ev.first_scheduled - ev.arrival).count());
    m.cached_tokens = ev.cached_tokens;
    m.kv_overflow = ev.fallback;
    self->send(i->second, std::move(m));
  }
  for (auto id : u.finished) {
    ++st.finished;
    forget(self, id);
  }
}

void on_output(self_ptr self, const step_output& out) {
  auto& st = self->state;
  const auto now = engine_now(self);
  auto u = st.core->update_from_output(out, now);
  if (st.config.trace && u.step)
    st.config.trace->write(std::chrono::duration<double>(now - st.trace_origin).count(), *u.step);
  if (st.metrics) {
    st.metrics->on_step(out.num_seqs, st.config.scheduler.limits.max_batch_size,
                        out.num_tokens, int64_t(out.tokens.size()), out.seconds);
    st.metrics->on_replica_step(st.config.replica, out.num_tokens);
  }
  // Parked for a KV overflow: the supervisor decides (remat_atom,
  // kv_keep_atom).
  for (const auto& o : u.overflows)
    self->send(st.kv_watcher, kv_overflow_msg{o.id, o.saturated, o.non_finite});
  deliver(self, u);
  report_outcomes(self);
  publish(self);
  pump(self);
}

void lose_executor(self_ptr self, const std::string& reason, bool permanent) {
  auto& st = self->state;
  ++st.epoch;
  st.executor = nullptr;
  st.gone = st.gone || permanent;
  for (auto id : st.core->fail_runner())
    fail_request(self, id, request_errc::engine_failure,
                 "the engine failed while running this request (" + reason + ")");
  if (permanent) {
    // The engine supervisor has marked the engine degraded
    // (engine_status::degraded, which admission reads): no executor
    // follows, so the waiting requests fail too.
    std::vector<uint64_t> waiting;
    for (const auto& [id, _] : st.requests)
      waiting.push_back(id);
    for (auto id : waiting) {
      st.core->abort(id, finish_kind::failed, engine_now(self));
      fail_request(self, id, request_errc::unavailable,
                   "the engine is unavailable: its executor keeps failing (" + reason + ")");
    }
  }
  if (st.metrics) {
    st.metrics->on_executor_restart();
    st.metrics->on_replica_restart(st.config.replica);
  }
  publish(self);
}

void send_plan(self_ptr self, step_plan plan) {
  auto& st = self->state;
  const auto epoch = st.epoch;
  self->request(st.executor, st.config.scheduler.limits.step_timeout, std::move(plan))
    .then([=](step_output& out) {
            if (epoch == self->state.epoch)
              on_output(self, out);
          },
          [=](caf::error& err) {
            auto& s = self->state;
            if (epoch != s.epoch)
              return;
            if (err == caf::sec::request_timeout && s.executor) {
              // A hung step: have the supervisor restart the executor.
              spdlog::error("engine step timed out after {} ms",
                            s.config.scheduler.limits.step_timeout.count());
              self->send(s.executor, crash_atom::value, std::string("engine step timed out"));
            }
            // Other errors: the executor died; its supervisor reports it.
          });
}

void arm_deadline(self_ptr self, sched_time now) {
  auto& st = self->state;
  if (auto deadline = st.core->policy().next_deadline(now); deadline && *deadline > now)
    self->delayed_send(scheduler_actor{self}, *deadline - now, tick_atom::value,
                       ++st.timer_epoch);
}

void pump(self_ptr self) {
  auto& st = self->state;
  while (st.executor) {
    const auto now = engine_now(self);
    auto draft = st.core->schedule(now);
    publish(self);
    if (!draft) {
      arm_deadline(self, now);
      return;
    }
    send_plan(self, std::move(draft->plan));
  }
}

/// Maps a refused admission to the error the client sees.
generation_error refusal(admit_result r, const sched_request& req, int32_t max_model_len) {
  switch (r) {
    case admit_result::empty_prompt:
      return {{}, request_errc::invalid_request, "the prompt is empty", "prompt"};
    case admit_result::too_long:
      return {{},
              request_errc::context_length,
              "This model's maximum context length is " + std::to_string(max_model_len)
                + " tokens. However, your prompt has " + std::to_string(req.prompt.size())
                + " tokens.",
              "messages"};
    case admit_result::too_large_for_cache:
      return {{}, request_errc::context_length,
              "the prompt and max_tokens need more KV cache than the server has", "max_tokens"};
    case admit_result::queue_full:
      return {{}, request_errc::queue_full, "the server's request queue is full; retry later", ""};
    case admit_result::duplicate:
      return {{}, request_errc::invalid_request, "duplicate request id", ""};
    case admit_result::bad_kv_request:
      if (req.max_context > 0 && req.max_context <= int32_t(req.prompt.size()))
        return {{}, request_errc::invalid_request,
                "max_context_length (" + std::to_string(req.max_context)
                  + ") must exceed the prompt's " + std::to_string(req.prompt.size()) + " tokens",
                "max_context_length"};
      return {{}, request_errc::invalid_request,
              "X-KV-Cache-Mode: bucketed is not allowed: the server's engine.kv_strategy is paged",
              ""};
    case admit_result::ok:
      break;
  }
  return {{}, request_errc::engine_failure, "unexpected admission result", ""};
}

scheduler_actor::behavior_type scheduler_behavior(self_ptr self, scheduler_actor_config config,
                                                  std::shared_ptr<engine_status> status,
                                                  std::shared_ptr<engine_metrics> metrics) {
  auto& st = self->state;
  auto policy = make_policy(config, config.policy);
  st.core = std::make_unique<scheduler>(config.scheduler, std::move(policy));
  st.trace_origin = engine_now(self);
  st.config = std::move(config);
  st.status = std::move(status);
  st.metrics = std::move(metrics);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    if (s.kv_watcher && dm.source == s.kv_watcher.address()) {
      // No one decides any more: the parked requests go on as they are.
      spdlog::error("scheduler: the kv precision supervisor is gone; KV overflows are only "
                    "counted from now on");
      s.kv_watcher = nullptr;
      s.core->set_overflow_supervision(false);
      for (auto id : s.core->parked()) {
        auto u = s.core->keep_overflowed(id, engine_now(self));
        if (u)
          deliver(self, *u);
      }
      publish(self);
      pump(self);
      return;
    }
    auto i = s.by_addr.find(dm.source);
    if (i == s.by_addr.end())
      return;
    const auto id = i->second;
    if (s.core->abort(id, finish_kind::cancelled, engine_now(self)))
      ++s.cancelled; // its pages are free now or once no plan in flight uses them
    s.by_addr.erase(i);
    s.requests.erase(id);
    publish(self);
    pump(self);
  });
  return {
    [=](admit_msg& m) {
      auto& s = self->state;
      // The sender is the request actor (interfaces.hpp): it gets the tokens.
      auto sender = caf::actor_cast<request_actor>(self->current_sender());
      // Degraded: published by the engine supervisor, its one owner; gone:
      // this replica's executor is past its restart budget (the router has
      // been told, but this admission was on its way).
      if (s.status->degraded || s.gone) {
        self->send(sender, generation_error{{}, request_errc::unavailable,
                                            "the engine is unavailable: its executor keeps failing",
                                            ""});
        return;
      }
      sched_request r;
      r.id = m.seq_id;
      r.prompt = std::move(m.prompt);
      r.params = m.params;
      r.seed = m.seed;
      if (!m.params.ignore_eos)
        r.stop_ids = s.config.eos_ids;
      r.stop_ids.insert(r.stop_ids.end(), m.params.stop_token_ids.begin(),
                        m.params.stop_token_ids.end());
      r.arrival = sched_time{m.arrival_ns};
      r.request_class = m.request_class;
      r.non_alnum_share = m.non_alnum_share;
      r.kv_mode = m.kv_mode;
      r.no_batch = m.no_batch;
      r.max_context = m.max_context;
      const auto copy_for_error = r.prompt.size();
      auto result = s.core->add(std::move(r), engine_now(self));
      if (result != admit_result::ok) {
        sched_request shape;
        shape.prompt.resize(copy_for_error);
        shape.max_context = m.max_context;
        self->send(sender, refusal(result, shape, s.config.scheduler.limits.max_model_len));
        return;
      }
      self->monitor(sender);
      s.requests.emplace(m.seq_id, sender);
      s.by_addr.emplace(sender.address(), m.seq_id);
      publish(self);
      pump(self);
    },
    [=](cancel_atom, uint64_t id, finish_kind reason) {
      auto& s = self->state;
      if (s.core->abort(id, reason, engine_now(self)))
        ++s.cancelled;
      forget(self, id);
      publish(self);
      pump(self);
    },
    [=](executor_up_msg& up) {
      auto& s = self->state;
      ++s.epoch;
      s.gone = false;
      s.executor = std::move(up.executor);
      s.core->set_capacity(up.num_pages, up.page_size);
      pump(self);
    },
    [=](executor_down_msg& down) { lose_executor(self, down.reason, down.permanent); },
    [=](policy_atom, policy_kind kind) -> bool {
      auto& s = self->state;
      spdlog::info("scheduler: policy {} -> {}", s.core->policy().name(), to_string(kind));
      s.core->set_policy(make_policy(s.config, kind), engine_now(self));
      pump(self);
      return true;
    },
    [=](watch_atom) {
      self->state.drift_watcher = caf::actor_cast<drift_watcher_actor>(self->current_sender());
    },
    [=](kv_watch_atom) {
      auto& s = self->state;
      s.kv_watcher = caf::actor_cast<kv_overflow_watcher_actor>(self->current_sender());
      self->monitor(s.kv_watcher);
      s.core->set_overflow_supervision(true);
    },
    [=](remat_atom, uint64_t id) {
      auto& s = self->state;
      if (s.core->rematerialize(id, engine_now(self)))
        spdlog::debug("scheduler: sequence {} is recomputed in full precision", id);
      publish(self);
      pump(self);
    },
    [=](kv_keep_atom, uint64_t id) {
      auto& s = self->state;
      if (auto u = s.core->keep_overflowed(id, engine_now(self)))
        deliver(self, *u);
      publish(self);
      pump(self);
    },
    [=](cooldown_atom, bool on) {
      auto& s = self->state;
      s.core->set_admission_precision(on ? kv_precision::full : kv_precision::configured);
      pump(self);
    },
    [=](recalibrate_atom, int64_t window_ns) {
      auto& s = self->state;
      if (!s.config.policies || !s.config.policies->state.model)
        return;
      s.config.policies->state.model->recalibrate(engine_now(self), sched_time{window_ns});
      spdlog::info("scheduler: predictor recalibrated on the last {} s",
                   double(window_ns) / 1e9);
    },
    [=](tick_atom, uint64_t timer) {
      if (timer == self->state.timer_epoch)
        pump(self);
    },
    [=](stats_atom) -> scheduler_stats {
      auto& s = self->state;
      scheduler_stats out;
      out.waiting = s.core->num_waiting();
      out.running = s.core->num_running();
      out.steps = s.core->steps();
      out.preemptions = s.core->preemptions();
      out.finished = s.finished;
      out.cancelled = s.cancelled;
      out.live_requests = int32_t(s.requests.size());
      out.kv_used_pages = s.core->used_pages();
      out.kv_sequences = s.core->pages().sequences();
      out.policy = std::string(s.core->policy().name());
      return out;
    },
  };
}

} // namespace

scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_actor_config config,
                                std::shared_ptr<engine_status> status,
                                std::shared_ptr<engine_metrics> metrics) {
  return sys.spawn(scheduler_behavior, std::move(config), std::move(status), std::move(metrics));
}

} // namespace metronome
