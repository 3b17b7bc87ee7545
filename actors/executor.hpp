#pragma once
// The executor actor and its supervisor.
//
// The executor runs on its own thread (detached): it builds its model runner
// there (CUDA state is per thread), then serves step plans in mailbox order.
// It is purely reactive. A plan is submitted when it arrives, also while
// earlier steps run (the runner queues it behind them): the host's work for
// step n + 1 overlaps step n on the device, which goes from one step to the
// next without waiting for the host. A step is answered when the executor
// finds it ready (model_runner::ready) after handling a plan, or after the
// step_done_atom that the runner's step listener sends from the runner's own
// thread when a step ends; answers keep plan order. In between, the thread
// sleeps in its mailbox: nothing polls, spins or sleeps on a timer, so a
// plan arriving during a step is taken at once and an idle wait costs no
// CPU. A step that never ends is never ready: the scheduler's request for
// it times out and sends crash_atom, which ends the executor. A runner
// exception ends the actor with that error.
//
// The supervisor links to the executor and turns its failures into
// decisions: it tells the scheduler (which fails the requests whose state
// was lost), restarts the executor, and after max_restarts failures within
// restart_window it stops restarting and marks the engine degraded. A
// failure that lost the device (executor_errc::device_lost: a sticky CUDA
// error, a step the device never ends) is not restarted: the engine is
// marked degraded and on_device_lost has the process exit.

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "actors/interfaces.hpp"
#include "model/model_runner.hpp"

namespace metronome {

struct engine_status;

/// Builds a runner; called on the executor's own thread at every start.
using runner_factory = std::function<std::unique_ptr<model_runner>()>;

/// Settings of the executor supervisor.
struct executor_supervision {
  int32_t max_restarts = 3;
  /// Failures count against max_restarts for this long, on the actor clock
  /// (CAF's test coordinator drives it in virtual time).
  std::chrono::seconds restart_window{60};
  /// The executor gets a thread of its own (what a real runner needs: CUDA
  /// state is per thread, and submit() may block). False runs it on CAF's
  /// scheduler: for tests under the deterministic test coordinator, with
  /// runners that never block.
  bool own_thread = true;
  /// Called (on the supervisor's thread) when the executor failed in a way
  /// that leaves the device unusable in this process (executor_errc::
  /// device_lost): after the scheduler has been told, instead of a
  /// restart. `metronome serve` exits non-zero from here; empty: the
  /// engine just stays degraded.
  std::function<void(const std::string& reason)> on_device_lost;
};

/// Spawns the supervisor, which spawns the executor and reports each
/// (re)start to `scheduler` as executor_up_msg and each failure as
/// executor_down_msg. `status->ready` turns true at the first start.
caf::actor spawn_executor_supervisor(caf::actor_system& sys, scheduler_actor scheduler,
                                     runner_factory factory, executor_supervision policy,
                                     std::shared_ptr<engine_status> status);

} // namespace metronome
