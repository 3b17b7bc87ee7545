// Tier 2: executor faults under CAF's deterministic test coordinator. The
// real scheduler actor, engine supervisor and executor (on the
// coordinator: engine_supervision::own_thread = false) run a runner that
// computes nothing (it samples token 9 wherever a chunk completes its
// sequence), wrapped by the fault injection of engine.fault_injection
// (model/fault_injection.hpp). For each fault (a step that throws, one that
// never ends, a device error, a lost device) the tests check what issue 39
// asks: the requests in flight end with an engine error, their KV pages
// return to the pool, the supervisor restarts the executor and a new
// request succeeds; after the restart budget the engine is degraded, says
// why, and refuses new requests at once; a lost device is not restarted
// but reported for the process to exit.

#include <gtest/gtest.h>

#include "actors/engine.hpp"
#include "actors/engine_supervisor.hpp"
#include "actors/request_actor.hpp"
#include "actors/scheduler_actor.hpp"
#include "model/fault_injection.hpp"
#include "tests/actors/fake_runners.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;

constexpr int32_t total_pages = 64;
constexpr int32_t page_tokens = 16;

using test::table_runner;

/// A runner on a device that never finishes a step (a CUDA kernel that
/// does not return): nothing is ever ready, and it says the device is stuck.
class stuck_device_runner : public table_runner {
public:
  void submit(const step_plan&) override {
    ++in_flight_;
  }
  size_t in_flight() const override {
    return in_flight_;
  }
  bool ready() override {
    return false;
  }
  bool device_stuck() override {
    return in_flight_ > 0;
  }

private:
  size_t in_flight_ = 0;
};

using test::fake_request_state;

class executor_faults_test : public test::deterministic_test<> {
protected:
  scheduler_actor scheduler;
  engine_supervisor_actor supervisor;
  std::vector<caf::actor> spawned;
  /// Runners built: the first start and every restart.
  std::shared_ptr<int> starts = std::make_shared<int>(0);
  /// What on_device_lost was called with (serve exits there).
  std::shared_ptr<std::vector<std::string>> lost
    = std::make_shared<std::vector<std::string>>();
  uint64_t next_id = 1;

  executor_faults_test() {
    scheduler = spawn_test_scheduler();
  }

  ~executor_faults_test() override {
    for (auto& a : spawned)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    if (supervisor)
      caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(scheduler, caf::exit_reason::user_shutdown);
    sched.run();
  }

  /// Starts the supervisor (and its executor) with runners that fail as
  /// `spec` says, allowing `max_restarts` restarts within 60 s.
  template <class Runner = table_runner>
  void start(const std::string& spec, int32_t max_restarts) {
    auto faults = fault_injection::parse(spec);
    ASSERT_TRUE(faults) << spec;
    engine_supervision policy{{max_restarts, std::chrono::seconds(60)}, false, {}};
    policy.on_device_lost = [l = lost](const std::string& why) { l->push_back(why); };
    supervisor = spawn_engine_supervisor(
      sys, {scheduler, {}, {}},
      [n = starts, f = *faults] {
        ++*n;
        return with_faults(std::make_unique<Runner>(), f);
      },
      policy, status);
    sched.run();
    ASSERT_EQ(*starts, 1);
    ASSERT_EQ(status->kv_total_pages, total_pages) << "the executor did not come up";
  }

  /// A request, admitted once the test runs the coordinator.
  caf::actor spawn_request(int32_t prompt_len, int32_t max_tokens) {
    auto a = sys.spawn(test::fake_request<scheduler_actor>, scheduler, next_id++, prompt_len, max_tokens);
    spawned.push_back(a);
    return a;
  }

  /// A request, admitted and run as far as it goes.
  caf::actor request(int32_t prompt_len, int32_t max_tokens) {
    auto a = spawn_request(prompt_len, max_tokens);
    sched.run();
    return a;
  }

  fake_request_state& state_of(const caf::actor& a) {
    return deref<fake_request_state>(a);
  }

  /// The pool is whole again: no page in use, every page of the runner's
  /// pool there, no request left running.
  void expect_pages_back() {
    EXPECT_EQ(status->kv_used_pages, 0);
    EXPECT_EQ(status->kv_total_pages, total_pages);
    EXPECT_EQ(status->running, 0);
  }

  /// A request after the fault runs to its end.
  void expect_new_request_succeeds() {
    auto r = request(10, 2);
    EXPECT_TRUE(state_of(r).errors.empty())
      << state_of(r).errors.front().message;
    EXPECT_TRUE(state_of(r).finished);
    EXPECT_EQ(state_of(r).tokens.size(), 2u);
    expect_pages_back();
  }

