// Tier 2: the engine supervisor under CAF's deterministic test coordinator
// (virtual time, no threads; the executor runs on the coordinator,
// engine_supervision::own_thread = false). Its restart window runs on the
// actor clock; the degraded state is decided and published once, by it
// alone; stopping it stops every actor of the tree; its restart budget
// defaults to the configuration's.

#include <gtest/gtest.h>

#include "actors/drift_supervisor.hpp"
#include "actors/engine.hpp"
#include "actors/engine_supervisor.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/stats_reporter.hpp"
#include "config/server_config.hpp"
#include "tests/actors/fake_runners.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;

/// A runner whose submit() completes each step (as the CPU runner's); it
/// counts the runners alive, so a test sees the executor's end.
class instant_runner : public test::fake_runner {
public:
  explicit instant_runner(std::shared_ptr<int> alive)
    : fake_runner(16, 16, "instant"), alive_(std::move(alive)) {
    ++*alive_;
  }
  ~instant_runner() override {
    --*alive_;
  }
  step_output execute(const step_plan& plan) override {
    step_output out;
    out.step = plan.step;
    return out;
  }

private:
  std::shared_ptr<int> alive_;
};

/// The scheduler's stand-in: what the supervisor reports to it.
struct report_state {
  std::vector<executor_up_msg> ups;
  std::vector<executor_down_msg> downs;
};

caf::behavior report_recorder(caf::stateful_actor<report_state>* self) {
  return {
    [=](executor_up_msg& up) { self->state.ups.push_back(std::move(up)); },
    [=](executor_down_msg& down) { self->state.downs.push_back(std::move(down)); },
  };
}

/// Sends `a` an exit message with an error (anon_send_exit takes only an
/// exit_reason): as if it failed.
template <class Handle>
void fail(const Handle& a, const std::string& why) {
  auto ptr = caf::actor_cast<caf::strong_actor_ptr>(a);
  ptr->enqueue(nullptr, caf::make_message_id(),
               caf::make_message(
                 caf::exit_msg{ptr->address(), caf::make_error(caf::sec::runtime_error, why)}),
               nullptr);
}

bool terminated(const caf::strong_actor_ptr& a) {
  return caf::actor_cast<caf::abstract_actor*>(a)->getf(caf::abstract_actor::is_terminated_flag);
}

class engine_supervisor_test : public test::deterministic_test<> {
protected:
  std::shared_ptr<int> runners = std::make_shared<int>(0);
  caf::actor recorder;
  engine_supervisor_actor supervisor;

  ~engine_supervisor_test() override {
    if (recorder)
      got().ups.clear(); // their executor handles
    if (supervisor)
      caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
    if (recorder)
      caf::anon_send_exit(recorder, caf::exit_reason::user_shutdown);
    sched.run();
  }

  runner_factory factory() {
    return [n = runners] { return std::make_unique<instant_runner>(n); };
  }

  /// A supervisor reporting to a recorder, allowing `max_restarts` within
  /// `window`.
  void start(int32_t max_restarts, std::chrono::seconds window) {
    recorder = sys.spawn(report_recorder);
    engine_supervision policy{{max_restarts, window}, false, {}};
    supervisor = spawn_engine_supervisor(
      sys, {caf::actor_cast<scheduler_actor>(recorder), {}, {}}, factory(), policy, status);
    sched.run();
    ASSERT_EQ(got().ups.size(), 1u) << "the executor did not start";
  }

  report_state& got() {
    return deref<report_state>(recorder);
  }

  /// Crashes the executor now (fault injection through the supervisor).
  void crash() {
    caf::anon_send(supervisor, crash_atom::value);
    sched.run();
  }
};

TEST_F(engine_supervisor_test, counts_failures_within_the_restart_window_on_the_actor_clock) {
  // Two restarts within 60 s. The clock moves only when the test says so: a
  // supervisor reading the wall clock sees the failures at 0 s, 30 s and
  // 61 s as one burst and gives up at the third.
  start(2, 60s);
  crash(); // t = 0 s: restart 1 of 2 within [0, 60]
  sched.advance_time(30s);
  crash(); // t = 30 s: restart 2 of 2 within [0, 60]
  sched.advance_time(31s);
  crash(); // t = 61 s: the failure at 0 s has left the window: restart
  ASSERT_EQ(got().downs.size(), 3u);
  EXPECT_FALSE(got().downs[0].permanent);
  EXPECT_FALSE(got().downs[1].permanent);
  EXPECT_FALSE(got().downs[2].permanent) << "a failure 61 s ago still counted";
  EXPECT_EQ(got().ups.size(), 4u);
  EXPECT_FALSE(status->degraded);
  crash(); // t = 61 s: the failures at 30 s and 61 s fill the window
  ASSERT_EQ(got().downs.size(), 4u);
  EXPECT_TRUE(got().downs[3].permanent);
  EXPECT_EQ(got().ups.size(), 4u);
  EXPECT_TRUE(status->degraded);
  EXPECT_EQ(*runners, 0) << "no executor after the engine is degraded";
}

TEST_F(engine_supervisor_test, failures_inside_the_window_degrade_after_max_restarts) {
  start(3, 60s);
  for (int i = 0; i < 3; ++i) {
    crash();
    sched.advance_time(10s);
  }
  EXPECT_FALSE(status->degraded) << "three restarts are allowed";
  EXPECT_EQ(got().ups.size(), 4u);
  crash(); // the fourth failure within 40 s
  EXPECT_TRUE(status->degraded);
  EXPECT_NE(status->reason().find("failed 4 times within 60 s"), std::string::npos)
    << status->reason();
}

