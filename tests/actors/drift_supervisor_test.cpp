// The drift supervisor actor under CAF's deterministic test coordinator: it
// subscribes to the scheduler, orders a recalibration and fcfs after
// sustained drift, restores the latency-aware policy after the cool-down,
// counts each switch in /metrics and reports them.

#include <gtest/gtest.h>

#include "caf/all.hpp"
#include "caf/scheduler/test_coordinator.hpp"

#include "actors/drift_supervisor.hpp"
#include "actors/engine_metrics.hpp"
#include "actors/messages.hpp"
#include "actors/scheduler_actor.hpp"
#include "tests/actors/fake_runners.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;

struct test_config : test::deterministic_config {
  test_config() {
    set("logger.inline-output", true);
  }
};

/// What the stand-in scheduler received.
struct scheduler_log {
  int watches = 0;
  std::vector<int64_t> recalibrations;
  std::vector<std::string> policies;
};

class drift_supervisor_test : public test::deterministic_test<test_config> {
protected:
  std::vector<caf::actor> tracked;
  std::shared_ptr<scheduler_log> seen = std::make_shared<scheduler_log>();
  std::shared_ptr<engine_metrics> metrics = std::make_shared<engine_metrics>("tiny");

  ~drift_supervisor_test() override {
    for (auto& a : tracked)
      caf::anon_send_exit(a, caf::exit_reason::kill);
    sched.run();
    sys.await_actors_before_shutdown(false);
  }

  policy_control_actor fake_scheduler() {
    auto log = seen;
    auto a = sys.spawn([=](policy_control_actor::pointer) -> policy_control_actor::behavior_type {
      return {
        [=](watch_atom) { ++log->watches; },
        [=](recalibrate_atom, int64_t window_ns) { log->recalibrations.push_back(window_ns); },
        [=](policy_atom, policy_kind p) {
          log->policies.emplace_back(to_string(p));
          return true;
        },
      };
    });
    tracked.push_back(caf::actor_cast<caf::actor>(a));
    return a;
  }

  int64_t now_ns() {
    return std::chrono::duration_cast<sched_time>(sys.clock().now().time_since_epoch()).count();
  }

  /// Samples finishing now: predicted `p`, actual `a`, baseline 0.
  std::vector<drift_sample> samples(int n, double p, int32_t a) {
    return std::vector<drift_sample>(size_t(n), drift_sample{p, a, 0.0, now_ns()});
  }

  drift_status status(const drift_supervisor_actor& sup) {
    auto out = std::make_shared<drift_status>();
    auto client = sys.spawn([=](caf::event_based_actor* self) {
      self->request(sup, caf::infinite, stats_atom::value).then([=](drift_status& s) { *out = s; });
    });
    tracked.push_back(client);
    sched.run();
    return *out;
  }

  void advance(sched_time d) {
    sched.advance_time(std::chrono::duration_cast<caf::timespan>(d));
    sched.run();
  }

  bool metric_has(const std::string& line) {
    return metrics->registry().render().find(line) != std::string::npos;
  }
};

TEST_F(drift_supervisor_test, disables_after_sustained_drift_and_restores_after_the_cool_down) {
  auto scheduler = fake_scheduler();
  drift_supervisor_config c;
  c.drift.window = 10s;
  c.drift.sustain = 2s;
  c.drift.disable_for = 5s;
  c.drift.min_samples = 3;
  c.policy = policy_kind::ladb;
  c.tick = 1s;
  auto sup = spawn_drift_supervisor(sys, scheduler, c, metrics);
  tracked.push_back(caf::actor_cast<caf::actor>(sup));
  sched.run();
  EXPECT_EQ(seen->watches, 1) << "it subscribes to the scheduler's outcomes";

  // Accurate predictions: nothing happens.
  caf::anon_send(sup, samples(5, 20, 20));
  sched.run();
  advance(3s);
  EXPECT_TRUE(seen->policies.empty());

  // Lengths jump (predicted 10, actual 40): over the limit from now on.
  caf::anon_send(sup, samples(20, 10, 40));
  sched.run();
  advance(1s);
  EXPECT_TRUE(seen->policies.empty()) << "1 s of drift < sustain";
  advance(1s);
  ASSERT_EQ(seen->policies, std::vector<std::string>{"fcfs"});
  EXPECT_EQ(seen->recalibrations, std::vector<int64_t>{int64_t(10'000'000'000)});
  EXPECT_TRUE(metric_has("metronome:policy_switches_total{policy=\"fcfs\",cause=\"drift\"} 1"));
  auto st = status(sup);
  EXPECT_TRUE(st.disabled);
  ASSERT_EQ(st.events.size(), 1u);
  EXPECT_EQ(st.events[0].action, "disable");
  EXPECT_GT(st.events[0].error, st.events[0].limit);
  EXPECT_EQ(st.samples_seen, 25);

  // Five seconds of fcfs, then ladb again.
  advance(4s);
  EXPECT_EQ(seen->policies.size(), 1u);
  advance(1s);
  EXPECT_EQ(seen->policies, (std::vector<std::string>{"fcfs", "ladb"}));
  EXPECT_TRUE(metric_has("metronome:policy_switches_total{policy=\"ladb\",cause=\"recovered\"} 1"));
  st = status(sup);
  EXPECT_FALSE(st.disabled);
  ASSERT_EQ(st.events.size(), 2u);
  EXPECT_EQ(st.events[1].action, "enable");
  EXPECT_EQ(st.events[1].policy, "ladb");
  EXPECT_EQ(st.events[1].at_ns - st.events[0].at_ns, int64_t(5'000'000'000));
}

TEST_F(drift_supervisor_test, quits_with_its_scheduler) {
  auto scheduler = fake_scheduler();
  auto sup = spawn_drift_supervisor(sys, scheduler, {}, metrics);
  tracked.push_back(caf::actor_cast<caf::actor>(sup));
  sched.run();
  auto gone = std::make_shared<bool>(false);
  auto watcher = sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    self->monitor(sup);
    self->set_down_handler([=](caf::down_msg&) { *gone = true; });
    return {[](int32_t) {}};
  });
  tracked.push_back(watcher);
  sched.run();
  caf::anon_send_exit(scheduler, caf::exit_reason::user_shutdown);
  sched.run();
  EXPECT_TRUE(*gone);
}

} // namespace
} // namespace metronome
