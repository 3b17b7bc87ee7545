#pragma once
// Iteration-level (continuous) batching with chunked prefill, as plain C++:
// the scheduler actor turns messages into calls of this class, and sim/
// replays traces through it unchanged.
//
// Design note. There is no prefill phase and no decode phase: every request
// has tokens (prompt, output, and samples still in flight) and a count of
// tokens whose KV is computed; a step gives each scheduled request some of
// its uncomputed tokens under a token budget (max_num_batched_tokens) and a
// cap on running requests (max_batch_size). Running requests go first, in
// admission order, so decodes are never starved by prompts; a long prompt is
// split into chunks that fit the remaining budget. Then the admission policy
// orders the waiting requests. The scheduler owns the KV page pool and grants
// pages as it places chunks (as vLLM's scheduler calls its KV manager), so a
// plan leaves schedule() complete with page ids. When a running request needs
// a KV page and none is free, the most recently admitted running request is
// preempted: its pages are freed and it waits to be recomputed from prompt
// plus output.
// Plans are pipelined: up to pipeline_depth plans are in flight, and a request
// whose sample is still in flight counts that sample as a token, so the next
// plan can decode it before the previous step's output arrives. A finished
// request's pages are freed once no plan in flight uses it; a preempted
// request's at once, since plans run in order and no later one reads them.
//
// KV overflow (fp8_e5m2, under overflow supervision). A step that reports
// an overflow for a request parks it: it is scheduled no more and its
// tokens from that step on are held back, because they were computed on
// saturated keys or values. The decision is the supervisor's
// (sched/kv_precision_controller.hpp): rematerialize() drops the held
// tokens (and those still in flight) and preempts the request by recompute
// into full-precision pages; keep_overflowed() releases them. The prefix
// cache keeps the precisions apart: a page's chained hash starts from a
// salt of its precision, and the pages a request wrote before its overflow
// report are un-named, so no later request reads them without its own count.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sched/admission_policy.hpp"
#include "sched/finish_kind.hpp"
#include "sched/kv_buckets.hpp"
#include "sched/kv_page_pool.hpp"
#include "sched/kv_precision_controller.hpp"
#include "sched/step_cost.hpp"
#include "sched/token_groups.hpp"
#include "model/engine_limits.hpp"
#include "model/sampling.hpp"
#include "model/step_plan.hpp"

namespace metronome {

/// Settings of the scheduler.
struct scheduler_config {
  /// The engine's limits. The scheduler reads max_batch_size,
  /// max_num_batched_tokens, max_queued_requests and max_model_len, which
  /// must be resolved (> 0); its pages come from set_capacity.
  engine_limits limits;
  /// Plans in flight at once (2: the next plan is ready when a step ends).
  int32_t pipeline_depth = 2;
  /// Under a policy's step time limit, the prompt tokens a step may still
  /// compute when none fit (so prompts always progress).
  int32_t min_prefill_chunk = 32;
  /// Reuse the KV pages of earlier requests' identical prefixes
  /// (kv_page_pool.hpp); engine.prefix_caching.
  bool prefix_caching = true;
  /// Seeds the page hashes: names what else decides a page's content (the
  /// model, the KV dtype), and, drawn at random per process, keeps clients
  /// from crafting hash collisions (matches are verified token by token).
  uint64_t cache_salt = 0;
  /// engine.kv_strategy; the buckets' smallest size (classes of 1, 2, 4
  /// and 8 times it) and count per class, for bucketed.
  kv_strategy kv = kv_strategy::paged;
  int32_t kv_bucket_min_tokens = 4096;
  int32_t kv_buckets_per_size = 32;
  /// Token-aware grouping (batching.token_groups; sched/token_groups.hpp):
  /// with bounds, admission, preemption and decodes short of budget prefer
  /// requests that generated fewer tokens. None (the default): off.
  token_groups groups;
};

enum class request_status : uint8_t { waiting, running, finished };

/// A token a parked request sampled (sched_request::held).
struct held_token {
  sampled_token sample;
  /// Sequences in the step that sampled it.
  int32_t batch_size = 0;
};

/// A request as the scheduler tracks it.
struct sched_request {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  sampling_params params;
  uint64_t seed = 0;
  /// Tokens that end the request: the model's EOS ids (unless ignore_eos)
  /// and params.stop_token_ids.
  std::vector<int32_t> stop_ids;
  /// Most output tokens: max_tokens capped by the context.
  int32_t max_output = 0;
  sched_time arrival{0};
  std::optional<sched_time> first_scheduled;
  std::string request_class;
  float non_alnum_share = 0;
  /// The client's X-KV-Cache-Mode (none: the configured strategy; bucketed
  /// only where the configuration is bucketed), X-No-Batch (runs alone: no
  /// other request in its steps), and max_context_length (prompt plus
  /// output at most; 0: none), which also picks its bucket.
  std::optional<kv_strategy> kv_mode;
  bool no_batch = false;
  int32_t max_context = 0;

