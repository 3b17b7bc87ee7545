#pragma once
// The router actor (data parallel, docs/scale-out.md): one per engine that
// runs several replicas (each a scheduler with its executor and KV cache),
// between the request actors and the replicas' schedulers. It is the
// request actors' admission_actor: an admit_msg goes to the replica that
// sched/replica_router.hpp chooses, forwarded with the request actor as its
// sender (the replica's scheduler answers it directly: tokens never pass
// through the router); a cancel_atom follows its request. The router
// monitors each request actor it placed, and its DOWN takes the request's
// load off its replica.
//
// The engine supervisor tells it when a replica leaves (ready_atom,
// replica, false: its executor died, restarting or past its restart
// budget) and when it re-joins (ready_atom, replica, true: an executor is
// up again). Requests already placed on a replica that leaves are its
// scheduler's to fail or keep (executor_down_msg); new ones go elsewhere.
// With every replica gone it answers admissions generation_error
// unavailable at once.
//
// Replicas in other processes (workers, docs/scale-out.md) take the slots
// after the local ones: down until the worker registry attaches a worker
// (worker_attached), down again when it is lost (worker_lost). A lost
// worker's requests are not its scheduler's to fail (it is gone, or too
// slow to trust): the router tells each of them (replica_lost), and each
// runs again on another replica if no token of it has arrived yet, or
// fails. The router also moves each admission's arrival onto the worker's
// engine clock (the offset the registry measures).
//
// With one replica and no workers there is no router: request actors talk
// to the scheduler directly, as before data parallelism.

#include <memory>
#include <vector>

#include "actors/interfaces.hpp"
#include "sched/replica_router.hpp"

namespace metronome {

struct engine_status;
class engine_metrics;

/// Spawns the router in front of `schedulers` (local replica i's at index
/// i; none only with worker slots) and `worker_slots` slots for workers after them
/// (`config.replicas` counts both). It publishes each replica's membership
/// to `status` (not null; its replica gauges sized for them) and counts
/// placements in `metrics` (may be null). Local replicas start up, worker
/// slots down. Any thread; spawn_engine calls it once per engine.
replica_router_actor spawn_replica_router(caf::actor_system& sys, replica_router_config config,
                                          std::vector<scheduler_actor> schedulers,
                                          std::shared_ptr<engine_status> status,
                                          std::shared_ptr<engine_metrics> metrics,
                                          int32_t worker_slots = 0);

} // namespace metronome
