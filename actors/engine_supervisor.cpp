#include "actors/engine_supervisor.hpp"

#include <algorithm>
#include <deque>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "actors/engine.hpp"

namespace metronome {

namespace {

/// One replica of the engine: its scheduler (adopted) and its executor
/// (this supervisor's own child), with the executor's restart record.
struct replica_slot {
  scheduler_actor scheduler;
  runner_factory factory;
  /// The running executor; null between its failure and its restart, and
  /// while the replica is removed.
  executor_actor executor;
  /// When the executor failed and was restarted, within the window, oldest
  /// first (actor clock).
  std::deque<caf::actor_clock::time_point> restarts;
  /// Past its restart budget (data parallel only): out of the router until
  /// a retry, one restart_window later, brings an executor up again.
  bool removed = false;
};

struct engine_supervisor_state {
  engine_children children;
  /// Replica 0 first; one without data parallelism.
  std::vector<replica_slot> replicas;
  /// Why the engine is degraded; empty while it is not. The one copy:
  /// written here only, published to engine_status (degrade()).
  std::string degraded;
  static inline const char* name = "engine-supervisor";
};

using self_ptr = engine_supervisor_actor::stateful_pointer<engine_supervisor_state>;

bool data_parallel(self_ptr self) {
  return self->state.replicas.size() > 1;
}

/// " (replica i)" where there are several, for log lines.
std::string replica_note(self_ptr self, size_t i) {
  return data_parallel(self) ? " (replica " + std::to_string(i) + ")" : std::string();
}

/// Tells the router (if any) that replica `i` left or re-joined.
void tell_router(self_ptr self, size_t i, bool up) {
  if (self->state.children.router)
    self->send(self->state.children.router, ready_atom::value, int32_t(i), up);
}

/// Marks the engine degraded for good (once: the first reason stays) and
/// publishes it: engine_status for /health, the frontend and the
/// scheduler's admission, then every replica's scheduler, which fails the
/// requests still waiting.
void degrade(self_ptr self, const std::shared_ptr<engine_status>& status, std::string why,
             const std::string& last_failure) {
  auto& st = self->state;
  if (!st.degraded.empty())
    return;
  st.degraded = std::move(why);
  status->set_degraded(st.degraded);
  for (auto& r : st.replicas)
    if (r.scheduler)
      self->send(r.scheduler, executor_down_msg{last_failure, true});
}

void start_executor(self_ptr self, size_t i, bool own_thread) {
  auto& r = self->state.replicas[i];
  r.executor = spawn_linked_executor(self, r.factory, own_thread);
}

/// Replica `i`'s executor is past its restart budget, and other replicas
/// remain: it leaves the router, its scheduler fails what it holds, and a
/// fresh executor is tried once the restart window has passed. With none
/// left, the engine is degraded.
void remove_replica(self_ptr self, size_t i, const std::string& text, size_t failures,
                    const engine_supervision& policy,
                    const std::shared_ptr<engine_status>& status) {
  auto& st = self->state;
  auto& r = st.replicas[i];
  const auto window = policy.restarts.restart_window;
  r.removed = true;
  self->send(r.scheduler, executor_down_msg{text, true});
  tell_router(self, i, false);
  bool any_left = false;
  for (const auto& other : st.replicas)
    any_left = any_left || !other.removed;
  if (!any_left) {
    spdlog::critical("replica {} failed {} times within {} s ({}); no replica left: engine "
                     "degraded",
                     i, failures, window.count(), text);
    degrade(self, status,
            "the executors of all " + std::to_string(st.replicas.size())
              + " replicas failed past their restart budget (last: replica " + std::to_string(i)
              + ": " + text + ")",
            text);
    return;
  }
  spdlog::error("replica {} failed {} times within {} s ({}): removed from the router; a new "
                "executor is tried in {} s",
                i, failures, window.count(), text, window.count());
  self->delayed_send(engine_supervisor_actor{self}, window, tick_atom::value, uint64_t(i));
}

/// Replica `i`'s executor ended with `reason` (not a shutdown): restart it,
/// remove the replica, or degrade the engine.
void on_executor_failure(self_ptr self, size_t i, const caf::error& reason,
                         const engine_supervision& policy,
                         const std::shared_ptr<engine_status>& status) {
  auto& st = self->state;
  auto& r = st.replicas[i];
  const auto text = self->system().render(reason);
  if (is_device_lost(reason)) {
    // No restart can help: every request fails, the engine reports
    // degraded, and the process exits (on_device_lost) so that its service
    // manager starts a new one.
    spdlog::critical("executor failed{}: {}; the device is unusable until the process exits",
                     replica_note(self, i), text);
    degrade(self, status, text, text);
    if (policy.on_device_lost)
      policy.on_device_lost(text);
    return;
  }
  const auto& limits = policy.restarts;
  // The actor clock: CAF's test coordinator drives it in virtual time.
  const auto now = self->clock().now();
  while (!r.restarts.empty() && now - r.restarts.front() > limits.restart_window)
    r.restarts.pop_front();
  const auto failures = r.restarts.size() + 1;
  if (int32_t(r.restarts.size()) < limits.max_restarts) {
    spdlog::error("executor failed{} ({}); restarting ({} of {} allowed within {} s)",
                  replica_note(self, i), text, failures, limits.max_restarts,
                  limits.restart_window.count());
    self->send(r.scheduler, executor_down_msg{text, false});
    tell_router(self, i, false); // back with its executor_up_msg
    r.restarts.push_back(now);
    start_executor(self, i, policy.own_thread);
    return;
  }
  if (data_parallel(self)) {
    remove_replica(self, i, text, failures, policy, status);
    return;
  }
  spdlog::critical("executor failed ({}) {} times within {} s: engine degraded", text, failures,
                   limits.restart_window.count());
  degrade(self,
          status,
          "the executor failed " + std::to_string(failures) + " times within "
            + std::to_string(limits.restart_window.count()) + " s (last: " + text + ")",
          text);
}

bool is_shutdown(const caf::error& reason) {
  return !reason || reason == caf::exit_reason::user_shutdown;
}

/// The replica whose executor is `a`, or replicas.size().
size_t replica_of_executor(self_ptr self, const caf::actor_addr& a) {
  auto& reps = self->state.replicas;
  for (size_t i = 0; i < reps.size(); ++i)
    if (reps[i].executor && reps[i].executor.address() == a)
      return i;
  return reps.size();
}

/// Crashes replica `i`'s executor (fault injection for tests and drills),
/// as if its runner had thrown.
void inject_crash(self_ptr self, size_t i) {
  auto& reps = self->state.replicas;
  if (i >= reps.size() || !reps[i].executor)
    return;
  spdlog::warn("fault injection: crashing the executor{}", replica_note(self, i));
  self->send(reps[i].executor, crash_atom::value, std::string("injected crash"));
}

engine_supervisor_actor::behavior_type engine_supervisor(self_ptr self, engine_children children,
                                                         std::vector<runner_factory> factories,
                                                         engine_supervision policy,
                                                         std::shared_ptr<engine_status> status) {
  auto& st = self->state;
  st.children = std::move(children);
  std::vector<scheduler_actor> schedulers;
  if (st.children.scheduler) // none in a front end whose replicas are all workers
    schedulers.push_back(st.children.scheduler);
  for (auto& s : st.children.more_schedulers)
    schedulers.push_back(s);
  for (size_t i = 0; i < schedulers.size(); ++i)
    st.replicas.push_back({schedulers[i], factories[std::min(i, factories.size() - 1)], {}, {},
                           false});
  // Owned from here on: they end with the supervisor, and it hears of
  // their ends.
  for (auto& r : st.replicas)
    self->link_to(r.scheduler);
  if (st.children.router)
    self->link_to(st.children.router);
  if (st.children.registry)
    self->link_to(st.children.registry);
  if (st.children.drift_supervisor)
    self->link_to(st.children.drift_supervisor);
  if (st.children.stats_reporter)
    self->link_to(st.children.stats_reporter);
  if (st.children.kv_precision_supervisor)
    self->link_to(st.children.kv_precision_supervisor);
  self->set_exit_handler([=](caf::exit_msg& msg) {
    auto& s = self->state;
    auto& kids = s.children;
    if (auto i = replica_of_executor(self, msg.source); i < s.replicas.size()) {
      s.replicas[i].executor = nullptr;
      if (!is_shutdown(msg.reason))
        on_executor_failure(self, i, msg.reason, policy, status);
      return;
    }
    for (const auto& r : s.replicas) {
      if (msg.source != r.scheduler.address())
        continue;
      // Nothing runs without the scheduler: the tree goes down with it.
      if (!is_shutdown(msg.reason)) {
        const auto text = self->system().render(msg.reason);
        spdlog::critical("scheduler failed ({}): engine degraded", text);
        degrade(self, status, "the scheduler failed (" + text + ")", text);
      }
      self->quit(msg.reason);
      return;
    }
    if (kids.router && msg.source == kids.router.address()) {
      // No request reaches a replica without the router.
      if (!is_shutdown(msg.reason)) {
        const auto text = self->system().render(msg.reason);
        spdlog::critical("replica router failed ({}): engine degraded", text);
        degrade(self, status, "the replica router failed (" + text + ")", text);
      }
      self->quit(msg.reason);
      return;
    }
    if (kids.registry && msg.source == kids.registry.address()) {
      // Its workers' requests would have no one to notice their loss.
      if (!is_shutdown(msg.reason)) {
        const auto text = self->system().render(msg.reason);
        spdlog::critical("worker registry failed ({}): engine degraded", text);
        degrade(self, status, "the worker registry failed (" + text + ")", text);
      }
      self->quit(msg.reason);
      return;
    }
    if (kids.drift_supervisor && msg.source == kids.drift_supervisor.address()) {
      if (!is_shutdown(msg.reason))
        spdlog::error("drift supervisor failed ({}); the policy stays as it is",
                      self->system().render(msg.reason));
      kids.drift_supervisor = nullptr;
      return;
    }
    if (kids.kv_precision_supervisor && msg.source == kids.kv_precision_supervisor.address()) {
      if (!is_shutdown(msg.reason))
        spdlog::error("kv precision supervisor failed ({}); KV overflows are only counted",
                      self->system().render(msg.reason));
      kids.kv_precision_supervisor = nullptr;
      return;
    }
    if (kids.stats_reporter && msg.source == kids.stats_reporter.address()) {
      if (!is_shutdown(msg.reason))
        spdlog::error("stats reporter failed ({}); no more stats lines",
                      self->system().render(msg.reason));
      kids.stats_reporter = nullptr;
      return;
    }
    // From outside the tree (engine::shutdown, a linked owner): the whole
    // tree ends, through the links.
    self->quit(msg.reason);
  });
  for (size_t i = 0; i < st.replicas.size(); ++i)
    start_executor(self, i, policy.own_thread);
  return {
    [=](executor_up_msg& up) {
      const auto i = replica_of_executor(self, up.executor.address());
      if (i == self->state.replicas.size())
        return; // from an executor that has ended since: its exit came first
      std::string plan;
      for (const auto& e : up.memory_plan)
        plan += (plan.empty() ? "" : ", ") + e.name + " " + std::to_string(e.bytes >> 20) + " MiB";
      status->set_memory_plan(up.memory_plan);
      status->ready = true;
      spdlog::info("executor ready on {}{}: {} KV pages of {} tokens{}{}", up.device,
                   replica_note(self, i), up.num_pages, up.page_size,
                   plan.empty() ? "" : "; memory: ", plan);
      self->send(self->state.replicas[i].scheduler, std::move(up));
      tell_router(self, i, true);
    },
    [=](crash_atom) { inject_crash(self, 0); },
    [=](crash_atom, int32_t replica) { inject_crash(self, size_t(replica)); },
    [=](tick_atom, uint64_t replica) {
      // A removed replica's retry: a fresh executor, with a fresh budget.
      auto& s = self->state;
      if (!s.degraded.empty() || replica >= s.replicas.size() || !s.replicas[replica].removed)
        return;
      auto& r = s.replicas[replica];
      r.removed = false;
      r.restarts.clear();
      spdlog::info("replica {}: starting a new executor", replica);
      start_executor(self, size_t(replica), policy.own_thread);
    },
  };
}

} // namespace

engine_supervisor_actor spawn_engine_supervisor(caf::actor_system& sys, engine_children children,
                                                std::vector<runner_factory> factories,
                                                engine_supervision policy,
                                                std::shared_ptr<engine_status> status) {
  if (factories.empty() && children.scheduler)
    throw std::invalid_argument("spawn_engine_supervisor: no runner factory");
  return sys.spawn(engine_supervisor, std::move(children), std::move(factories),
                   std::move(policy), std::move(status));
}

engine_supervisor_actor spawn_engine_supervisor(caf::actor_system& sys, engine_children children,
                                                runner_factory factory,
                                                engine_supervision policy,
                                                std::shared_ptr<engine_status> status) {
  return spawn_engine_supervisor(sys, std::move(children),
                                 std::vector<runner_factory>{std::move(factory)},
                                 std::move(policy), std::move(status));
}

} // namespace metronome