  /// `r` failed once with an engine error naming `what`.
  void expect_engine_failure(const caf::actor& r, const std::string& what) {
    const auto& errs = state_of(r).errors;
    ASSERT_EQ(errs.size(), 1u);
    EXPECT_EQ(errs[0].code, request_errc::engine_failure);
    EXPECT_NE(errs[0].message.find(what), std::string::npos) << errs[0].message;
    EXPECT_FALSE(state_of(r).finished);
  }
};

TEST_F(executor_faults_test, a_step_that_throws_fails_its_requests_returns_pages_and_restarts) {
  start("throw_after:3", 3);
  auto a = spawn_request(40, 50); // 3 pages
  auto b = spawn_request(20, 50); // 2 pages; both run in steps 1 to 3, step 4 throws
  sched.run();
  ASSERT_EQ(state_of(a).tokens.size(), 3u);
  expect_engine_failure(a, "injected fault: step 4 of this executor threw");
  expect_engine_failure(b, "injected fault: step 4");
  EXPECT_EQ(*starts, 2) << "restarted once";
  EXPECT_FALSE(status->degraded);
  expect_pages_back();
  expect_new_request_succeeds();
}

TEST_F(executor_faults_test, a_hung_step_is_given_up_at_the_step_timeout_and_the_executor_restarted) {
  start("hang_after:3", 3);
  auto a = request(40, 50);
  ASSERT_EQ(state_of(a).tokens.size(), 3u) << "steps 1 to 3 ran";
  EXPECT_GT(status->kv_used_pages, 0);
  // Step 4 never ends: nothing happens until the scheduler's step timeout.
  sched.advance_time(999ms);
  sched.run();
  EXPECT_TRUE(state_of(a).errors.empty());
  EXPECT_EQ(*starts, 1);
  // A request that arrives meanwhile waits; it runs after the restart.
  auto waiting = request(10, 2);
  EXPECT_TRUE(state_of(waiting).tokens.empty());
  sched.advance_time(2ms);
  sched.run();
  expect_engine_failure(a, "engine step timed out");
  EXPECT_EQ(*starts, 2) << "restarted once";
  EXPECT_TRUE(state_of(waiting).errors.empty());
  EXPECT_TRUE(state_of(waiting).finished) << "the waiting request ran on the new executor";
  EXPECT_EQ(state_of(waiting).tokens.size(), 2u);
  EXPECT_FALSE(status->degraded);
  EXPECT_TRUE(lost->empty()) << "an injected hang leaves the device usable";
  expect_pages_back();
}

TEST_F(executor_faults_test, a_device_error_fails_its_requests_returns_pages_and_restarts) {
  start("device_error_after:2", 3);
  auto a = request(40, 50);
  ASSERT_EQ(state_of(a).tokens.size(), 2u);
  expect_engine_failure(a, "injected fault: step 3 of this executor hit a device error");
  EXPECT_EQ(*starts, 2);
  EXPECT_FALSE(status->degraded);
  EXPECT_TRUE(lost->empty());
  expect_pages_back();
  expect_new_request_succeeds();
}

TEST_F(executor_faults_test, a_lost_device_is_not_restarted_the_engine_degrades_and_the_process_is_told) {
  start("device_lost_after:2", 3);
  auto a = request(40, 50);
  expect_engine_failure(a, "lost the device");
  EXPECT_EQ(*starts, 1) << "no restart on a lost device";
  EXPECT_TRUE(status->degraded);
  ASSERT_EQ(lost->size(), 1u);
  EXPECT_NE(lost->front().find("device lost"), std::string::npos) << lost->front();
  EXPECT_NE(status->reason().find("lost the device"), std::string::npos) << status->reason();
  EXPECT_EQ(status->kv_used_pages, 0);
  // Refused at once, not at a timeout.
  auto late = request(10, 2);
  ASSERT_EQ(state_of(late).errors.size(), 1u);
  EXPECT_EQ(state_of(late).errors[0].code, request_errc::unavailable);
}

TEST_F(executor_faults_test, a_step_the_device_never_ends_counts_as_a_lost_device) {
  // The CUDA runner's case: at the step timeout the scheduler gives up, and
  // the runner says its device still runs the step (device_stuck()): no
  // runner could use the device in this process, so no restart.
  start<stuck_device_runner>("none", 3);
  auto a = request(40, 50);
  sched.advance_time(1001ms);
  sched.run();
  expect_engine_failure(a, "engine step timed out");
  EXPECT_EQ(*starts, 1);
  EXPECT_TRUE(status->degraded);
  ASSERT_EQ(lost->size(), 1u);
  EXPECT_NE(lost->front().find("the device has not finished the step"), std::string::npos)
    << lost->front();
  EXPECT_EQ(status->kv_used_pages, 0);
}

