// Tier 2: data parallel under CAF's deterministic test coordinator
// (virtual time, no threads). Three replicas, each a real scheduler with an
// executor (on the coordinator) under one engine supervisor, behind the
// replica router; stand-in request actors admit through the router. The
// tests check what issue 38 asks of the actors: requests are placed by
// load; a replica whose executor dies past its restart budget is removed
// (its requests fail with an engine error and give back their KV pages,
// new ones go elsewhere, late admissions to it are refused) and re-joins
// once a new executor is up; within the budget it is out only while its
// executor restarts; with no replica left the engine is degraded.

#include <gtest/gtest.h>

#include "actors/engine.hpp"
#include "actors/engine_metrics.hpp"
#include "actors/engine_supervisor.hpp"
#include "actors/replica_router_actor.hpp"
#include "actors/scheduler_actor.hpp"
#include "tests/actors/fake_runners.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;
using test::fake_request_state;

constexpr int32_t replicas = 3;

/// A table_runner whose steps never end while `held` is set: what it was
/// given stays where the router placed it.
class replica_runner : public test::table_runner {
public:
  replica_runner(std::shared_ptr<int> starts, bool held) : held_(held) {
    ++*starts;
  }
  void submit(const step_plan& plan) override {
    if (!held_)
      return test::table_runner::submit(plan);
    ++in_flight_;
  }
  size_t in_flight() const override {
    return held_ ? in_flight_ : test::table_runner::in_flight();
  }
  bool ready() override {
    return held_ ? false : test::table_runner::ready();
  }

private:
  bool held_;
  size_t in_flight_ = 0;
};

class data_parallel_test : public test::deterministic_test<> {
protected:
  std::vector<scheduler_actor> schedulers;
  replica_router_actor router;
  engine_supervisor_actor supervisor;
  std::shared_ptr<engine_metrics> metrics = std::make_shared<engine_metrics>("t");
  std::shared_ptr<int> starts = std::make_shared<int>(0);
  std::vector<caf::actor> spawned;
  uint64_t next_id = 1;

  ~data_parallel_test() override {
    for (auto& a : spawned)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    if (supervisor)
      caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
    sched.run();
  }

  /// Three replicas allowing `max_restarts` restarts within 60 s each;
  /// `held`: their steps never end.
  void start(int32_t max_restarts, bool held = true) {
    status->set_replicas(replicas);
    metrics->enable_replicas(replicas);
    for (int32_t i = 0; i < replicas; ++i) {
      scheduler_actor_config sc;
      sc.scheduler.limits.max_model_len = 1024;
      sc.scheduler.limits.step_timeout = 1h; // held steps are no hang here
      sc.replica = i;
      schedulers.push_back(spawn_scheduler(sys, sc, status, metrics));
    }
    replica_router_config rc;
    rc.replicas = replicas;
    rc.prefix_affinity = false;
    router = spawn_replica_router(sys, rc, schedulers, status, metrics);
    engine_children kids{schedulers[0], {}, {}, {schedulers[1], schedulers[2]}, router};
    supervisor = spawn_engine_supervisor(
      sys, kids,
      [n = starts, held]() -> std::unique_ptr<model_runner> {
        return std::make_unique<replica_runner>(n, held);
      },
      {{max_restarts, 60s}, false, {}}, status);
    sched.run();
    ASSERT_EQ(*starts, replicas);
    for (int32_t i = 0; i < replicas; ++i)
      ASSERT_EQ(status->replica(i).kv_total_pages, 64) << "replica " << i << " did not come up";
  }

  /// A request admitted through the router, run as far as it goes.
  caf::actor request(int32_t prompt_len, int32_t max_tokens) {
    auto a = sys.spawn(test::fake_request<replica_router_actor>, router, next_id++, prompt_len,
                       max_tokens);
    spawned.push_back(a);
    sched.run();
    return a;
  }

  /// Requests replica `i` holds (running or waiting).
  int32_t held_by(int32_t i) {
    return status->replica(i).running + status->replica(i).waiting;
  }

  std::string render_metrics_text() {
    return metrics->render(*status);
  }

  fake_request_state& state_of(const caf::actor& a) {
    return deref<fake_request_state>(a);
  }

  void crash(int32_t replica) {
    caf::anon_send(supervisor, crash_atom::value, replica);
    sched.run();
  }
};

TEST_F(data_parallel_test, requests_go_to_the_least_loaded_replica) {
  start(1);
  request(100, 10); // 110 tokens: replica 0 (all empty: the lowest index)
  request(10, 10);  // 20: replica 1
  request(10, 10);  // 20: replica 2
  request(10, 10);  // replicas 1 and 2 tie at 20 tokens and one request: 1
  EXPECT_EQ(held_by(0), 1);
  EXPECT_EQ(held_by(1), 2);
  EXPECT_EQ(held_by(2), 1);
  EXPECT_EQ(status->running + status->waiting, 4) << "the engine's figures are the sums";
  const auto text = render_metrics_text();
  EXPECT_NE(text.find("metronome:replica_routed_requests_total{replica=\"1\"} 2"),
            std::string::npos)
    << text;
  EXPECT_NE(text.find("metronome:replica_num_requests_running{replica=\"0\"} 1"),
            std::string::npos);
}