  // -- bookkeeping -----------------------------------------------------------
  request_status status = request_status::waiting;
  /// Tokens whose KV is computed or being computed by a plan in flight.
  int32_t num_computed = 0;
  /// Samples in flight (their tokens are not known yet).
  int32_t pending = 0;
  /// Plans in flight that include this request.
  int32_t inflight = 0;
  /// The runner holds its state (added, not yet released).
  bool in_runner = false;
  finish_kind finish_reason = finish_kind::none;
  int32_t preemptions = 0;
  /// Prefix cache: the chained hashes of its full pages of known tokens
  /// (prompt, output) computed so far, how many of its table's pages are
  /// named in the pool, and the tokens the cache gave it at its last
  /// admission (at arrival: what a lookup found then, for the policies).
  std::vector<uint64_t> page_hashes;
  int32_t named_pages = 0;
  int32_t cached_tokens = 0;
  /// The bucket class it holds (bucketed; -1: none, its pages are paged).
  int32_t bucket = -1;

  // -- KV precision (overflow supervision; see the note above) ---------------
  /// How its KV is written (at its next admission, and now while running),
  /// and why, where that is not the configured element type.
  kv_precision precision = kv_precision::configured;
  kv_fallback fallback = kv_fallback::none;
  /// An overflow was reported and not decided on yet: not scheduled, its
  /// tokens held.
  bool overflow_parked = false;
  std::vector<held_token> held;
  /// Samples in flight to drop when they arrive: made on overflowed values,
  /// before a re-materialisation.
  int32_t discard = 0;

  // -- for latency-aware policies (set and read by policies only) -------------
  double predicted_steps = 0;
  int32_t max_decode_steps = 0;
  int64_t cohort = -1;
  bool reclassified = false;

  /// Prompt, output and samples in flight.
  int32_t total_tokens() const {
    return int32_t(prompt.size() + output.size()) + pending;
  }
  /// Prompt and output tokens known (no sample in flight).
  int32_t known_tokens() const {
    return int32_t(prompt.size() + output.size());
  }
  /// Known token i (prompt, then output).
  int32_t token(int32_t i) const {
    return i < int32_t(prompt.size()) ? prompt[size_t(i)] : output[size_t(i) - prompt.size()];
  }
};

/// Why a request could not be queued.
enum class admit_result : uint8_t {
  ok,
  empty_prompt,
  too_long,
  too_large_for_cache,
  queue_full,
  duplicate,
  /// max_context_length below the prompt, or bucketed asked of a paged server.
  bad_kv_request
};

/// A token for a request, from one step's output.
struct token_event {
  uint64_t id = 0;
  int32_t token = 0;
  /// Sequences in the step.
  int32_t batch_size = 0;
  /// none while running; stop or length on the last token.
  finish_kind finish_reason = finish_kind::none;
  /// Set on the request's first token.
  std::optional<sched_time> first_scheduled;
  /// sampled_token::logprobs (empty unless the request asked).
  std::vector<token_logprob> logprobs;
  /// On the first token: prompt tokens the prefix cache gave the request.
  int32_t cached_tokens = 0;
  /// The request's arrival (with first_scheduled: its time in the queue).
  sched_time arrival{0};
  /// What its KV precision is at this token, where that matters (fp8_e5m2).
  kv_fallback fallback = kv_fallback::none;
};

/// A plan for the runner (page ids granted) and what the scheduler knows of it.
struct step_draft {
  step_plan plan;
  /// Per chunk: whether it ends with a sample (the runner returns a token).
  std::vector<uint8_t> samples;
  /// What the step computes, and how long the scheduler predicts it takes.
  step_shape shape;
  double predicted_ms = 0;
  /// The policy's step time limit this plan was cut to (stall-free steps).
  std::optional<double> limit_ms;
};

/// One step as planned and as run (the step trace, metrics/step_trace.hpp).
struct step_record {
  uint64_t step = 0;
  step_shape shape;
  /// The estimator's prediction when the step was planned.
  double predicted_ms = 0;
  /// The prior cost model's (step_cost) for the same shape.
  double prior_ms = 0;
  /// step_output::seconds and device_seconds, in milliseconds.
  double wall_ms = 0;
  double device_ms = 0;
};

/// What update_from_output produced.
struct step_update {
  std::vector<token_event> tokens;
  /// Requests that left the scheduler this update (finished or aborted).
  std::vector<uint64_t> finished;
  /// The step this output ends; nullopt when no plan was in flight.
  std::optional<step_record> step;
  /// Requests this output parked for a KV overflow (overflow supervision
  /// on): each waits for rematerialize() or keep_overflowed().
  std::vector<sequence_kv_overflow> overflows;
};

/// The scheduler. Not thread-safe: one owner (the scheduler actor, or the
/// replay loop) calls it.
class scheduler {
public:
  scheduler(scheduler_config config, std::unique_ptr<admission_policy> policy);

