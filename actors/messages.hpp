#pragma once
// The message vocabulary of Metronome's actors: every type that travels
// between actors, its `inspect`, the type ID block, the atoms and the error
// enum. One struct per message kind.
//
// Each actor's interface, the messages it accepts, is in interfaces.hpp.
// Who sends what (see docs/architecture.md for a traced request):
//   client (net session, embedder) -> frontend:   generate_request
//   frontend -> request actor (spawned per request, client is its sink)
//   request actor -> scheduler:                    admit_msg, cancel_atom + finish_kind
//   scheduler -> request actor:                    token_msg, generation_error
//   request actor -> client sink:                  text_delta, generation_done,
//                                                  generation_error
//   scheduler -> executor:                         step_plan -> step_output
//   executor -> engine supervisor -> scheduler:    executor_up_msg
//   engine supervisor -> scheduler:                executor_down_msg
//   scheduler -> kv precision supervisor:          kv_overflow_msg
//   kv precision supervisor -> scheduler:          remat_atom / kv_keep_atom + seq id,
//                                                  cooldown_atom + bool
// Workers (other processes, docs/scale-out.md), over CAF's middleman:
//   worker -> front end's worker registry:          worker_join -> worker_welcome
//   registry -> worker agent (its heartbeat):       ping_atom -> worker_health
//   registry -> router:                             worker_attached, worker_lost
//   router -> request actor:                        replica_lost
// Every type a worker and its front end exchange is serialised by CAF with
// its `inspect` below; wire_version names the set.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "caf/all.hpp"

#include "model/model_runner.hpp"
#include "model/sampling.hpp"
#include "model/step_plan.hpp"
#include "sched/drift_detector.hpp"
#include "sched/finish_kind.hpp"
#include "sched/kv_buckets.hpp"
#include "sched/kv_precision_controller.hpp"

// -- std::optional in messages (CAF 0.17 knows only caf::optional) --------------

namespace caf {

template <class Inspector, class T>
typename std::enable_if<Inspector::reads_state, typename Inspector::result_type>::type
inspect(Inspector& f, std::optional<T>& x) {
  return x ? f(true, *x) : f(false);
}

template <class T>
struct std_optional_inspect_helper {
  bool& enabled;
  T& storage;
  template <class Inspector>
  friend typename Inspector::result_type inspect(Inspector& f, std_optional_inspect_helper& x) {
    return x.enabled ? f(x.storage) : f();
  }
};

template <class Inspector, class T>
typename std::enable_if<Inspector::writes_state, typename Inspector::result_type>::type
inspect(Inspector& f, std::optional<T>& x) {
  bool flag = false;
  T tmp{};
  std_optional_inspect_helper<T> helper{flag, tmp};
  auto guard = detail::make_scope_guard([&] {
    if (flag)
      x = std::move(tmp);
    else
      x.reset();
  });
  return f(flag, helper);
}

} // namespace caf

// -- type IDs and atoms ----------------------------------------------------------------
//
// The block comes before the message structs (declared here, defined
// below), so that a message may carry a typed handle, whose interface names
// the atoms: executor_up_msg holds an executor_actor.

namespace metronome {

struct chat_turn;
struct generate_request;
struct text_delta;
struct generation_done;
struct generation_error;
enum class request_errc : uint8_t;
struct admit_msg;
struct token_msg;
struct executor_up_msg;
struct executor_down_msg;
struct scheduler_stats;
struct drift_sample;
struct drift_status;
struct worker_join;
struct worker_welcome;
struct worker_health;
struct worker_attached;
struct worker_lost;
struct replica_lost;
struct kv_overflow_msg;
struct kv_precision_event;
struct kv_precision_status;

} // namespace metronome

