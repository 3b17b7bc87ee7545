#pragma once
// The executor actor and its supervisor.
//
// The executor runs on its own thread (detached): it builds its model runner
// there (CUDA state is per thread), then serves step plans in mailbox order.
// A plan handled while the previous step runs is submitted behind it, then
// the previous step is collected and answered: the host's work for step
// n + 1 overlaps step n on the device. With no plan waiting, the executor
// polls its step with messages to itself, so a plan arriving meanwhile is
// still taken first. A runner exception ends the actor with that error.
//
// The supervisor links to the executor and turns its failures into
// decisions: it tells the scheduler (which fails the requests whose state
// was lost), restarts the executor, and after max_restarts failures within
// restart_window it stops restarting and marks the engine degraded.

#include <chrono>
#include <functional>
#include <memory>

#include "actors/interfaces.hpp"
#include "model/model_runner.hpp"

namespace metronome {

struct engine_status;

/// Builds a runner; called on the executor's own thread at every start.
using runner_factory = std::function<std::unique_ptr<model_runner>()>;

/// Settings of the executor supervisor.
struct executor_supervision {
  int32_t max_restarts = 3;
  std::chrono::seconds restart_window{60};
};

/// Spawns the supervisor, which spawns the executor and reports each
/// (re)start to `scheduler` as executor_up_msg and each failure as
/// executor_down_msg. `status->ready` turns true at the first start.
caf::actor spawn_executor_supervisor(caf::actor_system& sys, caf::actor scheduler,
                                     runner_factory factory, executor_supervision policy,
                                     std::shared_ptr<engine_status> status);

} // namespace metronome