  /// The executor is (re)started with this much KV memory.
  void set_capacity(int32_t num_pages, int32_t page_size);

  /// Queues a request (id, prompt, params, seed, stop_ids, arrival and
  /// features set by the caller).
  admit_result add(sched_request request, sched_time now);

  /// Ends a request early (client gone, stop string, timeout) with `reason`.
  /// Returns false for an unknown or finished id. Its pages are freed, now
  /// or when no plan in flight uses it any more.
  bool abort(uint64_t id, finish_kind reason, sched_time now);

  /// Makes the next plan, or nullopt when there is nothing to do or
  /// pipeline_depth plans are in flight.
  std::optional<step_draft> schedule(sched_time now);

  /// Applies the output of the oldest plan in flight.
  step_update update_from_output(const step_output& out, sched_time now);

  // -- KV overflow supervision (the note above) ---------------------------------

  /// On: a step's KV overflow parks its request and update_from_output
  /// reports it (a supervisor decides). Off (the default): overflows are
  /// only counted. The owner's thread, any time.
  void set_overflow_supervision(bool on) {
    overflow_supervised_ = on;
  }

  /// The precision of admissions from now on: full during a cool-down
  /// (their fallback: cooldown), configured otherwise. A re-materialised
  /// request keeps full whatever this says.
  void set_admission_precision(kv_precision p) {
    admission_precision_ = p;
  }
  kv_precision admission_precision() const {
    return admission_precision_;
  }

  /// Re-materialises parked request `id`: its held tokens and its samples
  /// still in flight are dropped, and it is preempted by recompute (its
  /// pages freed) to be re-admitted first, in full precision, from its
  /// prompt and the output it had before the overflow. False (nothing
  /// changes) when `id` is not parked (finished, cancelled, unknown).
  bool rematerialize(uint64_t id, sched_time now);

  /// Keeps parked request `id` in the configured element type with its
  /// saturated values: it is scheduled again, and the tokens it held come
  /// out (step_update::tokens and finished, as update_from_output's). Its
  /// later overflows are counted, not reported. Nullopt when `id` is not
  /// parked.
  std::optional<step_update> keep_overflowed(uint64_t id, sched_time now);

  /// The requests parked for a KV overflow, waiting for a decision.
  std::vector<uint64_t> parked() const;

  /// Re-materialisations made; values that overflowed in all steps.
  int64_t rematerializations() const {
    return rematerializations_;
  }
  int64_t kv_overflow_values() const {
    return kv_overflow_values_;
  }

  /// The executor died: every request it held fails (returned), plans in
  /// flight are forgotten; waiting requests stay. Call set_capacity when it
  /// is back.
  std::vector<uint64_t> fail_runner();

  /// The prior of the step-time estimator (the device's fitted cost model,
  /// or the default); what it learned so far is reset.
  void set_step_cost(const step_cost& prior) {
    step_times_.reset(prior);
  }

  const step_time_estimator& step_times() const {
    return step_times_;
  }

  /// Swaps the admission policy; waiting requests are re-announced to it.
  void set_policy(std::unique_ptr<admission_policy> policy, sched_time now);

  const admission_policy& policy() const {
    return *policy_;
  }

  const sched_request* find(uint64_t id) const;