CAF_BEGIN_TYPE_ID_BLOCK(metronome, caf::first_custom_type_id)
  CAF_ADD_TYPE_ID(metronome, (metronome::chat_turn))
  CAF_ADD_TYPE_ID(metronome, (metronome::generate_request))
  CAF_ADD_TYPE_ID(metronome, (metronome::text_delta))
  CAF_ADD_TYPE_ID(metronome, (metronome::generation_done))
  CAF_ADD_TYPE_ID(metronome, (metronome::generation_error))
  CAF_ADD_TYPE_ID(metronome, (metronome::request_errc))
  CAF_ADD_TYPE_ID(metronome, (metronome::admit_msg))
  CAF_ADD_TYPE_ID(metronome, (metronome::token_msg))
  CAF_ADD_TYPE_ID(metronome, (metronome::executor_up_msg))
  CAF_ADD_TYPE_ID(metronome, (metronome::executor_down_msg))
  CAF_ADD_TYPE_ID(metronome, (metronome::scheduler_stats))
  CAF_ADD_TYPE_ID(metronome, (metronome::sampling_params))
  CAF_ADD_TYPE_ID(metronome, (metronome::new_sequence))
  CAF_ADD_TYPE_ID(metronome, (metronome::scheduled_chunk))
  CAF_ADD_TYPE_ID(metronome, (metronome::step_plan))
  CAF_ADD_TYPE_ID(metronome, (metronome::sampled_token))
  CAF_ADD_TYPE_ID(metronome, (metronome::step_output))
  CAF_ADD_ATOM(metronome, metronome, cancel_atom, "cancel")
  CAF_ADD_ATOM(metronome, metronome, stats_atom, "stats")
  CAF_ADD_ATOM(metronome, metronome, tick_atom, "tick")
  CAF_ADD_ATOM(metronome, metronome, timeout_atom, "timeout")
  CAF_ADD_ATOM(metronome, metronome, policy_atom, "policy")
  CAF_ADD_ATOM(metronome, metronome, ready_atom, "ready")
  CAF_ADD_ATOM(metronome, metronome, crash_atom, "crash")
  CAF_ADD_TYPE_ID(metronome, (metronome::drift_sample))
  CAF_ADD_TYPE_ID(metronome, (std::vector<metronome::drift_sample>))
  CAF_ADD_TYPE_ID(metronome, (metronome::drift_event))
  CAF_ADD_TYPE_ID(metronome, (std::vector<metronome::drift_event>))
  CAF_ADD_TYPE_ID(metronome, (metronome::drift_status))
  CAF_ADD_ATOM(metronome, metronome, watch_atom, "watch")
  CAF_ADD_ATOM(metronome, metronome, recalibrate_atom, "recal")
  CAF_ADD_ATOM(metronome, metronome, step_done_atom, "stepdone")
  CAF_ADD_TYPE_ID(metronome, (metronome::policy_kind))
  CAF_ADD_TYPE_ID(metronome, (metronome::finish_kind))
  CAF_ADD_TYPE_ID(metronome, (metronome::worker_join))
  CAF_ADD_TYPE_ID(metronome, (metronome::worker_welcome))
  CAF_ADD_TYPE_ID(metronome, (metronome::worker_health))
  CAF_ADD_TYPE_ID(metronome, (metronome::worker_attached))
  CAF_ADD_TYPE_ID(metronome, (metronome::worker_lost))
  CAF_ADD_TYPE_ID(metronome, (metronome::replica_lost))
  CAF_ADD_ATOM(metronome, metronome, ping_atom, "ping")
  CAF_ADD_TYPE_ID(metronome, (metronome::kv_overflow_msg))
  CAF_ADD_TYPE_ID(metronome, (metronome::kv_precision_event))
  CAF_ADD_TYPE_ID(metronome, (std::vector<metronome::kv_precision_event>))
  CAF_ADD_TYPE_ID(metronome, (metronome::kv_precision_status))
  CAF_ADD_ATOM(metronome, metronome, kv_watch_atom, "kvwatch")
  CAF_ADD_ATOM(metronome, metronome, remat_atom, "remat")
  CAF_ADD_ATOM(metronome, metronome, kv_keep_atom, "kvkeep")
  CAF_ADD_ATOM(metronome, metronome, cooldown_atom, "cooldown")
