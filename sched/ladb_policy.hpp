#pragma once
// Latency-aware dynamic batching (LADB) as an admission policy, and the
// factory that builds every latency-aware policy from one shared context.
// Plain C++, no actors; time is passed in.
//
// Design note (docs/scheduling.md has the measurements). The original system
// batched statically: a batch ran until its longest member finished, so it
// grouped requests of similar predicted length into cohorts, held a cohort
// until it had min_batch_size members or its hold window ended, and let a
// request that waited timeout_ms go at once. `literal` keeps that reading:
// cohorts of predicted decode steps within variance_tolerance, held for an
// adaptive 50..120 ms window, shortest first, timed-out requests in front.
// Under iteration-level batching a finished sequence leaves the batch at once,
// so cohorts buy nothing, holding only adds queueing, and a fixed timeout
// sends every request of a burst to the front in arrival order: the literal
// policy is fcfs plus a delay. What matters is who gets the step's token
// budget when it is scarce. The adapted LADB therefore:
//  - never holds (work-conserving); timeout_ms is trivially met;
//  - orders waiting requests by predicted remaining work, the uncomputed
//    prompt tokens (known exactly, the work that delays everyone behind it)
//    plus decode_step_weight x predicted decode steps, rounded to cohorts of
//    variance_tolerance (equal work goes in arrival order);
//  - guards against starvation by a bound on slowdown, not on waiting: a
//    request goes to the front once it waited longer than starvation_wait
//    and longer than its work / starvation_tokens_per_s;
//  - keeps steps stall-free: a step that carries prompt work next to decodes
//    may take at most step_time_factor x its decodes' predicted time (or
//    step_time_target_ms), and the scheduler cuts the prompt chunks to fit
//    (step_time_limit_ms). A step that only limits is a step that delays
//    every prompt, so a budget of long steps (long_step_share of all steps,
//    saved up to max_long_steps) lets a prompt that does not fit go whole
//    when long steps are rare: at light load prompts run as under fcfs, and
//    under load the long steps stay under the tail of the inter-token gaps;
//    and once a request has waited max_prompt_wait the queue is growing, so
//    steps go unlimited until it drains (overload degrades to fcfs' steps,
//    never below its throughput);
//  - keeps max_decode_steps = prediction x max_steps_factor and
//    re-classifies a request that outruns it (its estimate doubles), so a
//    preempted long request does not keep the priority of a short one.

#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_set>

#include "sched/srpt_policy.hpp"

namespace metronome {

/// Settings (config sections `batching` and `router`).
struct ladb_options {
  /// Largest cohort dispatched at once.
  int32_t max_batch_size = 32;
  /// A held cohort is dispatched once it has this many waiting members.
  int32_t min_batch_size = 4;
  /// Predictions within this relative distance form one cohort.
  double variance_tolerance = 0.2;
  /// Bounds of the adaptive hold window (literal).
  sched_time min_hold = std::chrono::milliseconds(50);
  sched_time max_hold = std::chrono::milliseconds(120);
  /// A request that waited this long is dispatched at once (front of the
  /// queue, oldest first).
  sched_time timeout = std::chrono::milliseconds(250);
  /// false: fallback_policy wait (timed-out requests keep their place).
  bool immediate_dispatch = true;
  /// false: router.queue_strategy fcfs (arrival order within what is ready).
  bool priority_by_remaining_steps = true;
  /// Prompt tokens one predicted decode step weighs in the remaining work.
  double decode_step_weight = 16.0;
  /// Aging: a second of waiting is worth this many tokens of remaining work
  /// (priority = arrival + work / aging_tokens_per_s, smallest first; 0 =
  /// shortest work first).
  double aging_tokens_per_s = 0.0;
  /// Starvation guard: a request that waited longer than starvation_wait
  /// and longer than its remaining work / starvation_tokens_per_s goes to
  /// the front, oldest first (a bound on its slowdown, not on its wait).
  sched_time starvation_wait = std::chrono::seconds(10);
  double starvation_tokens_per_s = 50.0;
  /// A step with prompt work may take this many times its decodes alone
  /// (predicted); 0 = no limit (the token budget only, as fcfs).
  double step_time_factor = 4.0;
  /// A cap on that limit in milliseconds (0 = none); the limit is never
  /// below the decodes' own time (batching.target_latency_ms).
  double max_step_ms = 0;
  /// Share of steps that may exceed the limit to run a prompt whole.
  double long_step_share = 0.05;
  /// Long steps saved up while none is needed.
  double max_long_steps = 4.0;
  /// No limit while a request has waited longer than this: the queue is
  /// growing, and cutting prompt chunks would only lengthen it (the limit
  /// costs throughput exactly when there is none to spare).
  sched_time max_prompt_wait = std::chrono::milliseconds(100);
  /// The original design read literally: hold cohorts of similar predicted
  /// decode steps, order by predicted steps alone.
  bool literal = false;
  /// Re-classify a request that runs past max_decode_steps (replay's
  /// ladb.reclassify; no configuration key).
  bool reclassify = true;
};

class ladb_policy final : public latency_aware_policy {
public:
  ladb_policy(ladb_options options, latency_aware_state state);

  std::string_view name() const override {
    return options_.literal ? "ladb-literal" : "ladb";
  }

  void on_arrival(sched_request& r, sched_time now) override;

  std::vector<sched_request*> admission_order(std::span<sched_request* const> waiting,
                                              int32_t free_slots, sched_time now) override;

  std::optional<sched_time> next_deadline(sched_time now) const override;

  std::optional<double> step_time_limit_ms(const step_load& load, sched_time now) override;

  /// Long steps saved up (see the note).
  double long_step_credit() const {
    return credit_;
  }

  /// The adapted order's priority of `r` (smaller goes first): arrival in
  /// seconds plus its remaining work, rounded to its cohort, over the aging
  /// rate.
  double priority(const sched_request& r) const;

  /// The hold window for the arrival rate measured so far.
  sched_time hold_window() const;

  /// Arrivals per second, exponentially averaged.
  double arrival_rate() const {
    return rate_;
  }

  const ladb_options& options() const {
    return options_;
  }

private:
  std::vector<sched_request*> literal_order(std::span<sched_request* const> waiting,
                                            sched_time now);
  std::vector<sched_request*> adapted_order(std::span<sched_request* const> waiting,
                                            sched_time now);
  int64_t cohort_of(double value) const;
  /// Adds the requests of `now_in` not yet in `seen` to `counter`.
  static void count_once(std::unordered_set<uint64_t>& seen,
                         const std::vector<sched_request*>& now_in,
                         std::span<sched_request* const> waiting, int64_t& counter);

  ladb_options options_;
  std::unordered_set<uint64_t> counted_timeouts_;
  std::unordered_set<uint64_t> promoted_;
  double rate_ = 0;
  double credit_ = 0;
  std::optional<sched_time> last_arrival_;
  std::optional<sched_time> deadline_;
};

/// Everything needed to build the policies of one scheduler: settings and
/// the state shared across policy switches.
struct policy_context {
  predictor_options predictor;
  ladb_options ladb;
  srpt_options srpt;
  latency_aware_state state;

  /// A context with a fresh predictor for `predictor` options.
  static std::shared_ptr<policy_context> make(predictor_options p = {}, ladb_options l = {},
                                              srpt_options s = {});
};

/// Builds policy `p` with `ctx`'s settings, sharing its predictor.
std::unique_ptr<admission_policy> make_admission_policy(policy_kind p,
                                                        const policy_context& ctx);

} // namespace metronome
