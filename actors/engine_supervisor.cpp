#include "actors/engine_supervisor.hpp"

#include <deque>

#include <spdlog/spdlog.h>

#include "actors/engine.hpp"

namespace metronome {

namespace {

struct engine_supervisor_state {
  engine_children children;
  /// The running executor; null between its failure and its restart, and
  /// for good once the engine is degraded.
  executor_actor executor;
  /// When the executor failed and was restarted, within the window, oldest
  /// first (actor clock).
  std::deque<caf::actor_clock::time_point> restarts;
  /// Why the engine is degraded; empty while it is not. The one copy:
  /// written here only, published to engine_status (degrade()).
  std::string degraded;
  static inline const char* name = "engine-supervisor";
};

using self_ptr = engine_supervisor_actor::stateful_pointer<engine_supervisor_state>;

/// Marks the engine degraded for good (once: the first reason stays) and
/// publishes it: engine_status for /health, the frontend and the
/// scheduler's admission, then the scheduler, which fails the requests
/// still waiting.
void degrade(self_ptr self, const std::shared_ptr<engine_status>& status, std::string why,
             const std::string& last_failure) {
  auto& st = self->state;
  if (!st.degraded.empty())
    return;
  st.degraded = std::move(why);
  status->set_degraded(st.degraded);
  if (st.children.scheduler)
    self->send(st.children.scheduler, executor_down_msg{last_failure, true});
}

void start_executor(self_ptr self, const runner_factory& factory, bool own_thread) {
  self->state.executor = spawn_linked_executor(self, factory, own_thread);
}

/// The executor ended with `reason` (not a shutdown): restart it, or
/// degrade the engine.
void on_executor_failure(self_ptr self, const caf::error& reason, const runner_factory& factory,
                         const engine_supervision& policy,
                         const std::shared_ptr<engine_status>& status) {
  auto& st = self->state;
  const auto text = self->system().render(reason);
  if (is_device_lost(reason)) {
    // No restart can help: every request fails, the engine reports
    // degraded, and the process exits (on_device_lost) so that its service
    // manager starts a new one.
    spdlog::critical("executor failed: {}; the device is unusable until the process exits", text);
    degrade(self, status, text, text);
    if (policy.on_device_lost)
      policy.on_device_lost(text);
    return;
  }
  const auto& limits = policy.restarts;
  // The actor clock: CAF's test coordinator drives it in virtual time.
  const auto now = self->clock().now();
  while (!st.restarts.empty() && now - st.restarts.front() > limits.restart_window)
    st.restarts.pop_front();
  const auto failures = st.restarts.size() + 1;
  if (int32_t(st.restarts.size()) < limits.max_restarts) {
    spdlog::error("executor failed ({}); restarting ({} of {} allowed within {} s)", text,
                  failures, limits.max_restarts, limits.restart_window.count());
    self->send(st.children.scheduler, executor_down_msg{text, false});
    st.restarts.push_back(now);
    start_executor(self, factory, policy.own_thread);
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

engine_supervisor_actor::behavior_type engine_supervisor(self_ptr self, engine_children children,
                                                         runner_factory factory,
                                                         engine_supervision policy,
                                                         std::shared_ptr<engine_status> status) {
  auto& st = self->state;
  st.children = std::move(children);
  // Owned from here on: they end with the supervisor, and it hears of
  // their ends.
  self->link_to(st.children.scheduler);
  if (st.children.drift_supervisor)
    self->link_to(st.children.drift_supervisor);
  if (st.children.stats_reporter)
    self->link_to(st.children.stats_reporter);
  self->set_exit_handler([=](caf::exit_msg& msg) {
    auto& s = self->state;
    auto& kids = s.children;
    if (s.executor && msg.source == s.executor.address()) {
      s.executor = nullptr;
      if (!is_shutdown(msg.reason))
        on_executor_failure(self, msg.reason, factory, policy, status);
      return;
    }
    if (msg.source == kids.scheduler.address()) {
      // Nothing runs without the scheduler: the tree goes down with it.
      if (!is_shutdown(msg.reason)) {
        const auto text = self->system().render(msg.reason);
        spdlog::critical("scheduler failed ({}): engine degraded", text);
        degrade(self, status, "the scheduler failed (" + text + ")", text);
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
  start_executor(self, factory, policy.own_thread);
  return {
    [=](executor_up_msg& up) {
      std::string plan;
      for (const auto& e : up.memory_plan)
        plan += (plan.empty() ? "" : ", ") + e.name + " " + std::to_string(e.bytes >> 20) + " MiB";
      status->set_memory_plan(up.memory_plan);
      status->ready = true;
      spdlog::info("executor ready on {}: {} KV pages of {} tokens{}{}", up.device, up.num_pages,
                   up.page_size, plan.empty() ? "" : "; memory: ", plan);
      self->send(self->state.children.scheduler, std::move(up));
    },
    [=](crash_atom) {
      // Fault injection for tests and drills: the executor dies as if its
      // runner had thrown.
      spdlog::warn("fault injection: crashing the executor");
      if (self->state.executor)
        self->send(self->state.executor, crash_atom::value, std::string("injected crash"));
    },
  };
}

} // namespace

engine_supervisor_actor spawn_engine_supervisor(caf::actor_system& sys, engine_children children,
                                                runner_factory factory,
                                                engine_supervision policy,
                                                std::shared_ptr<engine_status> status) {
  return sys.spawn(engine_supervisor, std::move(children), std::move(factory), std::move(policy),
                   std::move(status));
}

} // namespace metronome