CAF_END_TYPE_ID_BLOCK(metronome)

namespace metronome {

// -- client-facing messages ---------------------------------------------------------

/// One turn of a chat conversation.
struct chat_turn {
  std::string role;
  std::string content;
};

/// A generation request, in native types (the network edge parsed it).
/// Send it to the frontend actor; the sender becomes the request's sink and
/// receives text_delta..., then generation_done or generation_error.
struct generate_request {
  /// Client-visible id ("chatcmpl-...", or the WebSocket client's id).
  std::string request_id;
  /// Chat request: `messages` are rendered with the model's chat template.
  bool chat = false;
  std::vector<chat_turn> messages;
  bool add_generation_prompt = true;
  /// Completion request: `prompt` text, or `prompt_ids` when non-empty.
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  sampling_params params;
  /// Stop strings: generation ends before the first occurrence, which is
  /// not emitted; matched across token boundaries.
  std::vector<std::string> stop;
  bool skip_special_tokens = true;
  /// Request class or route, a feature for latency-aware policies.
  std::string request_class;
  /// Give up (generation_error, timeout) after this long; 0 = server default.
  std::chrono::milliseconds timeout{0};
  /// X-KV-Cache-Mode (none: the configured strategy), X-No-Batch (run
  /// alone), max_context_length (prompt plus output at most; 0: none).
  std::optional<kv_strategy> kv_mode;
  bool no_batch = false;
  int32_t max_context = 0;
};

/// A token as a client sees it beside its log-probability.
struct token_text_logprob {
  /// Its text; U+FFFD where it holds only part of a UTF-8 character.
  std::string text;
  /// Its exact bytes (OpenAI's "bytes": joined across tokens they make the
  /// characters that a single token cannot).
  std::string bytes;
  float logprob = 0;
};

/// The log-probabilities reported for one generated token.
struct position_logprobs {
  token_text_logprob sampled;
  /// The most likely tokens, most likely first (sampling_params::logprobs).
  std::vector<token_text_logprob> top;
};

/// New text of a request (never a partial UTF-8 character).
struct text_delta {
  std::string request_id;
  std::string text;
  /// The tokens this text came from.
  std::vector<int32_t> token_ids;
  /// With sampling_params::logprobs >= 0, one entry per token of token_ids
  /// (a token whose text is still held back is reported with the delta that
  /// releases it, so a delta may carry logprobs and no text).
  std::vector<position_logprobs> logprobs;
  /// Sequences in the engine step that produced the first token; set on the
  /// first delta only (0 afterwards).
  int32_t first_token_batch_size = 0;
  /// The request's prompt tokens, and the tokens generated so far (this
  /// delta's included): what the edge's access line reports of a request
  /// that ends without generation_done (cancelled, failed).
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  /// What the KV overflow supervision did to the request's KV precision so
  /// far (kv_fallback's to_string: "" nothing, "saturated",
  /// "rematerialized", "cooldown"); the edge reports it in
  /// X-KV-Cache-Strategy where the cache is fp8_e5m2.
  std::string kv_overflow;
};

/// The end of a request.
struct generation_done {
  std::string request_id;
  /// stop (EOS, stop token or stop string), length (max_tokens or the
  /// context) or cancelled (client or caller cancelled); the network edge
  /// writes its to_string.
  finish_kind finish_reason = finish_kind::stop;
  int32_t prompt_tokens = 0;
  /// Of prompt_tokens, those the prefix cache held (OpenAI's
  /// usage.prompt_tokens_details.cached_tokens).
  int32_t cached_tokens = 0;
  int32_t completion_tokens = 0;
  /// Arrival to first scheduled step.
  double queue_s = 0;
  /// Arrival to first token.
  double ttft_s = 0;
  /// Arrival to last token.
  double e2e_s = 0;
  int32_t first_token_batch_size = 0;
  /// As text_delta::kv_overflow, at the end.
  std::string kv_overflow;
};

/// What went wrong, with an HTTP mapping for the network edge.
enum class request_errc : uint8_t {
  invalid_request = 1, // 400
  context_length = 2,  // 400, param "messages"/"prompt"
  queue_full = 3,      // 429
  engine_failure = 4,  // 500
  timeout = 5,         // 504
  unavailable = 6,     // 503 (no model loaded, shutting down)
};

/// The HTTP status the network edge answers for a request_errc.
int http_status(request_errc code);

/// The OpenAI error "type" string for a request_errc.
const char* error_type(request_errc code);

std::string to_string(request_errc code);

/// Why an executor ended, where its supervisor must tell it apart from an
/// ordinary failure (sec::runtime_error with the runner's message).
enum class executor_errc : uint8_t {
  /// The device is unusable until the process exits (a lost CUDA context,
  /// a kernel that never ends): no restart, the process exits.
  device_lost = 1,
};

/// A request failed; nothing more follows for it.
struct generation_error {
  std::string request_id;
  request_errc code = request_errc::engine_failure;
  std::string message;
  /// The request field at fault, if any (OpenAI's "param").
  std::string param;
};

// -- engine-internal messages ---------------------------------------------------------

/// Request actor -> scheduler: admit this tokenized request. The sender is
/// the request actor; the scheduler monitors it (its DOWN cancels).
struct admit_msg {
  uint64_t seq_id = 0;
  std::vector<int32_t> prompt;
  sampling_params params;
  uint64_t seed = 0;
  /// Arrival (engine clock, ns since the engine's start).
  int64_t arrival_ns = 0;
  /// Features for prediction: class/route, share of non-alphanumeric
  /// characters in the prompt text.
  std::string request_class;
  float non_alnum_share = 0;
  /// generate_request's KV mode, no-batch flag and context hint.
  std::optional<kv_strategy> kv_mode;
  bool no_batch = false;
  int32_t max_context = 0;
};

/// Scheduler -> request actor: tokens sampled for it (usually one).
struct token_msg {
  uint64_t seq_id = 0;
  std::vector<int32_t> tokens;
  /// Per token, when the request asked for logprobs (sampled_token::logprobs).
  std::vector<std::vector<token_logprob>> logprobs;
  /// Sequences in the step that produced them.
  int32_t batch_size = 0;
  /// none while running, else stop or length: no more tokens follow.
  finish_kind finish_reason = finish_kind::none;
  /// Arrival to first scheduled step, in ns (a duration, so that it means
  /// the same in a front end whose clock is not the worker's); on the first
  /// token_msg only, -1 on the others.
  int64_t queue_ns = -1;
  /// Prompt tokens the prefix cache held (their KV was not computed); on the
  /// first token_msg only.
  int32_t cached_tokens = 0;
  /// The request's KV precision when these tokens were made
  /// (sched/kv_precision_controller.hpp).
  kv_fallback kv_overflow = kv_fallback::none;
};

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
/// (Declared here rather than in interfaces.hpp, with the other typed
/// interfaces, because executor_up_msg carries one.)
using executor_actor = caf::typed_actor<caf::replies_to<step_plan>::with<step_output>,
                                        caf::reacts_to<step_done_atom>,
                                        caf::reacts_to<crash_atom, std::string>>;

/// Executor -> engine supervisor -> scheduler: a (re)started executor is
/// ready.
struct executor_up_msg {
  /// The executor that sent it (null only in a default-constructed message).
  executor_actor executor;
  int32_t num_pages = 0;
  int32_t page_size = 0;
  std::string device;
  /// The runner's memory plan (model_runner::memory_plan).
  std::vector<memory_plan_entry> memory_plan;
};

/// Engine supervisor -> scheduler: the executor died; its KV is gone.
struct executor_down_msg {
  std::string reason;
  /// No restart follows: the supervisor has marked the engine degraded
  /// (engine_status::degraded), and the waiting requests fail too.
  bool permanent = false;
};

/// Scheduler figures for tests, /metrics and replay reports.
struct scheduler_stats {
  int32_t waiting = 0;
  int32_t running = 0;
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t finished = 0;
  int64_t cancelled = 0;
  int32_t live_requests = 0;
  /// KV pages held, and sequences holding any (0 and 0 when idle).
  int32_t kv_used_pages = 0;
  int32_t kv_sequences = 0;
  std::string policy;
};

// -- drift supervision ------------------------------------------------------------------

/// Scheduler -> drift supervisor (as std::vector<drift_sample>): finished
/// requests whose decode steps were predicted.
struct drift_sample {
  double predicted = 0;
  int32_t actual = 0;
  /// The predictor's calibration baseline when it predicted; < 0 = cold start.
  double expected_error = -1;
  /// Engine clock, ns.
  int64_t finished_ns = 0;
};


// -- KV overflow supervision ---------------------------------------------------------

/// Scheduler -> kv precision supervisor: a request's KV overflowed the
/// cache's element type (fp8_e5m2) in a step; it is parked until the
/// supervisor answers remat_atom or kv_keep_atom for it.
struct kv_overflow_msg {
  uint64_t seq_id = 0;
  /// Values of this step that saturated or were not finite.
  int64_t saturated = 0;
  int64_t non_finite = 0;
};

/// A transition of the kv precision supervisor, as logged and kept.
struct kv_precision_event {
  /// Engine clock, ns.
  int64_t at_ns = 0;
  /// "rematerialized", "kept", "cooldown_started" or "cooldown_ended".
  std::string event;
  /// The request it concerns (0 for cooldown_ended).
  uint64_t seq_id = 0;
  /// Re-materialisations in the window after it.
  int32_t in_window = 0;
};

/// The kv precision supervisor's answer to stats_atom.
struct kv_precision_status {
  bool cooling_down = false;
  /// Engine clock, ns; 0 while no cool-down runs.
  int64_t cooldown_until_ns = 0;
  int64_t overflows = 0;
  int64_t rematerialized = 0;
  int64_t kept = 0;
  /// The latest 64 transitions, oldest first.
  std::vector<kv_precision_event> events;
};

/// The drift supervisor's answer to stats_atom.
struct drift_status {
  bool disabled = false;
  double window_error = 0;
  double window_limit = 0;
  int64_t window_samples = 0;
  int64_t samples_seen = 0;
  std::vector<drift_event> events;
};

// -- workers (replicas in other processes) -------------------------------------------------

/// The version of the messages between a worker and its front end: raised
/// whenever a message above or below that crosses a process changes. A
/// worker of another version is refused at its join, naming both; CAF's
/// middleman refuses a build whose type registry differs
/// (middleman.app-identifiers carries it too).
inline constexpr int32_t wire_version = 2;

/// Why a front end refused a worker (the error's context says why).
enum class worker_errc : uint8_t {
  /// Another wire_version, another model, too short a context, no free slot.
  refused = 1,
};

/// Worker -> the front end's worker registry, which answers worker_welcome
/// or an error (worker_errc::refused with the reason).
struct worker_join {
  int32_t version = 0;
  /// Its name in logs and /metrics (unique among the attached: a second
  /// worker of a name replaces the first).
  std::string name;
  /// model_fingerprint() of its folder: config.json and the tokenizer, which
  /// the front end's request actors use to tokenize and decode for it.
  uint64_t model_fingerprint = 0;
  std::string model_name;
  /// Its resolved context; the front end refuses a worker whose is shorter
  /// than its own (it would refuse requests the front end accepts).
  int32_t max_model_len = 0;
  std::string device;
  int32_t kv_pages = 0;
  int32_t page_size = 0;
  /// Its scheduler (a scheduler_actor; untyped here because the interface
  /// is declared after this vocabulary): request actors of the front end
  /// admit themselves to it through the router.
  caf::actor scheduler;
  /// Its agent (a worker_agent_actor), which answers the heartbeat.
  caf::actor agent;
  /// The worker's engine clock when it sent this (ns): the registry's first
  /// estimate of its clock offset.
  int64_t now_ns = 0;
};

/// Registry -> worker: attached as replica `replica`.
struct worker_welcome {
  int32_t replica = 0;
  /// The front end's clock when it answered (ns, engine clock).
  int64_t now_ns = 0;
};

/// Worker agent -> registry, the answer to each heartbeat (ping_atom with
/// the front end's clock).
struct worker_health {
  /// Its engine has an executor up; false while it restarts one.
  bool ready = false;
  /// Its engine is degraded (the reason in `reason`): it is removed.
  bool degraded = false;
  std::string reason;
  int32_t waiting = 0;
  int32_t running = 0;
  int32_t kv_used_pages = 0;
  int32_t kv_total_pages = 0;
  int64_t live_requests = 0;
  /// The worker's engine clock when it answered (ns).
  int64_t now_ns = 0;
};

/// Registry -> router: replica `replica` is the worker `name`, whose
/// scheduler is `scheduler`; sent again when its clock offset is measured
/// anew. clock_offset_ns is the worker's engine clock minus the front
/// end's, which the router adds to each admission's arrival.
struct worker_attached {
  int32_t replica = 0;
  caf::actor scheduler;
  std::string name;
  int64_t clock_offset_ns = 0;
};

/// Registry -> router: the worker on `replica` is gone (its connection
/// closed, or it missed its heartbeats, or its engine is degraded).
struct worker_lost {
  int32_t replica = 0;
  std::string reason;
};

/// Router -> request actor: the replica running it was lost. The request
/// runs again elsewhere when no token of it has arrived yet, else fails.
/// Messages still coming from `scheduler` are dropped.
struct replica_lost {
  std::string reason;
  caf::actor_addr scheduler;
};

} // namespace metronome


