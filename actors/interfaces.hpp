#pragma once
// Typed interfaces of Metronome's actors. The request actors, the frontend
// and the scheduler speak several message kinds and monitor others, so they
// are untyped `caf::actor`s; their messages are listed here as contracts.

#include "actors/messages.hpp"

namespace metronome {

/// One per device, on its own thread: runs a plan, replies with its tokens,
/// in plan order. A plan is submitted (model_runner::submit) as soon as it
/// arrives, also while earlier steps run: the runner queues it behind them,
/// so the device goes from one step to the next without waiting for the
/// host. Between messages the executor sleeps in its mailbox, never polls:
/// step_done_atom comes from its runner's step listener
/// (model_runner::set_step_listener, on a thread of the runner's) when a
/// step ends, and answers every step that has ended (none, for a late
/// one). crash_atom makes it fail as if its runner had
/// thrown: fault injection for tests and drills, and how the scheduler,
/// whose request for a step timed out, has a hung executor replaced.
using executor_actor = caf::typed_actor<caf::replies_to<step_plan>::with<step_output>,
                                        caf::reacts_to<step_done_atom>,
                                        caf::reacts_to<crash_atom, std::string>>;

// Untyped contracts:
//
// frontend:       generate_request (sender = the client's sink actor)
// request actor:  token_msg, generation_error (from the scheduler),
//                 timeout_atom (its own timer), DOWN of its sink (cancel)
// scheduler:      admit_msg (sender = request actor, monitored),
//                 cancel_atom + seq_id + finish_kind, executor_up_msg,
//                 executor_down_msg,
//                 policy_atom + policy_kind -> bool, stats_atom -> scheduler_stats,
//                 watch_atom (the sender then gets std::vector<drift_sample>
//                 after each step), recalibrate_atom + window
// drift supervisor: std::vector<drift_sample>; orders policy switches

} // namespace metronome
