#include "sched/srpt_policy.hpp"

#include <algorithm>
#include <cmath>

#include "sched/scheduler.hpp"

namespace metronome {

// -- shared state ------------------------------------------------------------------

latency_aware_state latency_aware_state::make(predictor_options options) {
  return {std::make_shared<predictor>(options), std::make_shared<latency_aware_stats>()};
}

// -- latency_aware_policy ------------------------------------------------------------

latency_aware_policy::latency_aware_policy(latency_aware_state state, bool reclassify)
  : state_(std::move(state)), reclassify_(reclassify) {
  if (!state_.model)
    state_.model = std::make_shared<predictor>();
  if (!state_.stats)
    state_.stats = std::make_shared<latency_aware_stats>();
}

void latency_aware_policy::on_arrival(sched_request& r, sched_time) {
  if (r.predicted_steps > 0)
    return; // re-announced after a preemption or a policy switch
  r.predicted_steps = state_.model->predict(request_features::of(r));
  r.max_decode_steps = std::max<int32_t>(
    1, int32_t(std::ceil(r.predicted_steps * state_.model->options().max_steps_factor)));
}

void latency_aware_policy::on_token(sched_request& r, sched_time) {
  if (!reclassify_ || r.max_decode_steps <= 0 || int32_t(r.output.size()) <= r.max_decode_steps)
    return;
  // It outran its prediction: past k steps, expect about k more (lengths
  // are heavy-tailed), and stop counting it in its old cohort.
  if (!r.reclassified)
    ++state_.stats->reclassified_requests;
  ++state_.stats->reclassifications;
  r.reclassified = true;
  const double estimate = 2.0 * double(r.output.size());
  r.max_decode_steps = std::max<int32_t>(
    r.max_decode_steps + 1, int32_t(std::ceil(estimate * state_.model->options().max_steps_factor)));
  r.cohort = -1;
}

void latency_aware_policy::on_finish(const sched_request& r, sched_time now) {
  if (r.finish_reason != finish_kind::stop && r.finish_reason != finish_kind::length)
    return; // cancelled or failed: the length says nothing
  if (r.finish_reason == finish_kind::length && int32_t(r.output.size()) < r.max_output)
    return;
  std::optional<double> predicted;
  if (r.predicted_steps > 0)
    predicted = r.predicted_steps;
  state_.model->observe(request_features::of(r), int32_t(r.output.size()), predicted,
                        state_.model->expected_error(), now);
}

double latency_aware_policy::remaining_steps(const sched_request& r) const {
  double estimate = r.predicted_steps;
  if (r.reclassified)
    estimate = double(r.max_decode_steps) / state_.model->options().max_steps_factor;
  return std::max(1.0, estimate - double(r.output.size()));
}

bool latency_aware_policy::starves(const sched_request& r, sched_time now, sched_time min_wait,
                                   double tokens_per_s, double decode_step_weight) const {
  const auto waited = now - r.arrival;
  if (waited < min_wait)
    return false;
  if (tokens_per_s <= 0)
    return true;
  return std::chrono::duration<double>(waited).count() * tokens_per_s
         >= remaining_work(*this, r, decode_step_weight);
}

double remaining_work(const latency_aware_policy& p, const sched_request& r,
                      double decode_step_weight) {
  // Tokens the prefix cache holds count as done.
  const double uncomputed = double(r.total_tokens() - std::max(r.num_computed, r.cached_tokens));
  return uncomputed + decode_step_weight * p.remaining_steps(r);
}

// -- srpt -----------------------------------------------------------------------------

srpt_policy::srpt_policy(srpt_options options, latency_aware_state state)
  : latency_aware_policy(std::move(state), options.reclassify), options_(options) {
  // nop
}

std::vector<sched_request*> srpt_policy::admission_order(std::span<sched_request* const> waiting,
                                                         int32_t, sched_time now) {
  struct entry {
    bool promoted;
    double key;
    sched_time arrival;
    uint64_t id;
    sched_request* r;
  };
  std::vector<entry> es;
  es.reserve(waiting.size());
  for (auto* r : waiting) {
    const bool promoted = starves(*r, now, options_.promote_after,
                                  options_.literal ? 0.0 : options_.starvation_tokens_per_s,
                                  options_.decode_step_weight);
    const double key = options_.literal ? remaining_steps(*r)
                                        : remaining_work(*this, *r, options_.decode_step_weight);
    es.push_back({promoted, key, r->arrival, r->id, r});
  }
  std::sort(es.begin(), es.end(), [](const entry& a, const entry& b) {
    if (a.promoted != b.promoted)
      return a.promoted;
    if (a.promoted) // the front, in arrival order
      return a.arrival != b.arrival ? a.arrival < b.arrival : a.id < b.id;
    if (a.key != b.key)
      return a.key < b.key;
    return a.arrival != b.arrival ? a.arrival < b.arrival : a.id < b.id;
  });
  std::vector<sched_request*> out;
  out.reserve(es.size());
  for (const auto& e : es)
    out.push_back(e.r);
  return out;
}

} // namespace metronome
