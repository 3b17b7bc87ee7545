// The executor actor on its own thread with a runner that overlaps steps
// like the CUDA runner (a fake device: each step takes a fixed wall time
// after the one before it): a plan that arrives while a step runs is
// submitted before that step is collected, replies come in plan order, a
// lone plan is answered by the executor's own polling, and a runner that
// fails while collecting ends the executor so its supervisor reports it.

#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "actors/executor.hpp"
#include "tests/actors/actor_test_config.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

/// What the fake runner saw, in order ("submit 3", "collect 3", ...).
struct call_log {
  std::mutex mutex;
  std::vector<std::string> calls;

  void add(std::string s) {
    std::lock_guard lock(mutex);
    calls.push_back(std::move(s));
  }

  std::vector<std::string> get() {
    std::lock_guard lock(mutex);
    return calls;
  }
};

/// A runner whose steps each take `device_time` on a fake device, one after
/// another, starting when submitted: what the CUDA runner's stream does.
class fake_device_runner : public model_runner {
public:
  fake_device_runner(std::shared_ptr<call_log> log, clock_type::duration device_time,
                     uint64_t fail_at = UINT64_MAX, uint64_t reject_at = UINT64_MAX)
    : log_(std::move(log)), device_time_(device_time), fail_at_(fail_at), reject_at_(reject_at) {
    config_.vocab_size = 100;
  }

  step_output execute(const step_plan& plan) override {
    submit(plan);
    return collect();
  }

  void submit(const step_plan& plan) override {
    if (plan.step == reject_at_)
      throw plan_error("step " + std::to_string(plan.step) + " rejected");
    log_->add("submit " + std::to_string(plan.step));
    const auto start = std::max(clock_type::now(), device_free_);
    device_free_ = start + device_time_;
    flight_.push_back({plan.step, device_free_});
  }

  size_t in_flight() const override {
    return flight_.size();
  }

  bool ready() override {
    return !flight_.empty() && clock_type::now() >= flight_.front().done;
  }

  step_output collect() override {
    if (flight_.empty())
      throw std::logic_error("no step in flight");
    const auto f = flight_.front();
    flight_.erase(flight_.begin());
    std::this_thread::sleep_until(f.done);
    if (f.step == fail_at_)
      throw std::runtime_error("device fault in step " + std::to_string(f.step));
    log_->add("collect " + std::to_string(f.step));
    step_output out;
    out.step = f.step;
    out.tokens.push_back({f.step, int32_t(f.step) + 7, 0.0f});
    return out;
  }

  const model_config& config() const override {
    return config_;
  }
  int32_t num_pages() const override {
    return 16;
  }
  int32_t page_size() const override {
    return 16;
  }
  std::string device() const override {
    return "fake";
  }

private:
  struct flight {
    uint64_t step;
    clock_type::time_point done;
  };
  std::shared_ptr<call_log> log_;
  clock_type::duration device_time_;
  uint64_t fail_at_, reject_at_;
  clock_type::time_point device_free_{};
  std::vector<flight> flight_;
  model_config config_;
};

step_plan plan_of(uint64_t step) {
  step_plan p;
  p.step = step;
  return p;
}

class executor_test : public ::testing::Test {
protected:
  test::actor_test_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::shared_ptr<call_log> log = std::make_shared<call_log>();
  caf::actor supervisor;

  ~executor_test() override {
    if (supervisor)
      self->send_exit(supervisor, caf::exit_reason::user_shutdown);
  }

  /// Starts the supervisor with `self` as its scheduler; the executor's
  /// handle from its executor_up_msg.
  executor_actor start(clock_type::duration device_time, uint64_t fail_at = UINT64_MAX,
                       uint64_t reject_at = UINT64_MAX) {
    auto l = log;
    supervisor = spawn_executor_supervisor(
      sys, caf::actor_cast<caf::actor>(self),
      [l, device_time, fail_at, reject_at] {
        return std::make_unique<fake_device_runner>(l, device_time, fail_at, reject_at);
      },
      executor_supervision{0, std::chrono::seconds(60)}, nullptr);
    executor_actor exec;
    self->receive([&](executor_up_msg& up) { exec = caf::actor_cast<executor_actor>(up.executor); },
                  caf::after(10s) >> [&] { ADD_FAILURE() << "the executor did not start"; });
    return exec;
  }

  static step_plan plan(uint64_t step) {
    step_plan p;
    p.step = step;
    return p;
  }
};