TEST_F(engine_supervisor_test, failures_spaced_beyond_the_window_keep_restarting) {
  start(1, 60s);
  for (int i = 0; i < 10; ++i) {
    crash();
    sched.advance_time(61s);
  }
  EXPECT_FALSE(status->degraded);
  EXPECT_EQ(got().ups.size(), 11u) << "every failure restarted the executor";
  ASSERT_EQ(got().downs.size(), 10u);
  for (const auto& d : got().downs)
    EXPECT_FALSE(d.permanent);
}

TEST_F(engine_supervisor_test, the_degraded_state_is_published_once_by_the_supervisor) {
  start(0, 60s);
  EXPECT_TRUE(status->reason().empty());
  crash();
  EXPECT_TRUE(status->degraded);
  const auto reason = status->reason();
  EXPECT_NE(reason.find("injected crash"), std::string::npos) << reason;
  // Nothing more happens: no executor to crash, no second decision.
  crash();
  sched.advance_time(120s);
  crash();
  ASSERT_EQ(got().downs.size(), 1u) << "the scheduler is told once";
  EXPECT_TRUE(got().downs[0].permanent);
  EXPECT_EQ(status->reason(), reason);
  EXPECT_EQ(got().ups.size(), 1u);
}

TEST_F(engine_supervisor_test, the_restart_budget_defaults_to_the_configurations) {
  const executor_supervisor_section config;
  EXPECT_EQ(restart_policy{}.max_restarts, config.max_restarts);
  EXPECT_EQ(restart_policy{}.restart_window.count(), int64_t(config.restart_window_s));
  EXPECT_EQ(engine_options{}.restarts.max_restarts, config.max_restarts);
  EXPECT_EQ(engine_options{}.restarts.restart_window, restart_policy{}.restart_window);
}

/// The whole tree: the real scheduler, drift supervisor and stats reporter,
/// and an executor.
class engine_supervisor_tree_test : public engine_supervisor_test {
protected:
  engine_children kids;

  void start_tree() {
    scheduler_actor_config sc;
    sc.scheduler.limits.max_model_len = 1024;
    kids.scheduler = spawn_scheduler(sys, sc, status, nullptr);
    kids.drift_supervisor = spawn_drift_supervisor(sys, kids.scheduler, {}, nullptr);
    kids.stats_reporter
      = spawn_stats_reporter(sys, kids.scheduler.address(), std::make_shared<engine_metrics>("t"),
                             status, 10s);
    supervisor = spawn_engine_supervisor(sys, kids, factory(), {{1, 60s}, false, {}}, status);
    sched.run();
    ASSERT_TRUE(status->ready) << "the executor did not start";
    ASSERT_EQ(*runners, 1);
  }

  /// Every actor of the tree has ended, the executor's runner with it.
  void expect_all_stopped() {
    EXPECT_TRUE(terminated(caf::actor_cast<caf::strong_actor_ptr>(supervisor)));
    EXPECT_TRUE(terminated(caf::actor_cast<caf::strong_actor_ptr>(kids.scheduler)));
    EXPECT_TRUE(terminated(caf::actor_cast<caf::strong_actor_ptr>(kids.drift_supervisor)));
    EXPECT_TRUE(terminated(caf::actor_cast<caf::strong_actor_ptr>(kids.stats_reporter)));
    EXPECT_EQ(*runners, 0) << "the executor is still alive";
  }
};

TEST_F(engine_supervisor_tree_test, stopping_the_supervisor_stops_every_actor_of_the_tree) {
  start_tree();
  caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
  sched.run();
  expect_all_stopped();
  EXPECT_FALSE(status->degraded) << "a shutdown is no failure";
}

TEST_F(engine_supervisor_tree_test, killing_the_supervisor_stops_every_actor_of_the_tree) {
  start_tree();
  caf::anon_send_exit(supervisor, caf::exit_reason::kill);
  sched.run();
  expect_all_stopped();
}

TEST_F(engine_supervisor_tree_test, a_failed_scheduler_takes_the_tree_down_and_degrades_the_engine) {
  start_tree();
  fail(kids.scheduler, "scheduler bug");
  sched.run();
  expect_all_stopped();
  EXPECT_TRUE(status->degraded);
  EXPECT_NE(status->reason().find("the scheduler failed"), std::string::npos) << status->reason();
}

TEST_F(engine_supervisor_tree_test, a_failed_watcher_is_forgotten_and_the_engine_keeps_running) {
  start_tree();
  fail(kids.stats_reporter, "oops");
  sched.run();
  EXPECT_TRUE(terminated(caf::actor_cast<caf::strong_actor_ptr>(kids.stats_reporter)));
  EXPECT_FALSE(terminated(caf::actor_cast<caf::strong_actor_ptr>(supervisor)));
  EXPECT_FALSE(terminated(caf::actor_cast<caf::strong_actor_ptr>(kids.scheduler)));
  EXPECT_FALSE(status->degraded);
  caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
  sched.run();
  EXPECT_TRUE(terminated(caf::actor_cast<caf::strong_actor_ptr>(kids.drift_supervisor)));
  EXPECT_EQ(*runners, 0);
}

} // namespace
} // namespace metronome
