// The executor actor on its own thread with a runner that overlaps steps
// like the CUDA runner (a fake device: each step takes a fixed wall time
// after the one before it, and a thread of the fake device calls the step
// listener at each step's end): a plan that arrives while a step runs is
// submitted before that step is collected, no step is collected before it
// has ended, replies come in plan order, a lone plan is answered when the
// listener reports its end, waiting for a step costs no CPU (nothing polls),
// and a runner that fails while collecting ends the executor so its
// supervisor reports it. (The supervisor's own tests, under CAF's test
// coordinator: engine_supervisor_test.cpp.)

#include <time.h>

#include <chrono>
#include <condition_variable>
#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "actors/engine.hpp"
#include "actors/engine_supervisor.hpp"
#include "tests/actors/actor_test_config.hpp"
#include "tests/actors/fake_runners.hpp"

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

/// The fake device's thread: calls the step listener at each step's end
/// time, as the CUDA runner's step notifier does when a step's event fires.
/// With `extra_calls`, also once as each step starts (a call that finds
/// nothing ready, which the contract allows).
class fake_device_thread {
public:
  explicit fake_device_thread(std::function<void()> listener, bool extra_calls)
    : listener_(std::move(listener)), extra_calls_(extra_calls), thread_([this] { run(); }) {
  }

  ~fake_device_thread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true; // no call begins from here on
    }
    wake_.notify_all();
    thread_.join();
  }

  void step_ends_at(clock_type::time_point t) {
    {
      std::lock_guard lock(mutex_);
      ends_.push_back(t);
      if (extra_calls_)
        extra_ = true;
    }
    wake_.notify_all();
  }

private:
  void run() {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      if (extra_) {
        extra_ = false;
        listener_();
        continue;
      }
      if (ends_.empty()) {
        wake_.wait(lock);
        continue;
      }
      const auto t = ends_.front();
      if (clock_type::now() < t) {
        wake_.wait_until(lock, t);
        continue;
      }
      ends_.pop_front();
      listener_(); // under the lock: the destructor never races a call
    }
  }

  std::function<void()> listener_;
  bool extra_calls_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<clock_type::time_point> ends_;
  bool extra_ = false;
  bool stop_ = false;
  std::thread thread_; // last: starts once the rest exists
};

/// A runner whose steps each take `device_time` on a fake device, one after
/// another, starting when submitted: what the CUDA runner's stream does.
/// A collect() before the step's end is logged as "collect n early" (and
/// waits): the executor should only collect what is ready.
class fake_device_runner : public test::fake_runner {
public:
  fake_device_runner(std::shared_ptr<call_log> log, clock_type::duration device_time,
                     uint64_t fail_at = UINT64_MAX, uint64_t reject_at = UINT64_MAX,
                     bool extra_calls = false)
    : fake_runner(16, 16, "fake"), log_(std::move(log)), device_time_(device_time),
      fail_at_(fail_at), reject_at_(reject_at), extra_calls_(extra_calls) {
    // nop
  }

  ~fake_device_runner() override {
    device_.reset(); // no listener call from here on
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
    if (device_)
      device_->step_ends_at(device_free_);
  }

  void set_step_listener(std::function<void()> on_step_done) override {
    device_.reset();
    if (on_step_done)
      device_ = std::make_unique<fake_device_thread>(std::move(on_step_done), extra_calls_);
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
    const bool early = clock_type::now() < f.done;
    std::this_thread::sleep_until(f.done);
    if (f.step == fail_at_)
      throw std::runtime_error("device fault in step " + std::to_string(f.step));
    log_->add("collect " + std::to_string(f.step) + (early ? " early" : ""));
    step_output out;
    out.step = f.step;
    out.tokens.push_back({f.step, int32_t(f.step) + 7, 0.0f});
    return out;
  }

private:
  struct flight {
    uint64_t step;
    clock_type::time_point done;
  };
  std::shared_ptr<call_log> log_;
  clock_type::duration device_time_;
  uint64_t fail_at_, reject_at_;
  bool extra_calls_;
  clock_type::time_point device_free_{};
  std::vector<flight> flight_;
  std::unique_ptr<fake_device_thread> device_; // last: its thread reads nothing above
};