TEST_F(executor_test, a_plan_arriving_during_a_step_is_submitted_before_that_step_is_collected) {
  auto exec = start(50ms);
  ASSERT_TRUE(exec);
  // Three plans at once, as the scheduler keeps plans in flight.
  auto r1 = self->request(exec, 10s, plan(1));
  auto r2 = self->request(exec, 10s, plan(2));
  auto r3 = self->request(exec, 10s, plan(3));
  std::vector<uint64_t> replies;
  auto on_reply = [&](step_output& out) {
    replies.push_back(out.step);
    ASSERT_EQ(out.tokens.size(), 1u);
    EXPECT_EQ(out.tokens[0].token, int32_t(out.step) + 7);
  };
  auto on_error = [&](caf::error& e) { ADD_FAILURE() << sys.render(e); };
  r1.receive(on_reply, on_error);
  r2.receive(on_reply, on_error);
  r3.receive(on_reply, on_error);
  EXPECT_EQ(replies, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(log->get(), (std::vector<std::string>{"submit 1", "submit 2", "collect 1", "submit 3",
                                                   "collect 2", "collect 3"}));
}

TEST_F(executor_test, a_lone_plan_is_answered_when_its_step_ends) {
  auto exec = start(20ms);
  ASSERT_TRUE(exec);
  const auto t0 = clock_type::now();
  self->request(exec, 10s, plan(41))
    .receive([&](step_output& out) { EXPECT_EQ(out.step, 41u); },
             [&](caf::error& e) { ADD_FAILURE() << sys.render(e); });
  EXPECT_GE(clock_type::now() - t0, 20ms);
  EXPECT_EQ(log->get(), (std::vector<std::string>{"submit 41", "collect 41"}));
}

TEST_F(executor_test, a_runner_failing_while_collecting_ends_the_executor_and_is_reported) {
  auto exec = start(10ms, 2);
  ASSERT_TRUE(exec);
  self->request(exec, 10s, plan(1))
    .receive([&](step_output& out) { EXPECT_EQ(out.step, 1u); },
             [&](caf::error& e) { ADD_FAILURE() << sys.render(e); });
  // The failed step's requester hears of it at once, not at its timeout.
  const auto t0 = clock_type::now();
  self->request(exec, 30s, plan(2)).receive(
    [&](step_output&) { ADD_FAILURE() << "a failed step was answered"; },
    [&](caf::error& e) { EXPECT_NE(sys.render(e).find("device fault"), std::string::npos); });
  EXPECT_LT(clock_type::now() - t0, 10s);
  bool reported = false;
  self->receive(
    [&](executor_down_msg& down) {
      reported = true;
      EXPECT_NE(down.reason.find("device fault in step 2"), std::string::npos) << down.reason;
    },
    caf::after(10s) >> [] {});
  EXPECT_TRUE(reported);
}

TEST_F(executor_test, a_rejected_plan_is_answered_with_the_error_at_once) {
  auto exec = start(10ms, UINT64_MAX, 5);
  ASSERT_TRUE(exec);
  const auto t0 = clock_type::now();
  self->request(exec, 30s, plan(5)).receive(
    [&](step_output&) { ADD_FAILURE() << "a rejected plan was answered"; },
    [&](caf::error& e) { EXPECT_NE(sys.render(e).find("rejected"), std::string::npos); });
  EXPECT_LT(clock_type::now() - t0, 10s);
}

TEST_F(executor_test, stopping_with_a_step_in_flight_answers_it_and_frees_the_executor) {
  // crash_atom (how the scheduler replaces a hung executor) and a shutdown
  // of the supervisor, each while a step runs: its requester gets an error
  // at once, and the actor system can still shut down (no executor kept
  // alive by its own unanswered promises).
  auto exec = start(300ms);
  ASSERT_TRUE(exec);
  auto pending = self->request(exec, 30s, plan(1));
  caf::anon_send(exec, crash_atom::value, std::string("drill"));
  const auto t0 = clock_type::now();
  pending.receive([&](step_output&) { /* it may finish before the crash lands */ },
                  [&](caf::error&) {});
  EXPECT_LT(clock_type::now() - t0, 10s);
  self->receive([&](executor_down_msg&) {}, caf::after(10s) >> [] {
    ADD_FAILURE() << "the crash was not reported";
  });
}

TEST(executor_shutdown, an_engine_stopped_mid_step_shuts_down) {
  test::actor_test_config cfg;
  auto log = std::make_shared<call_log>();
  {
    caf::actor_system sys{cfg};
    caf::scoped_actor self{sys};
    auto supervisor = spawn_executor_supervisor(
      sys, caf::actor_cast<caf::actor>(self),
      [log] { return std::make_unique<fake_device_runner>(log, 300ms); },
      executor_supervision{}, nullptr);
    executor_actor exec;
    self->receive([&](executor_up_msg& up) { exec = caf::actor_cast<executor_actor>(up.executor); },
                  caf::after(10s) >> [&] { ADD_FAILURE() << "the executor did not start"; });
    ASSERT_TRUE(exec);
    auto pending = self->request(exec, 30s, plan_of(1));
    std::this_thread::sleep_for(50ms); // the step is on the fake device
    self->send_exit(supervisor, caf::exit_reason::user_shutdown);
    const auto t0 = clock_type::now();
    pending.receive([&](step_output&) { ADD_FAILURE() << "answered after the shutdown"; },
                    [&](caf::error&) {});
    EXPECT_LT(clock_type::now() - t0, 10s);
  } // ~actor_system waits for the executor's thread: a hang fails the test
}

} // namespace
} // namespace metronome
