#pragma once
// The scheduler actor: a thin shell around `scheduler` that turns messages
// into calls. It monitors every admitted request actor (a DOWN cancels the
// request and frees its pages), sends each plan `scheduler::schedule` makes
// (page ids granted from the scheduler's own pool) to the executor, keeps up
// to pipeline_depth plans queued there, and routes sampled tokens back to
// the request actors.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "actors/interfaces.hpp"
#include "sched/scheduler.hpp"
#include "sched/step_trace.hpp"

namespace metronome {

struct engine_status;
class engine_metrics;
struct policy_context;

struct scheduler_actor_config {
  /// The scheduler's settings; scheduler.limits.step_timeout is how long the
  /// actor waits for a step before it has the executor replaced.
  scheduler_config scheduler;
  /// Admission policy at start.
  policy_kind policy = policy_kind::fcfs;
  /// The model's end-of-sequence ids.
  std::vector<int32_t> eos_ids;
  /// Settings and shared predictor of the latency-aware policies
  /// (sched/ladb_policy.hpp); null = defaults, a predictor per policy.
  std::shared_ptr<policy_context> policies;
  /// Where each step's plan and measured time go (logging.step_trace);
  /// null = nowhere. Written on the scheduler's thread only.
  std::shared_ptr<step_trace> trace;
  /// Data parallel: the replica this scheduler serves (its figures go to
  /// engine_status::replica(i) and the replica's metrics); -1: the only one.
  int32_t replica = -1;
};

/// Engine time of an actor: nanoseconds of its system's actor clock, which
/// CAF's test coordinator advances by hand.
sched_time engine_now(caf::local_actor* self);

/// Spawns the scheduler actor (its messages: scheduler_actor in
/// interfaces.hpp). It publishes its figures to `status` (not null) and
/// `metrics` (may be null), and refuses admissions while
/// `status->degraded`, which only the engine supervisor sets. Any thread;
/// spawn_engine calls it once per engine.
scheduler_actor spawn_scheduler(caf::actor_system& sys, scheduler_actor_config config,
                                std::shared_ptr<engine_status> status,
                                std::shared_ptr<engine_metrics> metrics);

} // namespace metronome