/// CPU time of the whole process (every thread), in seconds.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

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
  engine_supervisor_actor supervisor;

  ~executor_test() override {
    if (supervisor)
      self->send_exit(supervisor, caf::exit_reason::user_shutdown);
  }

  /// Starts the supervisor with `self` as its scheduler; the executor's
  /// handle from its executor_up_msg.
  executor_actor start(clock_type::duration device_time, uint64_t fail_at = UINT64_MAX,
                       uint64_t reject_at = UINT64_MAX, bool extra_calls = false) {
    auto l = log;
    supervisor = spawn_engine_supervisor(
      sys, {caf::actor_cast<scheduler_actor>(self), {}, {}}, // the scheduler's stand-in
      [l, device_time, fail_at, reject_at, extra_calls] {
        return std::make_unique<fake_device_runner>(l, device_time, fail_at, reject_at,
                                                    extra_calls);
      },
      {{0, std::chrono::seconds(60)}, true, {}}, std::make_shared<engine_status>());
    executor_actor exec;
    self->receive([&](executor_up_msg& up) { exec = up.executor; },
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
  auto exec = start(200ms);
  ASSERT_TRUE(exec);
  // Three plans at once, as the scheduler keeps plans in flight: each is
  // queued behind the running step at once, and each step is collected
  // once it has ended, not before.
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
  EXPECT_EQ(log->get(), (std::vector<std::string>{"submit 1", "submit 2", "submit 3", "collect 1",
                                                   "collect 2", "collect 3"}));
}

TEST_F(executor_test, a_plan_arriving_mid_step_is_submitted_at_once_and_the_step_answered_at_its_end) {
  auto exec = start(300ms);
  ASSERT_TRUE(exec);
  const auto t0 = clock_type::now();
  auto r1 = self->request(exec, 10s, plan(1));
  std::this_thread::sleep_for(100ms); // step 1 is on the fake device
  auto r2 = self->request(exec, 10s, plan(2));
  r1.receive([&](step_output& out) { EXPECT_EQ(out.step, 1u); },
             [&](caf::error& e) { ADD_FAILURE() << sys.render(e); });
  // Answered at its end (300 ms), not at step 2's (600 ms).
  const auto t1 = clock_type::now() - t0;
  EXPECT_GE(t1, 300ms);
  EXPECT_LT(t1, 550ms);
  r2.receive([&](step_output& out) { EXPECT_EQ(out.step, 2u); },
             [&](caf::error& e) { ADD_FAILURE() << sys.render(e); });
  EXPECT_GE(clock_type::now() - t0, 600ms);
  EXPECT_EQ(log->get(),
            (std::vector<std::string>{"submit 1", "submit 2", "collect 1", "collect 2"}));
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

TEST_F(executor_test, waiting_for_a_long_step_costs_no_cpu) {
  // Nothing polls the step: the executor's thread sleeps in its mailbox
  // until the runner's listener reports the end. The whole process uses a
  // small fraction of a core over the wait (a polling executor: all of one).
  auto exec = start(300ms);
  ASSERT_TRUE(exec);
  const auto t0 = clock_type::now();
  const double cpu0 = process_cpu_seconds();
  self->request(exec, 10s, plan(1))
    .receive([&](step_output& out) { EXPECT_EQ(out.step, 1u); },
             [&](caf::error& e) { ADD_FAILURE() << sys.render(e); });
  const double cpu = process_cpu_seconds() - cpu0;
  const double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
  EXPECT_GE(wall, 0.3);
  EXPECT_LT(cpu, 0.2 * wall) << "the process used " << cpu << " s of CPU in " << wall
                             << " s waiting for one step";
  EXPECT_EQ(log->get(), (std::vector<std::string>{"submit 1", "collect 1"}));
}

TEST_F(executor_test, a_listener_call_that_finds_no_step_ready_changes_nothing) {
  // The runner also calls the listener as each step starts: the executor
  // finds nothing ready then, and collects each step at its end.
  auto exec = start(100ms, UINT64_MAX, UINT64_MAX, true);
  ASSERT_TRUE(exec);
  auto r1 = self->request(exec, 10s, plan(1));
  auto r2 = self->request(exec, 10s, plan(2));
  std::vector<uint64_t> replies;
  auto on_reply = [&](step_output& out) { replies.push_back(out.step); };
  auto on_error = [&](caf::error& e) { ADD_FAILURE() << sys.render(e); };
  r1.receive(on_reply, on_error);
  r2.receive(on_reply, on_error);
  EXPECT_EQ(replies, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(log->get(),
            (std::vector<std::string>{"submit 1", "submit 2", "collect 1", "collect 2"}));
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
    auto supervisor = spawn_engine_supervisor(
      sys, {caf::actor_cast<scheduler_actor>(self), {}, {}}, // the scheduler's stand-in
      [log] { return std::make_unique<fake_device_runner>(log, 300ms); }, {},
      std::make_shared<engine_status>());
    executor_actor exec;
    self->receive([&](executor_up_msg& up) { exec = up.executor; },
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


/// A runner whose listener thread calls the listener back to back, as a
/// device finishing many short steps does, until the runner is destroyed.
/// Destroyed on that thread (from inside a listener call), it cannot join
/// it: it counts that in `on_listener_thread` and leaves the thread to end
/// by itself, so the test fails where a real runner would deadlock.
class calling_runner : public test::fake_runner {
public:
  struct counters {
    std::atomic<int> destroyed{0};
    std::atomic<int> on_listener_thread{0};
  };

  explicit calling_runner(std::shared_ptr<counters> c)
    : fake_runner(16, 16, "calling"), counters_(std::move(c)) {
    // nop
  }

  ~calling_runner() override {
    if (worker_) {
      shared_->stop = true;
      if (std::this_thread::get_id() == worker_->get_id()) {
        ++counters_->on_listener_thread;
        worker_->detach(); // the thread still holds shared_: it ends by itself
      } else {
        worker_->join();
      }
    }
    ++counters_->destroyed;
  }

  step_output execute(const step_plan& plan) override {
    step_output out;
    out.step = plan.step;
    return out;
  }

  void set_step_listener(std::function<void()> on_step_done) override {
    if (!on_step_done || worker_)
      return;
    shared_->listener = std::move(on_step_done);
    worker_ = std::make_unique<std::thread>([s = shared_] {
      while (!s->stop) {
        s->listener();
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
  }

private:
  struct shared_state {
    std::function<void()> listener;
    std::atomic<bool> stop{false};
  };
  std::shared_ptr<counters> counters_;
  std::shared_ptr<shared_state> shared_ = std::make_shared<shared_state>();
  std::unique_ptr<std::thread> worker_;
};

TEST(executor_lifetime, an_executor_left_by_every_handle_ends_on_its_own_thread) {
  // The runner's listener thread briefly holds a handle to the executor in
  // each call. When every other handle has gone (the supervisor shut down,
  // the scheduler's handle dropped) before the executor has run its exit,
  // that brief handle must not be the executor's last: the executor would
  // then end on the listener's thread and destroy its runner there, which
  // joins that same thread. Repeated, since the window is narrow.
  test::actor_test_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto counters = std::make_shared<calling_runner::counters>();
  constexpr int rounds = 200;
  for (int i = 0; i < rounds; ++i) {
    auto supervisor = spawn_engine_supervisor(
      sys, {caf::actor_cast<scheduler_actor>(self), {}, {}},
      [counters] { return std::make_unique<calling_runner>(counters); },
      {{0, std::chrono::seconds(60)}, true, {}}, std::make_shared<engine_status>());
    bool up = false;
    self->receive([&](executor_up_msg& msg) { up = bool(msg.executor); },
                  caf::after(10s) >> [] {});
    ASSERT_TRUE(up) << "round " << i;
    self->send_exit(supervisor, caf::exit_reason::user_shutdown);
    supervisor = nullptr;
    const auto deadline = clock_type::now() + 10s;
    while (counters->destroyed.load() <= i && clock_type::now() < deadline)
      std::this_thread::sleep_for(1ms);
    ASSERT_EQ(counters->destroyed.load(), i + 1) << "round " << i << ": the runner lives on";
  }
  EXPECT_EQ(counters->on_listener_thread.load(), 0)
    << "an executor ended on its runner's listener thread";
}

} // namespace
} // namespace metronome
