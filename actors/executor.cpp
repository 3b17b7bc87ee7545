#include "actors/executor.hpp"

#include <deque>
#include <mutex>
#include <vector>

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
  executor_impl(caf::actor_config& cfg, engine_supervisor_actor supervisor, runner_factory factory)
    : executor_actor::base(cfg), supervisor_(std::move(supervisor)), factory_(std::move(factory)) {
    // nop
  }

  executor_actor::behavior_type make_behavior() override {
    // First code on the executor's own thread. The executor holds a handle
    // to itself until on_exit, so that it only ends by an exit or a quit,
    // always on its own thread. Without it, the handle the runner's listener
    // briefly holds (below) could be the last one once the supervisor and
    // the scheduler have let theirs go: CAF would then run on_exit on the
    // listener's thread, and destroying the runner there joins that thread.
    keep_alive_ = ctrl();
    // Whatever the reason its supervisor gives (a normal exit too), the
    // executor ends with it: nothing else would end it now.
    set_exit_handler([this](caf::exit_msg& msg) {
      quit(std::move(msg.reason));
    });
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
    // weak handle (the runner it lives in belongs to this actor) and a
    // strong one only for the length of a send.
    runner_->set_step_listener([addr = address()] {
      if (auto self = caf::actor_cast<executor_actor>(addr))
        caf::anon_send(self, step_done_atom::value);
    });
    executor_up_msg up;
    up.executor = caf::actor_cast<executor_actor>(this);
    up.num_pages = runner_->num_pages();
    up.page_size = runner_->page_size();
    up.device = runner_->device();
    up.memory_plan = runner_->memory_plan();
    send(supervisor_, std::move(up));
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
    // Not the last reference: the thread running this exit holds one until
    // the exit is done (CAF's private thread and its scheduler alike).
    keep_alive_.reset();
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
  engine_supervisor_actor supervisor_;
  runner_factory factory_;
  std::unique_ptr<model_runner> runner_;
  /// The device is lost: the runner is kept, never destroyed (abandon()).
  bool abandon_runner_ = false;
  /// This actor, from make_behavior to on_exit (see make_behavior).
  caf::strong_actor_ptr keep_alive_;
};

} // namespace

executor_actor spawn_linked_executor(engine_supervisor_actor::pointer supervisor,
                                     runner_factory factory, bool own_thread) {
  if (own_thread)
    return supervisor->spawn<executor_impl, caf::linked + caf::detached>(
      engine_supervisor_actor{supervisor}, std::move(factory));
  return supervisor->spawn<executor_impl, caf::linked>(engine_supervisor_actor{supervisor},
                                                      std::move(factory));
}

bool is_device_lost(const caf::error& e) {
  return e.category() == caf::atom("executor")
         && e.code() == static_cast<uint8_t>(executor_errc::device_lost);
}

} // namespace metronome