CAF_ERROR_CODE_ENUM(metronome::request_errc, "request")
CAF_ERROR_CODE_ENUM(metronome::executor_errc, "executor")
CAF_ERROR_CODE_ENUM(metronome::worker_errc, "worker")

namespace metronome {

// -- inspect ----------------------------------------------------------------------------

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chat_turn& x) {
  return f(caf::meta::type_name("chat_turn"), x.role, x.content);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampling_params& x) {
  return f(caf::meta::type_name("sampling_params"), x.temperature, x.top_p, x.top_k, x.min_p,
           x.frequency_penalty, x.presence_penalty, x.repetition_penalty, x.seed, x.max_tokens,
           x.stop_token_ids, x.ignore_eos, x.logprobs);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generate_request& x) {
  return f(caf::meta::type_name("generate_request"), x.request_id, x.chat, x.messages,
           x.add_generation_prompt, x.prompt, x.prompt_ids, x.params, x.stop,
           x.skip_special_tokens, x.request_class, x.timeout, x.kv_mode, x.no_batch,
           x.max_context);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, text_delta& x) {
  return f(caf::meta::type_name("text_delta"), x.request_id, x.text, x.token_ids, x.logprobs,
           x.first_token_batch_size, x.prompt_tokens, x.completion_tokens, x.kv_overflow);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generation_done& x) {
  return f(caf::meta::type_name("generation_done"), x.request_id, x.finish_reason,
           x.prompt_tokens, x.cached_tokens, x.completion_tokens, x.queue_s, x.ttft_s, x.e2e_s,
           x.first_token_batch_size, x.kv_overflow);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generation_error& x) {
  return f(caf::meta::type_name("generation_error"), x.request_id, x.code, x.message, x.param);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, admit_msg& x) {
  return f(caf::meta::type_name("admit_msg"), x.seq_id, x.prompt, x.params, x.seed,
           x.arrival_ns, x.request_class, x.non_alnum_share, x.kv_mode, x.no_batch,
           x.max_context);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_msg& x) {
  return f(caf::meta::type_name("token_msg"), x.seq_id, x.tokens, x.logprobs, x.batch_size,
           x.finish_reason, x.queue_ns, x.cached_tokens, x.kv_overflow);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, memory_plan_entry& x) {
  return f(caf::meta::type_name("memory_plan_entry"), x.name, x.bytes);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, executor_up_msg& x) {
  return f(caf::meta::type_name("executor_up_msg"), x.executor, x.num_pages, x.page_size,
           x.device, x.memory_plan);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, executor_down_msg& x) {
  return f(caf::meta::type_name("executor_down_msg"), x.reason, x.permanent);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, scheduler_stats& x) {
  return f(caf::meta::type_name("scheduler_stats"), x.waiting, x.running, x.steps,
           x.preemptions, x.finished, x.cancelled, x.live_requests, x.kv_used_pages,
           x.kv_sequences, x.policy);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, new_sequence& x) {
  return f(caf::meta::type_name("new_sequence"), x.id, x.prompt, x.params, x.seed,
           x.num_output, x.num_cached, x.cached_pages, x.precision);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, scheduled_chunk& x) {
  return f(caf::meta::type_name("scheduled_chunk"), x.id, x.num_tokens, x.new_pages);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_plan& x) {
  return f(caf::meta::type_name("step_plan"), x.step, x.added, x.chunks, x.released);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sampled_token& x) {
  return f(caf::meta::type_name("sampled_token"), x.id, x.token, x.logprob, x.logprobs);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_logprob& x) {
  return f(caf::meta::type_name("token_logprob"), x.token, x.logprob);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_text_logprob& x) {
  return f(caf::meta::type_name("token_text_logprob"), x.text, x.bytes, x.logprob);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, position_logprobs& x) {
  return f(caf::meta::type_name("position_logprobs"), x.sampled, x.top);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_output& x) {
  return f(caf::meta::type_name("step_output"), x.step, x.tokens, x.num_tokens, x.num_seqs,
           x.seconds, x.device_seconds, x.kv_overflows);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sequence_kv_overflow& x) {
  return f(caf::meta::type_name("sequence_kv_overflow"), x.id, x.saturated, x.non_finite);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_overflow_msg& x) {
  return f(caf::meta::type_name("kv_overflow_msg"), x.seq_id, x.saturated, x.non_finite);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_precision_event& x) {
  return f(caf::meta::type_name("kv_precision_event"), x.at_ns, x.event, x.seq_id, x.in_window);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_precision_status& x) {
  return f(caf::meta::type_name("kv_precision_status"), x.cooling_down, x.cooldown_until_ns,
           x.overflows, x.rematerialized, x.kept, x.events);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, drift_sample& x) {
  return f(caf::meta::type_name("drift_sample"), x.predicted, x.actual, x.expected_error,
           x.finished_ns);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, drift_event& x) {
  return f(caf::meta::type_name("drift_event"), x.at_ns, x.action, x.policy, x.cause, x.error,
           x.limit, x.samples);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, drift_status& x) {
  return f(caf::meta::type_name("drift_status"), x.disabled, x.window_error, x.window_limit,
           x.window_samples, x.samples_seen, x.events);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_join& x) {
  return f(caf::meta::type_name("worker_join"), x.version, x.name, x.model_fingerprint,
           x.model_name, x.max_model_len, x.device, x.kv_pages, x.page_size, x.scheduler,
           x.agent, x.now_ns);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_welcome& x) {
  return f(caf::meta::type_name("worker_welcome"), x.replica, x.now_ns);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_health& x) {
  return f(caf::meta::type_name("worker_health"), x.ready, x.degraded, x.reason, x.waiting,
           x.running, x.kv_used_pages, x.kv_total_pages, x.live_requests, x.now_ns);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_attached& x) {
  return f(caf::meta::type_name("worker_attached"), x.replica, x.scheduler, x.name,
           x.clock_offset_ns);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_lost& x) {
  return f(caf::meta::type_name("worker_lost"), x.replica, x.reason);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_lost& x) {
  return f(caf::meta::type_name("replica_lost"), x.reason, x.scheduler);
}

/// Registers the type IDs and the error renderer on a CAF config. Call once
/// on every actor_system_config that runs Metronome's actors.
void register_message_types(caf::actor_system_config& cfg);

} // namespace metronome
