#pragma once
// The kv precision supervisor actor: the overflow supervision of an
// fp8_e5m2 KV cache (sched/kv_precision_controller.hpp) for the live server.
// It subscribes to the scheduler's overflow reports (kv_watch_atom), asks
// the controller on each (on the actor clock, so CAF's test coordinator
// drives it in virtual time) and sends the decision back: remat_atom (the
// scheduler re-materialises the request in full precision) or kv_keep_atom
// (it goes on with saturated values), and cooldown_atom true/false when a
// cool-down starts or ends. Every transition is logged (a structured
// `kv_precision` event), counted (engine_metrics::on_kv_precision_event,
// the mode gauge) and kept: stats_atom answers a kv_precision_status.
//
// It lives in the engine's supervision tree (engine_supervisor.hpp: linked,
// a failure is logged and forgotten) and quits when the scheduler does. A
// scheduler whose supervisor is gone keeps the requests it parked parked
// until they are cancelled or time out: the decision is the supervisor's.

#include <memory>

#include "caf/all.hpp"

#include "actors/interfaces.hpp"
#include "sched/kv_precision_controller.hpp"

namespace metronome {

class engine_metrics;

/// Spawns the kv precision supervisor for `scheduler` with `options`
/// (engine.kv_overflow). `metrics` may be null. Any thread; spawn_engine
/// calls it when engine.kv_cache_dtype is fp8_e5m2 and one replica runs.
kv_precision_supervisor_actor spawn_kv_precision_supervisor(
  caf::actor_system& sys, kv_precision_control_actor scheduler, kv_overflow_options options,
  std::shared_ptr<engine_metrics> metrics);

} // namespace metronome
