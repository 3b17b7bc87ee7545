#include "actors/executor.hpp"

#include <deque>
#include <mutex>
#include <vector>

#include <spdlog/spdlog.h>

#include "actors/engine.hpp"
#include "model/device_error.hpp"

namespace metronome {

namespace {

/// Turns an exception into an error that keeps its text: executor_errc::
/// device_lost for a device_error that lost the device, else runtime_error.
caf::error describe(std::exception_ptr& ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const device_error& e) {
    if (e.context_lost())
      return caf::make_error(executor_errc::device_lost, std::string(e.what()));
    return caf::make_error(caf::sec::runtime_error, e.what());
  } catch (const std::exception& e) {
    return caf::make_error(caf::sec::runtime_error, e.what());
  } catch (...) {
    return caf::make_error(caf::sec::runtime_error, "unknown exception");
  }
}

bool is_device_lost(const caf::error& e) {
  return e.category() == caf::atom("executor")
         && e.code() == static_cast<uint8_t>(executor_errc::device_lost);
}

/// Keeps the runner of a lost device until the process exits, never
/// destroying it: its destructor would wait for, or call into, a device
/// that cannot answer (freeing device memory waits for a kernel that never
/// ends), and hold up the report that has the process exit.
void abandon(std::unique_ptr<model_runner> runner) {
  static std::mutex mutex;
  static auto* kept = new std::vector<std::unique_ptr<model_runner>>(); // reachable: no leak
  std::lock_guard<std::mutex> guard(mutex);
  kept->push_back(std::move(runner));
}

class executor_impl : public executor_actor::base {
public:
  executor_impl(caf::actor_config& cfg, caf::actor supervisor, runner_factory factory)
    : executor_actor::base(cfg), supervisor_(std::move(supervisor)), factory_(std::move(factory)) {
    // nop
  }

  executor_actor::behavior_type make_behavior() override {
    // First code on the executor's own thread.
    // A failure ends the executor; the steps it still owed hear of it now.
    set_exception_handler([this](caf::scheduled_actor*, std::exception_ptr& ep) {
      auto err = describe(ep);
      if (is_device_lost(err))
        abandon_runner_ = true;
      for (auto& rp : waiting_)
        rp.deliver(err);
      waiting_.clear();
      return err;
    });
    try {
      runner_ = factory_();
    } catch (const device_error& e) {
      // A device that fails as the runner starts: lost for good, or worth
      // another start (the supervisor counts it against the budget).
      quit(e.context_lost()
             ? caf::make_error(executor_errc::device_lost,
                               std::string("cannot start the model: ") + e.what())
             : caf::make_error(caf::sec::runtime_error,
                               std::string("cannot start the model: ") + e.what()));
      return {[](step_plan&) -> caf::result<step_output> { return step_output{}; },
              [](step_done_atom) {}, [](crash_atom, std::string&) {}};
    } catch (const std::exception& e) {
      quit(caf::make_error(caf::sec::runtime_error, std::string("cannot start the model: ") + e.what()));
      return {[](step_plan&) -> caf::result<step_output> { return step_output{}; },
              [](step_done_atom) {}, [](crash_atom, std::string&) {}};
    }
    // The runner says when a step ends, from its own thread: a message wakes
    // this one, which otherwise sleeps in its mailbox. The listener holds a
    // weak handle: the runner it lives in belongs to this actor.
    runner_->set_step_listener([addr = address()] {
      if (auto self = caf::actor_cast<executor_actor>(addr))
        caf::anon_send(self, step_done_atom::value);
    });
    executor_up_msg up;
    up.executor = caf::actor_cast<caf::actor>(this);
    up.num_pages = runner_->num_pages();
    up.page_size = runner_->page_size();
    up.device = runner_->device();
    up.memory_plan = runner_->memory_plan();
    caf::anon_send(supervisor_, std::move(up)); // typed actors may not send() to untyped ones
    return {
      [this](step_plan& plan) -> caf::result<step_output> {
        // Submitted at once, also while earlier steps run: the runner queues
        // it behind them on the device, which then goes from one step to the
        // next without waiting for this thread. A plan the runner rejects
        // throws here, before the promise takes the request: CAF answers it
        // with the error.
        runner_->submit(plan);
        waiting_.push_back(make_response_promise<step_output>());
        auto rp = waiting_.back();
        deliver_ready(); // a runner that ran the step at once is ready now
        return rp;
      },
      [this](step_done_atom) {
        // From the runner's listener: a step ended (or one already
        // collected did: then nothing is ready, and nothing happens).
        deliver_ready();
      },
      [this](crash_atom, std::string& why) {
        // A step the device itself never ends (a CUDA kernel that does not
        // return) holds the device for the rest of the process: no restart
        // can help, the process must exit (the supervisor sees to it).
        if (runner_ && runner_->device_stuck()) {
          abandon_runner_ = true;
          quit(caf::make_error(executor_errc::device_lost,
                               why + "; the device has not finished the step"));
          return;
        }
        quit(caf::make_error(caf::sec::runtime_error, std::move(why)));
      },
    };
  }

