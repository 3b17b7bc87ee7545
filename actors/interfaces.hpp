#pragma once
// Typed interfaces of Metronome's actors: every message an actor accepts,
// and what it answers, checked by the compiler at each send. The message
// types themselves are in messages.hpp. Messages an actor sends to itself
// (its timers) are part of its interface too: CAF 0.17 has no private
// messages; nothing else sends them.
//
// Who talks to whom is in docs/architecture.md. A handle converts to a
// narrower interface whose messages it accepts (scheduler_actor to
// policy_control_actor), so an actor holds only what it needs.

#include <vector>

#include "actors/messages.hpp"

namespace metronome {

/// The client's side of one request (a net sink, an embedding program's
/// actor): the sender of a generate_request. It receives text_delta...,
/// then exactly one generation_done or generation_error. The frontend takes
/// the sender of generate_request to be this (CAF cannot check a sender's
/// type): an untyped client must handle these three messages.
using request_sink_actor = caf::typed_actor<caf::reacts_to<text_delta>,
                                            caf::reacts_to<generation_done>,
                                            caf::reacts_to<generation_error>>;

/// The engine's entry point: spawns a request actor for each
/// generate_request whose sink is the sender (an anonymous request is
/// dropped; a degraded engine answers generation_error unavailable at once).
using frontend_actor = caf::typed_actor<caf::reacts_to<generate_request>>;

/// What a request actor needs of the scheduling side: it admits itself
/// (admit_msg; the request actor is the sender, and hears from the
/// scheduler that runs it) and cancels (cancel_atom, seq id, why). With one
/// replica this is the scheduler_actor; with several (data parallel) the
/// replica_router_actor in front of their schedulers.
using admission_actor = caf::typed_actor<caf::reacts_to<admit_msg>,
                                         caf::reacts_to<cancel_atom, uint64_t, finish_kind>>;

/// One per request. token_msg and generation_error come from the scheduler;
/// timeout_atom is its own deadline (a request to itself that is never
/// answered, see request_actor.cpp); replica_lost from the router, when the
/// worker running it is gone. It also watches its sink (a DOWN cancels)
/// and the scheduler (a DOWN fails the request).
using request_actor = caf::typed_actor<caf::reacts_to<token_msg>,
                                       caf::reacts_to<generation_error>,
                                       caf::reacts_to<timeout_atom>,
                                       caf::reacts_to<replica_lost>>;

/// Receives the scheduler's prediction outcomes after each step that
/// finished predicted requests (the drift supervisor): the sender of
/// watch_atom.
using drift_watcher_actor = caf::typed_actor<caf::reacts_to<std::vector<drift_sample>>>;

/// What the drift supervisor needs of the scheduler: subscribe to outcomes
/// (watch_atom: the sender becomes the drift_watcher_actor), have the
/// predictor refit on the last window ns of history (recalibrate_atom), and
/// switch the admission policy (policy_atom; true once switched).
using policy_control_actor
  = caf::typed_actor<caf::reacts_to<watch_atom>, caf::reacts_to<recalibrate_atom, int64_t>,
                     caf::replies_to<policy_atom, policy_kind>::with<bool>>;

/// Receives the scheduler's KV overflow reports (the kv precision
/// supervisor): the sender of kv_watch_atom.
using kv_overflow_watcher_actor = caf::typed_actor<caf::reacts_to<kv_overflow_msg>>;

/// What the kv precision supervisor needs of the scheduler: subscribe to
/// overflow reports (kv_watch_atom: the sender becomes the
/// kv_overflow_watcher_actor, and overflowing requests are parked for its
/// decision), re-materialise a parked request in full precision
/// (remat_atom, seq id), keep one with its saturated values (kv_keep_atom,
/// seq id), and admit in full precision or not (cooldown_atom, true during
/// a cool-down).
using kv_precision_control_actor
  = caf::typed_actor<caf::reacts_to<kv_watch_atom>, caf::reacts_to<remat_atom, uint64_t>,
                     caf::reacts_to<kv_keep_atom, uint64_t>, caf::reacts_to<cooldown_atom, bool>>;

/// The scheduler actor (scheduler_actor.hpp). admit_msg's sender is the
/// request_actor it admits (monitored: its DOWN cancels); cancel_atom ends
/// a request (seq id, why); executor_up_msg and executor_down_msg come from
/// the engine supervisor; stats_atom answers its figures; tick_atom is its
/// own policy deadline timer (with an epoch: stale ticks are ignored);
/// and kv_precision_control_actor's messages.
using scheduler_actor = policy_control_actor::extend<
  caf::reacts_to<admit_msg>, caf::reacts_to<cancel_atom, uint64_t, finish_kind>,
  caf::reacts_to<executor_up_msg>, caf::reacts_to<executor_down_msg>,
  caf::replies_to<stats_atom>::with<scheduler_stats>, caf::reacts_to<tick_atom, uint64_t>,
  caf::reacts_to<kv_watch_atom>, caf::reacts_to<remat_atom, uint64_t>,
  caf::reacts_to<kv_keep_atom, uint64_t>, caf::reacts_to<cooldown_atom, bool>>;

// executor_actor, the executor's interface (one per device: step_plan ->
// step_output, step_done_atom, crash_atom), is declared in messages.hpp:
// executor_up_msg carries one.

/// The router in front of the replicas' schedulers, data parallel only
/// (replica_router_actor.hpp): admission_actor's messages, each forwarded
/// to the replica it places the request on (the request actor stays the
/// sender), and (ready_atom, replica, up) from the engine supervisor when a
/// replica leaves (false: its executor is down) or re-joins (true);
/// worker_attached and worker_lost from the worker registry for the
/// replicas that are other processes.
using replica_router_actor
  = admission_actor::extend<caf::reacts_to<ready_atom, int32_t, bool>,
                            caf::reacts_to<worker_attached>, caf::reacts_to<worker_lost>>;

/// A worker's agent (worker_agent.hpp), in the worker's process: answers
/// the front end's heartbeat (ping_atom with the front end's clock) with
/// its engine's health and load.
using worker_agent_actor
  = caf::typed_actor<caf::replies_to<ping_atom, int64_t>::with<worker_health>>;

/// The front end's worker registry (worker_registry.hpp), published on
/// workers.listen: answers a worker_join with worker_welcome (or a
/// worker_errc::refused error); (tick_atom, n) is its own heartbeat timer.
using worker_registry_actor
  = caf::typed_actor<caf::replies_to<worker_join>::with<worker_welcome>,
                     caf::reacts_to<tick_atom, uint64_t>>;

/// The drift supervisor (drift_supervisor.hpp): prediction outcomes from
/// the scheduler, its own re-evaluation timer (tick_atom), and stats_atom
/// for its window and the switches it made.
using drift_supervisor_actor
  = drift_watcher_actor::extend<caf::reacts_to<tick_atom, uint64_t>,
                                caf::replies_to<stats_atom>::with<drift_status>>;

/// The kv precision supervisor (kv_precision_supervisor.hpp): overflow
/// reports from the scheduler, its own cool-down timer (tick_atom, with an
/// epoch), and stats_atom for its state and the transitions it made.
using kv_precision_supervisor_actor
  = kv_overflow_watcher_actor::extend<caf::reacts_to<tick_atom, uint64_t>,
                                      caf::replies_to<stats_atom>::with<kv_precision_status>>;

/// The stats line's actor (stats_reporter.hpp): only its own timer.
using stats_reporter_actor = caf::typed_actor<caf::reacts_to<tick_atom, uint64_t>>;

/// The engine supervisor (engine_supervisor.hpp), which owns the
/// executors, the schedulers, the router and the watchers: executor_up_msg
/// from an executor it started; crash_atom crashes replica 0's executor,
/// (crash_atom, i) replica i's (fault injection for tests and drills);
/// (tick_atom, i) is its own timer that retries a removed replica i.
/// It also owns the worker registry, where workers can attach.
using engine_supervisor_actor
  = caf::typed_actor<caf::reacts_to<executor_up_msg>, caf::reacts_to<crash_atom>,
                     caf::reacts_to<crash_atom, int32_t>, caf::reacts_to<tick_atom, uint64_t>>;

} // namespace metronome
