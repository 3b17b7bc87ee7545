// Tier 2: the scheduler actor (its scheduler grants KV pages) and a scripted
// executor under CAF's deterministic test coordinator: no threads, virtual
// time, every message delivered when the test says so.

#include <gtest/gtest.h>

#include "actors/engine.hpp"
#include "actors/scheduler_actor.hpp"
#include "tests/actors/fake_runners.hpp"
#include "tests/actors/scripted_executor.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;

using test::scripted_executor;
using test::scripted_executor_state;
using test::fake_request_state;

class scheduler_actor_test : public test::deterministic_test<> {
protected:
  scheduler_actor scheduler;
  caf::actor executor = sys.spawn(scripted_executor);
  std::vector<caf::actor> spawned;

  scheduler_actor_test() {
    scheduler = spawn_test_scheduler();
    executor_up_msg up{caf::actor_cast<executor_actor>(executor), 64, 16, "test", {}};
    caf::anon_send(scheduler, up);
    sched.run();
  }

  ~scheduler_actor_test() override {
    for (auto& a : spawned)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(scheduler, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(executor, caf::exit_reason::user_shutdown);
    sched.run();
  }

  caf::actor request(uint64_t id, int32_t prompt_len, int32_t max_tokens) {
    auto a = sys.spawn(test::fake_request<scheduler_actor>, scheduler, id, prompt_len, max_tokens);
    spawned.push_back(a);
    sched.run();
    return a;
  }

  scripted_executor_state& exec() {
    return deref<scripted_executor_state>(executor);
  }

  void finish_step(int32_t token = 9) {
    caf::anon_send(executor, tick_atom::value, token);
    sched.run();
  }
};

TEST_F(scheduler_actor_test, keeps_two_plans_queued_at_the_executor) {
  auto r = request(1, 20, 5);
  ASSERT_EQ(exec().seen.size(), 2u) << "the next plan is ready before the first step ends";
  EXPECT_EQ(exec().seen[0].chunks.at(0).num_tokens, 20);
  EXPECT_EQ(exec().seen[0].chunks.at(0).new_pages.size(), 2u);
  EXPECT_EQ(exec().seen[1].chunks.at(0).num_tokens, 1);
  EXPECT_EQ(status->kv_used_pages, 2);
  finish_step();
  EXPECT_EQ(exec().seen.size(), 3u);
  auto& got = deref<fake_request_state>(r).tokens;
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].batch_size, 1);
  // Virtual time stands still: scheduled at the clock's instant, and the
  // stand-in request says it arrived at 0.
  EXPECT_EQ(got[0].queue_ns,
            std::chrono::duration_cast<std::chrono::nanoseconds>(
              sys.clock().now().time_since_epoch()).count());
}

TEST_F(scheduler_actor_test, a_finished_request_frees_its_pages_after_its_last_plan) {
  request(1, 10, 2);
  finish_step();
  finish_step(); // second token: length reached; plan 3 may still hold it
  while (!exec().pending.empty())
    finish_step();
  EXPECT_EQ(status->kv_used_pages, 0);
  EXPECT_EQ(status->running, 0);
}

TEST_F(scheduler_actor_test, a_dead_request_actor_is_cancelled_and_its_pages_freed) {
  auto r = request(1, 40, 100);
  EXPECT_EQ(status->kv_used_pages, 3);
  finish_step();
  caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  sched.run();
  while (!exec().pending.empty())
    finish_step();
  EXPECT_EQ(status->kv_used_pages, 0);
  EXPECT_EQ(status->running, 0);
  // The runner is told to forget it with the next plan.
  request(2, 4, 1);
  EXPECT_EQ(exec().seen.back().released, std::vector<uint64_t>{1});
}

TEST_F(scheduler_actor_test, a_hung_step_has_the_executor_crashed_for_a_restart) {
  request(1, 10, 5);
  sched.advance_time(999ms);
  sched.run();
  EXPECT_TRUE(exec().crashes.empty());
  sched.advance_time(2ms);
  sched.run();
  ASSERT_FALSE(exec().crashes.empty());
  EXPECT_EQ(exec().crashes[0], "engine step timed out");
}

TEST_F(scheduler_actor_test, executor_loss_fails_running_requests_with_an_engine_error) {
  auto r = request(1, 10, 50);
  finish_step();
  caf::anon_send(scheduler, executor_down_msg{"boom", false});
  sched.run();
  auto& errs = deref<fake_request_state>(r).errors;
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_EQ(errs[0].code, request_errc::engine_failure);
  EXPECT_NE(errs[0].message.find("boom"), std::string::npos);
}

} // namespace
} // namespace metronome
