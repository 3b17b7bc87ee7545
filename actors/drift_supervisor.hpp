#pragma once
// The drift supervisor actor: runs the drift detector (sched/drift_detector.hpp)
// for the live server. It subscribes to the scheduler's prediction outcomes,
// judges them on its own clock and sends the orders of drift_order_of
// (recalibrate_atom, policy_atom) back; every switch is logged, counted and
// kept.

#include <memory>
#include <string>

#include "caf/all.hpp"

#include "actors/interfaces.hpp"
#include "sched/drift_detector.hpp"

namespace metronome {

class engine_metrics;

// -- the actor -------------------------------------------------------------------

/// How the drift supervisor actor runs.
struct drift_supervisor_config {
  drift_options drift;
  /// The latency-aware policy to restore after a disable (ladb or srpt).
  policy_kind policy = policy_kind::ladb;
  /// The fallback while disabled.
  policy_kind fallback = policy_kind::fcfs;
  /// How often the window is re-evaluated without new samples.
  sched_time tick = std::chrono::seconds(1);
};

/// Spawns the drift supervisor for `scheduler`: it subscribes to the
/// scheduler's prediction outcomes (watch_atom), judges them, and sends
/// recalibrate_atom and policy_atom orders back. Every switch is logged
/// (spdlog), counted (metrics->on_policy_switch, causes "drift" and
/// "recovered") and kept: stats_atom answers a drift_status. It quits when
/// the scheduler does.
drift_supervisor_actor spawn_drift_supervisor(caf::actor_system& sys,
                                              policy_control_actor scheduler,
                                              drift_supervisor_config config,
                                              std::shared_ptr<engine_metrics> metrics);

} // namespace metronome