TEST_F(executor_faults_test, after_the_restart_budget_the_engine_is_degraded_and_refuses_at_once) {
  // Every executor fails at its second step; two restarts are allowed.
  start("throw_after:1", 2);
  for (int i = 0; i < 3; ++i) {
    auto r = request(20, 50);
    expect_engine_failure(r, "injected fault: step 2");
    EXPECT_EQ(status->kv_used_pages, 0);
  }
  EXPECT_EQ(*starts, 3) << "two restarts, then none";
  EXPECT_TRUE(status->degraded);
  EXPECT_NE(status->reason().find("failed 3 times within 60 s"), std::string::npos)
    << status->reason();
  EXPECT_TRUE(lost->empty()) << "a degraded engine keeps the process";
  auto late = request(10, 2);
  ASSERT_EQ(state_of(late).errors.size(), 1u) << "refused at once";
  EXPECT_EQ(state_of(late).errors[0].code, request_errc::unavailable);
  EXPECT_TRUE(state_of(late).tokens.empty());
}

TEST_F(executor_faults_test, the_frontend_and_the_scheduler_agree_on_the_one_degraded_state) {
  // The supervisor decides and publishes (engine_status); the scheduler's
  // admission and the frontend read that one source.
  start("throw_after:0", 0);
  auto ctx = std::make_shared<request_context>();
  ctx->scheduler = scheduler;
  ctx->status = status;
  auto frontend = spawn_frontend(sys, ctx);
  spawned.push_back(caf::actor_cast<caf::actor>(frontend));
  EXPECT_FALSE(status->degraded);
  auto r = request(20, 50); // its first step throws, and no restart is allowed
  expect_engine_failure(r, "injected fault: step 1");
  ASSERT_TRUE(status->degraded);
  EXPECT_NE(status->reason().find("failed 1 times within 60 s"), std::string::npos)
    << status->reason();
  // The scheduler refuses at once...
  auto late = request(10, 2);
  ASSERT_EQ(state_of(late).errors.size(), 1u);
  EXPECT_EQ(state_of(late).errors[0].code, request_errc::unavailable);
  // ... and so does the frontend, before any request actor exists.
  auto got = std::make_shared<std::optional<generation_error>>();
  auto client = sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    generate_request req;
    req.request_id = "late";
    req.prompt = "x";
    self->send(frontend, std::move(req));
    return {
      [=](generation_error& e) { *got = e; },
      [](text_delta&) {},
      [](generation_done&) {},
    };
  });
  spawned.push_back(client);
  sched.run();
  ASSERT_TRUE(*got);
  EXPECT_EQ((*got)->code, request_errc::unavailable);
  EXPECT_EQ(status->live_requests, 0);
  EXPECT_EQ(*starts, 1);
}

TEST_F(executor_faults_test, a_hang_with_no_restart_left_degrades_without_hanging) {
  start("hang_after:0", 0);
  auto a = request(20, 50);
  auto b = request(20, 50); // waiting behind the hung step
  sched.advance_time(1001ms);
  sched.run();
  expect_engine_failure(a, "engine step timed out");
  ASSERT_FALSE(state_of(b).errors.empty());
  EXPECT_TRUE(status->degraded);
  EXPECT_EQ(status->kv_used_pages, 0);
  auto late = request(10, 2);
  ASSERT_EQ(state_of(late).errors.size(), 1u);
  EXPECT_EQ(state_of(late).errors[0].code, request_errc::unavailable);
}

// -- the fault specification -----------------------------------------------------------

TEST(fault_injection_spec, reads_every_kind_and_refuses_the_rest) {
  using kind = fault_injection::kind;
  EXPECT_EQ(fault_injection::parse("none")->what, kind::none);
  EXPECT_EQ(fault_injection::parse("throw_after:0")->what, kind::throw_error);
  EXPECT_EQ(fault_injection::parse("hang_after:7")->after_steps, 7);
  EXPECT_EQ(fault_injection::parse("device_error_after:3")->what, kind::device_error);
  EXPECT_EQ(fault_injection::parse("device_lost_after:12")->what, kind::device_lost);
  EXPECT_EQ(fault_injection::parse("device_fault_after:4")->what, kind::device_fault);
  for (const char* bad : {"throw", "throw_after:", "throw_after:-1", "throw_after:1x", "hang:3",
                          "explode_after:3", "none_after:3", "throw_after: 3"})
    EXPECT_FALSE(fault_injection::parse(bad)) << bad;
  for (const char* s :
       {"none", "throw_after:5", "hang_after:0", "device_lost_after:9", "device_fault_after:1"})
    EXPECT_EQ(fault_injection::parse(s)->to_string(), s);
}

} // namespace
} // namespace metronome
