#pragma once
// Shortest predicted remaining work first, with aging (the original system's
// token-slice scheduler), and the base every latency-aware policy shares:
// prediction on arrival, re-classification of requests that outrun their
// prediction, and feedback of finished requests to the predictor. Plain C++,
// no actors; time is passed in.
//
// Design note. Under iteration-level batching a waiting request is held back
// only by the *prompt* work admitted before it: once a request's prompt is
// computed it needs one token of the step budget per step, and a finished
// sequence frees its slot at once, so decode length barely delays others.
// The remaining work that orders the queue is therefore the request's
// uncomputed prompt tokens (known exactly) plus its predicted decode steps
// weighted by `decode_step_weight` prompt tokens each. The original ordered
// by predicted decode steps alone; `literal` keeps that. Starvation is
// bounded by slowdown, not by waiting: a request goes to the front once it
// waited longer than `promote_after` and longer than its remaining work /
// `starvation_tokens_per_s`. (A bound on waiting alone sends every request
// of a burst to the front in arrival order: the queue becomes first come,
// first served exactly when order matters.)

#include <cstdint>
#include <memory>
#include <optional>

#include "sched/admission_policy.hpp"
#include "sched/predictor.hpp"

namespace metronome {

/// Counters of the latency-aware policies, shared by every policy built from
/// one context, so they survive a policy switch. Scheduler thread only.
struct latency_aware_stats {
  /// Requests that ran past max_decode_steps (each counted once).
  int64_t reclassified_requests = 0;
  /// Times a request ran past its current max_decode_steps.
  int64_t reclassifications = 0;
  /// Requests dispatched by the timeout fallback (LADB).
  int64_t timeout_dispatches = 0;
  /// Requests sent to the front by LADB's starvation guard.
  int64_t promotions = 0;
  /// Steps LADB let exceed its step time limit to run a prompt whole.
  int64_t long_steps = 0;
  /// Steps LADB left unlimited because a request waited max_prompt_wait.
  int64_t relaxed_steps = 0;
};

/// What the latency-aware policies share: the predictor (it keeps learning
/// across policy switches) and the counters.
struct latency_aware_state {
  std::shared_ptr<predictor> model;
  std::shared_ptr<latency_aware_stats> stats;

  /// A fresh predictor and counters.
  static latency_aware_state make(predictor_options options);
};

/// The common part of ladb and srpt.
class latency_aware_policy : public admission_policy {
public:
  /// `reclassify` false: a request that outruns max_decode_steps keeps its
  /// estimate (the measurement's "off"; docs/scheduling.md).
  explicit latency_aware_policy(latency_aware_state state, bool reclassify = true);

  /// Predicts the request's decode steps (once; kept across preemptions and
  /// policy switches) and sets max_decode_steps.
  void on_arrival(sched_request& r, sched_time now) override;

  /// Re-classifies a request that ran past max_decode_steps.
  void on_token(sched_request& r, sched_time now) override;

  /// Feeds a finished request's actual steps back to the predictor.
  void on_finish(const sched_request& r, sched_time now) override;

  /// The current estimate of `r`'s decode steps still to run (>= 1).
  double remaining_steps(const sched_request& r) const;

  /// Whether `r` waited longer than `min_wait` and longer than its remaining
  /// work / `tokens_per_s` (<= 0: the wait alone decides).
  bool starves(const sched_request& r, sched_time now, sched_time min_wait, double tokens_per_s,
               double decode_step_weight) const;

  const latency_aware_state& state() const {
    return state_;
  }

protected:
  latency_aware_state state_;
  bool reclassify_ = true;
};

/// Settings of srpt (config `router.srpt_promote_after_ms`).
struct srpt_options {
  /// A request waiting this long, and longer than its work /
  /// starvation_tokens_per_s, goes to the front (oldest first).
  sched_time promote_after = std::chrono::milliseconds(150);
  double starvation_tokens_per_s = 50.0;
  /// Prompt tokens one predicted decode step weighs in the remaining work.
  double decode_step_weight = 16.0;
  /// Order by predicted decode steps alone (the original, prompt-blind).
  bool literal = false;
  /// Re-classify a request that runs past max_decode_steps (replay's
  /// srpt.reclassify; no configuration key).
  bool reclassify = true;
};

/// The remaining work of a waiting request in prompt-token units: its
/// uncomputed tokens plus weight x predicted remaining decode steps.
double remaining_work(const latency_aware_policy& p, const sched_request& r,
                      double decode_step_weight);

class srpt_policy final : public latency_aware_policy {
public:
  srpt_policy(srpt_options options, latency_aware_state state);

  std::string_view name() const override {
    return options_.literal ? "srpt-literal" : "srpt";
  }

  std::vector<sched_request*> admission_order(std::span<sched_request* const> waiting,
                                              int32_t free_slots, sched_time now) override;

private:
  srpt_options options_;
};

} // namespace metronome