  void on_exit() override {
    // Stopped (shutdown, crash_atom) with steps owed: their requesters hear
    // of it now, and the promises' references to this actor go.
    for (auto& rp : waiting_)
      rp.deliver(caf::make_error(caf::sec::request_receiver_down));
    waiting_.clear();
    if (abandon_runner_ && runner_)
      abandon(std::move(runner_));
    runner_.reset(); // device memory goes on the thread that made it
  }

private:
  /// Answers, oldest first, every step that has ended: collect() returns
  /// without waiting. A step still running stops the loop (replies keep plan
  /// order); its end brings step_done_atom.
  void deliver_ready() {
    while (!waiting_.empty() && runner_->ready()) {
      auto out = runner_->collect();
      auto rp = std::move(waiting_.front());
      waiting_.pop_front();
      rp.deliver(std::move(out));
    }
  }

  std::deque<caf::typed_response_promise<step_output>> waiting_; // oldest first
  caf::actor supervisor_;
  runner_factory factory_;
  std::unique_ptr<model_runner> runner_;
  /// The device is lost: the runner is kept, never destroyed (abandon()).
  bool abandon_runner_ = false;
};

struct supervisor_state {
  caf::actor child;
  std::deque<caf::actor_clock::time_point> restarts; // on the actor clock
  bool degraded = false;
  static inline const char* name = "executor-supervisor";
};

caf::behavior executor_supervisor(caf::stateful_actor<supervisor_state>* self,
                                  scheduler_actor scheduler, runner_factory factory,
                                  executor_supervision policy,
                                  std::shared_ptr<engine_status> status) {
  auto start_child = [=] {
    auto sup = caf::actor_cast<caf::actor>(self);
    if (policy.own_thread)
      self->state.child = caf::actor_cast<caf::actor>(
        self->spawn<executor_impl, caf::linked + caf::detached>(sup, factory));
    else
      self->state.child
        = caf::actor_cast<caf::actor>(self->spawn<executor_impl, caf::linked>(sup, factory));
  };
  self->set_exit_handler([=](caf::exit_msg& msg) {
    auto& st = self->state;
    if (msg.source != st.child.address()) {
      self->quit(msg.reason); // our owner is going away
      return;
    }
    st.child = nullptr;
    if (!msg.reason || msg.reason == caf::exit_reason::user_shutdown)
      return;
    const auto reason = self->system().render(msg.reason);
    if (is_device_lost(msg.reason)) {
      // No restart can help: every request fails, the engine reports
      // degraded, and the process exits (on_device_lost) so that its
      // service manager starts a new one.
      spdlog::critical("executor failed: {}; the device is unusable until the process exits",
                       reason);
      st.degraded = true;
      if (status) {
        status->set_reason(reason);
        status->degraded = true;
      }
      self->send(scheduler, executor_down_msg{reason, true});
      if (policy.on_device_lost)
        policy.on_device_lost(reason);
      return;
    }
    // The actor clock: CAF's test coordinator drives it in virtual time.
    const auto now = self->clock().now();
    while (!st.restarts.empty() && now - st.restarts.front() > policy.restart_window)
      st.restarts.pop_front();
    if (int32_t(st.restarts.size()) < policy.max_restarts) {
      spdlog::error("executor failed ({}); restarting ({} of {} allowed within {} s)", reason,
                    st.restarts.size() + 1, policy.max_restarts, policy.restart_window.count());
      self->send(scheduler, executor_down_msg{reason, false});
      st.restarts.push_back(now);
      start_child();
    } else {
      spdlog::critical("executor failed ({}) {} times within {} s: engine degraded", reason,
                       st.restarts.size() + 1, policy.restart_window.count());
      st.degraded = true;
      if (status) {
        status->set_reason("the executor failed " + std::to_string(st.restarts.size() + 1)
                           + " times within " + std::to_string(policy.restart_window.count())
                           + " s (last: " + reason + ")");
        status->degraded = true;
      }
      self->send(scheduler, executor_down_msg{reason, true});
    }
  });
  start_child();
  return {
    [=](executor_up_msg& up) {
      std::string plan;
      for (const auto& e : up.memory_plan)
        plan += (plan.empty() ? "" : ", ") + e.name + " " + std::to_string(e.bytes >> 20) + " MiB";
      if (status) {
        status->set_memory_plan(up.memory_plan);
        status->ready = true;
      }
      spdlog::info("executor ready on {}: {} KV pages of {} tokens{}{}", up.device, up.num_pages,
                   up.page_size, plan.empty() ? "" : "; memory: ", plan);
      self->send(scheduler, std::move(up));
    },
    [=](crash_atom) {
      // Fault injection for tests and drills: the executor dies as if its
      // runner had thrown.
      spdlog::warn("fault injection: crashing the executor");
      if (self->state.child)
        caf::anon_send(caf::actor_cast<executor_actor>(self->state.child), crash_atom::value,
                       std::string("injected crash"));
    },
  };
}

} // namespace

caf::actor spawn_executor_supervisor(caf::actor_system& sys, scheduler_actor scheduler,
                                     runner_factory factory, executor_supervision policy,
                                     std::shared_ptr<engine_status> status) {
  return sys.spawn(executor_supervisor, std::move(scheduler), std::move(factory), policy,
                   std::move(status));
}

} // namespace metronome
