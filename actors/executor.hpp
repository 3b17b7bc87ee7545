#pragma once
// The executor actor: one per device, its interface executor_actor
// (interfaces.hpp), its supervisor the engine supervisor
// (engine_supervisor.hpp).
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
// exception ends the actor with that error; an error that lost the device
// ends it with executor_errc::device_lost.

#include <functional>
#include <memory>

#include "actors/interfaces.hpp"
#include "model/model_runner.hpp"

namespace metronome {

/// Builds a runner; called on the executor's own thread at every start.
using runner_factory = std::function<std::unique_ptr<model_runner>()>;

/// Spawns an executor linked to `supervisor`, which gets its
/// executor_up_msg once the runner is built and its exit message when it
/// ends. With `own_thread` false it runs on CAF's scheduler (tests under
/// the deterministic test coordinator, runners that never block). On the
/// supervisor's thread.
executor_actor spawn_linked_executor(engine_supervisor_actor::pointer supervisor,
                                     runner_factory factory, bool own_thread);

/// True when an executor ended because its device is lost for the rest of
/// the process (executor_errc::device_lost): no restart can help.
bool is_device_lost(const caf::error& reason);

} // namespace metronome