  // -- figures -----------------------------------------------------------------
  int32_t num_waiting() const {
    return int32_t(waiting_.size());
  }
  int32_t num_running() const {
    return int32_t(running_.size());
  }
  int32_t free_pages() const {
    return pool_.free_pages();
  }
  int32_t used_pages() const {
    return pool_.used_pages();
  }
  /// The KV page pool (page tables by sequence id).
  const kv_page_pool& pages() const {
    return pool_;
  }
  int32_t num_pages() const {
    return num_pages_;
  }
  int32_t page_size() const {
    return page_size_;
  }
  int32_t plans_in_flight() const {
    return int32_t(inflight_.size());
  }
  int64_t steps() const {
    return steps_;
  }
  int64_t preemptions() const {
    return preemptions_;
  }
  /// Steps whose prompt chunks were cut to the policy's step time limit.
  int64_t limited_steps() const {
    return limited_steps_;
  }
  /// Decisions token-aware grouping changed (zeros while it is off).
  const token_group_stats& group_stats() const {
    return group_stats_;
  }
  /// `r`'s token group (config().groups over its generated tokens).
  int32_t group_of(const sched_request& r) const {
    return config_.groups.group_of(int32_t(r.output.size()));
  }
  /// Prefix cache: tokens looked up at admissions, and those found cached
  /// (vLLM's prefix_cache_queries / prefix_cache_hits).
  int64_t prefix_queries() const {
    return prefix_queries_;
  }
  int64_t prefix_hits() const {
    return prefix_hits_;
  }
  /// Bucketed: admissions into a bucket and into overflow pages, and the
  /// pages buckets hold reserved but not yet used (the strategy's waste).
  int64_t bucket_admissions() const {
    return bucket_admissions_;
  }
  int64_t bucket_overflows() const {
    return bucket_overflows_;
  }
  int32_t reserved_unused_pages() const;
  const kv_buckets& buckets() const {
    return buckets_;
  }
  const scheduler_config& config() const {
    return config_;
  }

private:
  int32_t pages_for(int64_t tokens) const;
  /// KV pages `id` holds in the pool.
  int32_t pages_held(uint64_t id) const;
  /// Returns `id`'s pages to the pool, if it holds any, and its bucket.
  void release_pages(uint64_t id);
  /// Pages r may take now: the pool's free pages less what buckets hold
  /// reserved for others (r's own reservation counts for r).
  int32_t free_for(const sched_request& r) const;
  /// Bucketed: gives a waiting r the smallest free bucket that holds it,
  /// backed by free pages now; false: it goes paged (overflow).
  bool take_bucket(sched_request& r);
  void preempt(sched_request& r);
  /// Extends r.page_hashes to its first `pages` full pages of known tokens.
  void hash_pages(sched_request& r, int32_t pages);
  /// The cached pages that can hold r's first tokens (leaving at least one
  /// token to compute); none without prefix caching.
  std::vector<int32_t> cached_prefix(sched_request& r);
  /// Names r's full pages of known, computed tokens in the pool.
  void name_pages(sched_request& r);
  void finish(sched_request& r, finish_kind reason, sched_time now);
  /// Appends a sampled token to running r's output, ends r where it stops,
  /// and records the token's event in `u`.
  void accept_token(sched_request& r, const sampled_token& t, int32_t batch_size,
                    sched_time now, step_update& u);
  /// The seed of r's page hash chain: the cache salt, told apart by r's
  /// KV precision.
  uint64_t hash_salt(const sched_request& r) const;
  /// Sets the precision r is admitted with (and why); its page hashes are
  /// recomputed when the precision changes.
  void set_precision(sched_request& r, kv_precision p, kv_fallback why);
  void collect_finished(std::vector<uint64_t>* finished);
  std::vector<sched_request*> waiting_list();
  /// A running request as schedule() visits it: its id and its place in
  /// admission order.
  struct visit_entry {
    uint64_t id;
    int32_t admitted;
  };
  /// The order schedule() gives running requests their tokens: admission
  /// order; with token groups, the decodes sorted by group (lowest first,
  /// then admission order) within the places decodes hold.
  std::vector<visit_entry> running_order() const;
  /// The running request to preempt for visit[k]'s pages: among those not
  /// visited yet (after k) and holding no bucket, the most recently
  /// admitted, or with token groups the highest group's (counted when that
  /// differs). visit.size() for none.
  size_t pick_victim(const std::vector<visit_entry>& visit, size_t k);

  scheduler_config config_;
  std::unique_ptr<admission_policy> policy_;
  std::map<uint64_t, sched_request> requests_;
  std::deque<uint64_t> waiting_; // arrival order
  std::vector<uint64_t> running_; // admission order
  struct plan_in_flight {
    std::vector<uint64_t> ids;
    step_shape shape;
    double predicted_ms = 0;
  };
  /// Plans in flight, oldest first: their requests and their shape.
  std::deque<plan_in_flight> inflight_;
  step_time_estimator step_times_;
  /// Sequences to release from the runner with the next plan.
  std::vector<uint64_t> release_next_;
  /// Finished requests still used by a plan in flight.
  std::vector<uint64_t> finishing_;
  int32_t num_pages_ = 0;
  int32_t page_size_ = 16;
  kv_page_pool pool_;
  uint64_t next_step_ = 0;
  int64_t steps_ = 0;
  int64_t preemptions_ = 0;
  int64_t limited_steps_ = 0;
  token_group_stats group_stats_;
  int64_t prefix_queries_ = 0;
  int64_t prefix_hits_ = 0;
  kv_buckets buckets_;
  /// Requests holding a bucket (few: at most the running ones).
  std::vector<uint64_t> bucket_holders_;
  int64_t bucket_admissions_ = 0;
  int64_t bucket_overflows_ = 0;
  bool overflow_supervised_ = false;
  kv_precision admission_precision_ = kv_precision::configured;
  int64_t rematerializations_ = 0;
  int64_t kv_overflow_values_ = 0;
};

} // namespace metronome