TEST_F(data_parallel_test, tokens_come_from_the_replica_straight_to_the_request) {
  start(1, false);
  auto a = request(20, 3);
  auto b = request(20, 3);
  for (const auto& r : {a, b}) {
    EXPECT_TRUE(state_of(r).errors.empty());
    EXPECT_TRUE(state_of(r).finished);
    EXPECT_EQ(state_of(r).tokens.size(), 3u);
  }
  EXPECT_EQ(status->kv_used_pages, 0);
}

TEST_F(data_parallel_test, a_replica_past_its_budget_is_removed_and_its_requests_fail_cleanly) {
  start(0);
  auto a = request(40, 10);
  auto b = request(40, 10);
  auto c = request(40, 10);
  ASSERT_EQ(held_by(1), 1);
  ASSERT_GT(status->replica(1).kv_used_pages, 0);
  crash(1);
  // b, on replica 1, fails with an engine error; its pages are back.
  ASSERT_EQ(state_of(b).errors.size(), 1u);
  EXPECT_EQ(state_of(b).errors[0].code, request_errc::engine_failure);
  EXPECT_NE(state_of(b).errors[0].message.find("injected crash"), std::string::npos);
  EXPECT_EQ(status->replica(1).kv_used_pages, 0);
  EXPECT_EQ(held_by(1), 0);
  EXPECT_FALSE(status->replica(1).up);
  EXPECT_FALSE(status->degraded) << "two replicas are left";
  EXPECT_TRUE(state_of(a).errors.empty());
  EXPECT_TRUE(state_of(c).errors.empty());
  // New requests avoid it, although it is the least loaded.
  auto d = request(10, 10);
  auto e = request(10, 10);
  EXPECT_EQ(held_by(1), 0);
  EXPECT_EQ(held_by(0) + held_by(2), 4);
  EXPECT_TRUE(state_of(d).errors.empty());
  EXPECT_TRUE(state_of(e).errors.empty());
  EXPECT_EQ(*starts, replicas) << "no restart past the budget";
}

TEST_F(data_parallel_test, an_admission_reaching_a_removed_replica_is_refused_at_once) {
  start(0);
  crash(1);
  // As if the router had placed it just before it heard of the removal.
  auto late = sys.spawn(test::fake_request<scheduler_actor>, schedulers[1], next_id++, 10, 10);
  spawned.push_back(late);
  sched.run();
  ASSERT_EQ(state_of(late).errors.size(), 1u);
  EXPECT_EQ(state_of(late).errors[0].code, request_errc::unavailable);
}

TEST_F(data_parallel_test, a_removed_replica_rejoins_once_a_new_executor_is_up) {
  start(0);
  crash(1);
  sched.advance_time(59s);
  sched.run();
  EXPECT_EQ(*starts, replicas) << "the retry waits for the restart window";
  EXPECT_FALSE(status->replica(1).up);
  sched.advance_time(1s);
  sched.run();
  EXPECT_EQ(*starts, replicas + 1) << "a new executor for replica 1";
  EXPECT_TRUE(status->replica(1).up);
  EXPECT_EQ(status->replica(1).kv_total_pages, 64);
  request(40, 10); // replica 0
  request(40, 10); // replica 1, back and empty like 2: the lower index
  EXPECT_EQ(held_by(1), 1);
  // With a fresh budget (0 restarts): its next failure removes it again.
  crash(1);
  EXPECT_FALSE(status->replica(1).up);
  EXPECT_EQ(*starts, replicas + 1);
}

TEST_F(data_parallel_test, within_its_budget_a_replica_is_out_only_while_it_restarts) {
  start(1);
  auto a = request(10, 10); // replica 0
  auto b = request(10, 10); // replica 1
  crash(1);
  ASSERT_EQ(state_of(b).errors.size(), 1u);
  EXPECT_EQ(state_of(b).errors[0].code, request_errc::engine_failure);
  // A request actor ends after its error: the router drops its load.
  caf::anon_send_exit(b, caf::exit_reason::user_shutdown);
  EXPECT_EQ(*starts, replicas + 1) << "restarted at once";
  EXPECT_TRUE(status->replica(1).up) << "back with its executor";
  request(10, 10); // replica 1 again: empty, like 2
  EXPECT_EQ(held_by(1), 1);
  EXPECT_TRUE(state_of(a).errors.empty());
  const auto text = render_metrics_text();
  EXPECT_NE(text.find("metronome:replica_executor_restarts_total{replica=\"1\"} 1"),
            std::string::npos)
    << text;
}

TEST_F(data_parallel_test, with_no_replica_left_the_engine_is_degraded) {
  start(0);
  for (int32_t i = 0; i < replicas; ++i)
    crash(i);
  EXPECT_TRUE(status->degraded);
  EXPECT_NE(status->reason().find("all 3 replicas"), std::string::npos) << status->reason();
  auto late = request(10, 10);
  ASSERT_EQ(state_of(late).errors.size(), 1u);
  EXPECT_EQ(state_of(late).errors[0].code, request_errc::unavailable);
  sched.advance_time(61s);
  sched.run();
  EXPECT_EQ(*starts, replicas) << "no retry once the engine is degraded";
}

} // namespace
} // namespace metronome
