#pragma once
// The engine's supervision tree: one supervisor actor owns the engine's
// long-lived actors and decides what their failures mean.
//
//   engine supervisor ── linked ──┬── executor (spawned, restarted by it)
//                                 ├── scheduler
//                                 ├── drift supervisor (if any)
//                                 ├── kv precision supervisor (fp8_e5m2 KV)
//                                 └── stats reporter (if any)
//
// Data parallel (docs/scale-out.md), there is one executor and one
// scheduler per replica, and the replica router: a replica's executor
// failure is that replica's alone (its scheduler is told, the router takes
// it out until its executor is up again). Past its restart budget a
// replica is removed; one restart_window later the supervisor tries a new
// executor, with a fresh budget, which re-joins the router when it is up.
// Only when no replica is left (or a device is lost, or any scheduler or
// the router fails) is the engine degraded.
//
// The scheduler and the watchers are spawned by the caller (their handles
// are returned at once, spawn_engine) and handed to the supervisor, which
// links to each as it starts: from then on they live and end with it. The
// executor is its own child: it spawns it linked, and turns each failure
// into a decision. It tells the scheduler (executor_down_msg: the scheduler
// fails the requests whose KV state was lost) and restarts the executor;
// after max_restarts failures within restart_window (on the actor clock, so
// CAF's test coordinator drives it in virtual time) it stops restarting
// and the engine is degraded. A failure that lost the device
// (executor_errc::device_lost) is not restarted: the engine is degraded and
// on_device_lost has the process exit. A scheduler that fails takes the
// tree down (degraded: nothing can run without it); a watcher that fails is
// logged and forgotten (the kv precision supervisor too: its scheduler then
// releases the requests it parked and only counts overflows).
//
// The degraded state has this one owner. The supervisor decides it, keeps
// it, publishes it to engine_status (degraded and its reason: the
// lock-free read side of /health, the frontend and the scheduler's
// admission), and tells the scheduler with a permanent executor_down_msg,
// which fails the requests still waiting. Nothing else writes it.
//
// Stopping the supervisor (engine::shutdown, any exit message from outside
// the tree, even exit_reason::kill) stops every actor of the tree through
// the links.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/executor.hpp"
#include "actors/interfaces.hpp"

namespace metronome {

struct engine_status;

/// How often the executor may fail before the engine is degraded: the
/// defaults are the configuration's (supervisor.executor in metronome.yaml,
/// docs/configuration.md), so `restart_policy{}` is what `metronome serve`
/// runs with no file and no flags.
struct restart_policy {
  /// One failure more than this within restart_window degrades the engine.
  int32_t max_restarts = 5;
  /// Failures count against max_restarts for this long, on the actor clock.
  std::chrono::seconds restart_window{60};
};

/// Settings of the engine supervisor.
struct engine_supervision {
  restart_policy restarts;
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

/// The actors the supervisor adopts: spawned by the caller, owned (linked)
/// by the supervisor from its start.
struct engine_children {
  /// Replica 0's; null only in a front end whose replicas are all workers
  /// (then `registry` is not null).
  scheduler_actor scheduler;
  /// Null when none runs.
  drift_supervisor_actor drift_supervisor;
  stats_reporter_actor stats_reporter;
  /// Data parallel: the schedulers of replicas 1, 2, ... (`scheduler` is
  /// replica 0's); empty with one replica.
  std::vector<scheduler_actor> more_schedulers;
  /// Data parallel: the router in front of the replicas, told when one
  /// leaves or re-joins; null with one replica.
  replica_router_actor router;
  /// Where workers attach (workers.listen); null without.
  worker_registry_actor registry;
  /// The fp8_e5m2 KV cache's overflow supervision; null when none runs.
  kv_precision_supervisor_actor kv_precision_supervisor;
};

/// Spawns the engine supervisor: it links to `children`, spawns the executor
/// with `factory` and reports each (re)start to the scheduler as
/// executor_up_msg and each failure as executor_down_msg. `status->ready`
/// turns true at the first start; `status` (not null) is where it publishes
/// the degraded state. Any thread.
engine_supervisor_actor spawn_engine_supervisor(caf::actor_system& sys, engine_children children,
                                                runner_factory factory,
                                                engine_supervision policy,
                                                std::shared_ptr<engine_status> status);

/// Data parallel: as above with one factory per replica (replica i's
/// executor is built by factories[i]; fewer factories than replicas: the
/// last serves the rest). Any thread.
engine_supervisor_actor spawn_engine_supervisor(caf::actor_system& sys, engine_children children,
                                                std::vector<runner_factory> factories,
                                                engine_supervision policy,
                                                std::shared_ptr<engine_status> status);

} // namespace metronome
