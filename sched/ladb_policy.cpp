#include "sched/ladb_policy.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

#include "sched/scheduler.hpp"

namespace metronome {

ladb_policy::ladb_policy(ladb_options options, latency_aware_state state)
  : latency_aware_policy(std::move(state), options.reclassify), options_(options) {
  // nop
}

// -- arrivals and the hold window -------------------------------------------------

void ladb_policy::on_arrival(sched_request& r, sched_time now) {
  const bool fresh = r.predicted_steps <= 0;
  latency_aware_policy::on_arrival(r, now);
  if (!fresh)
    return;
  if (last_arrival_ && now > *last_arrival_) {
    const double gap = std::chrono::duration<double>(now - *last_arrival_).count();
    const double inst = 1.0 / std::max(gap, 1e-6);
    rate_ = rate_ == 0 ? inst : 0.9 * rate_ + 0.1 * inst;
  }
  if (!last_arrival_ || now > *last_arrival_)
    last_arrival_ = now;
  r.cohort = cohort_of(r.predicted_steps);
}

sched_time ladb_policy::hold_window() const {
  // Long enough to expect min_batch_size arrivals at the measured rate,
  // within [min_hold, max_hold].
  if (rate_ <= 0)
    return options_.max_hold;
  const auto fill = std::chrono::duration_cast<sched_time>(
    std::chrono::duration<double>(double(options_.min_batch_size) / rate_));
  return std::clamp(fill, options_.min_hold, options_.max_hold);
}

int64_t ladb_policy::cohort_of(double value) const {
  const double width = std::log1p(std::max(options_.variance_tolerance, 1e-3));
  return int64_t(std::floor(std::log(std::max(value, 1.0)) / width));
}

void ladb_policy::count_once(std::unordered_set<uint64_t>& seen,
                             const std::vector<sched_request*>& now_in,
                             std::span<sched_request* const> waiting, int64_t& counter) {
  for (auto* r : now_in)
    if (seen.insert(r->id).second)
      ++counter;
  if (seen.size() > 2 * waiting.size() + 64) { // forget requests that left
    std::unordered_set<uint64_t> keep;
    for (auto* r : waiting)
      if (seen.contains(r->id))
        keep.insert(r->id);
    seen.swap(keep);
  }
}

std::optional<sched_time> ladb_policy::next_deadline(sched_time) const {
  return deadline_;
}

std::vector<sched_request*> ladb_policy::admission_order(std::span<sched_request* const> waiting,
                                                         int32_t, sched_time now) {
  return options_.literal ? literal_order(waiting, now) : adapted_order(waiting, now);
}

// -- the original design -----------------------------------------------------------

std::vector<sched_request*> ladb_policy::literal_order(std::span<sched_request* const> waiting,
                                                       sched_time now) {
  const auto hold = hold_window();
  std::vector<sched_request*> front;  // preempted, then timed out
  std::vector<sched_request*> timed_out;
  std::map<int64_t, std::vector<sched_request*>> cohorts;
  deadline_.reset();
  auto consider = [&](sched_time t) {
    if (t > now && (!deadline_ || t < *deadline_))
      deadline_ = t;
  };
  for (auto* r : waiting) {
    if (r->preemptions > 0) {
      front.push_back(r); // it was running: never hold it again
      continue;
    }
    if (now - r->arrival >= options_.timeout && options_.immediate_dispatch) {
      timed_out.push_back(r);
      continue;
    }
    if (r->cohort < 0)
      r->cohort = cohort_of(remaining_steps(*r));
    cohorts[r->cohort].push_back(r);
    if (options_.immediate_dispatch)
      consider(r->arrival + options_.timeout);
  }
  std::sort(timed_out.begin(), timed_out.end(), [](auto* a, auto* b) {
    return a->arrival != b->arrival ? a->arrival < b->arrival : a->id < b->id;
  });
  count_once(counted_timeouts_, timed_out, waiting, state_.stats->timeout_dispatches);
  front.insert(front.end(), timed_out.begin(), timed_out.end());

  // Cohorts that may go: full enough, or held for the whole window.
  struct ready_cohort {
    double key;
    std::vector<sched_request*> members;
  };
  std::vector<ready_cohort> ready;
  for (auto& [id, members] : cohorts) {
    sched_time oldest = members.front()->arrival;
    for (auto* r : members)
      oldest = std::min(oldest, r->arrival);
    const bool full = int32_t(members.size()) >= options_.min_batch_size;
    if (!full && now - oldest < hold) {
      consider(oldest + hold);
      continue;
    }
    if (options_.priority_by_remaining_steps)
      std::sort(members.begin(), members.end(), [&](auto* a, auto* b) {
        const double ka = remaining_steps(*a), kb = remaining_steps(*b);
        return ka != kb ? ka < kb : a->arrival != b->arrival ? a->arrival < b->arrival : a->id < b->id;
      });
    else
      std::sort(members.begin(), members.end(), [](auto* a, auto* b) {
        return a->arrival != b->arrival ? a->arrival < b->arrival : a->id < b->id;
      });
    if (int32_t(members.size()) > options_.max_batch_size)
      members.resize(size_t(options_.max_batch_size)); // the rest form the next dispatch
    const double key = options_.priority_by_remaining_steps ? remaining_steps(*members.front())
                                                            : double(members.front()->arrival.count());
    ready.push_back({key, std::move(members)});
  }
  std::stable_sort(ready.begin(), ready.end(),
                   [](const auto& a, const auto& b) { return a.key < b.key; });
  for (auto& c : ready)
    front.insert(front.end(), c.members.begin(), c.members.end());
  return front;
}

// -- adapted to iteration-level batching ---------------------------------------------

double ladb_policy::priority(const sched_request& r) const {
  const double work = options_.priority_by_remaining_steps
                        ? remaining_work(*this, r, options_.decode_step_weight)
                        : 0.0;
  // Work within variance_tolerance of each other is one cohort: equal here.
  const double width = std::log1p(std::max(options_.variance_tolerance, 1e-3));
  const double cohort_work = std::exp(double(cohort_of(work)) * width);
  const double arrival = std::chrono::duration<double>(r.arrival).count();
  return options_.aging_tokens_per_s > 0 ? arrival + cohort_work / options_.aging_tokens_per_s
                                         : cohort_work;
}

std::vector<sched_request*> ladb_policy::adapted_order(std::span<sched_request* const> waiting,
                                                       sched_time now) {
  struct entry {
    int rank; // 0 preempted, 1 starving, 2 the rest
    double priority;
    sched_time arrival;
    uint64_t id;
    sched_request* r;
  };
  deadline_.reset(); // work-conserving: never holds a request back
  std::vector<entry> es;
  es.reserve(waiting.size());
  std::vector<sched_request*> starving;
  for (auto* r : waiting) {
    int rank = 2;
    if (r->preemptions > 0)
      rank = 0; // it was running: recompute it first
    else if (starves(*r, now, options_.starvation_wait, options_.starvation_tokens_per_s,
                             options_.decode_step_weight)) {
      rank = 1;
      starving.push_back(r);
    }
    es.push_back({rank, rank == 2 ? priority(*r) : 0.0, r->arrival, r->id, r});
  }
  count_once(promoted_, starving, waiting, state_.stats->promotions);
  std::sort(es.begin(), es.end(), [](const entry& a, const entry& b) {
    if (a.rank != b.rank)
      return a.rank < b.rank;
    if (a.priority != b.priority)
      return a.priority < b.priority;
    return a.arrival != b.arrival ? a.arrival < b.arrival : a.id < b.id;
  });
  // At most max_batch_size admissions a step (batching.max_batch_size).
  std::vector<sched_request*> out;
  out.reserve(std::min(es.size(), size_t(std::max(options_.max_batch_size, 1))));
  for (const auto& e : es) {
    if (int32_t(out.size()) >= std::max(options_.max_batch_size, 1))
      break;
    out.push_back(e.r);
  }
  return out;
}

std::optional<double> ladb_policy::step_time_limit_ms(const step_load& load, sched_time) {
  if (options_.literal)
    return std::nullopt;
  double limit = options_.step_time_factor > 0 ? options_.step_time_factor * load.decode_ms
                                               : std::numeric_limits<double>::infinity();
  if (options_.max_step_ms > 0)
    limit = std::min(limit, options_.max_step_ms);
  if (!std::isfinite(limit))
    return std::nullopt;
  limit = std::max(limit, load.decode_ms);
  credit_ = std::min(credit_ + options_.long_step_share, std::max(options_.max_long_steps, 1.0));
  if (load.decode_ms + load.prefill_ms <= limit)
    return limit; // the ready prompt work fits: no long step needed
  if (load.oldest_wait > options_.max_prompt_wait) {
    ++state_.stats->relaxed_steps;
    return std::nullopt;
  }
  if (credit_ >= 1.0) {
    credit_ -= 1.0;
    ++state_.stats->long_steps;
    return std::nullopt;
  }
  return limit;
}

// -- the factory ---------------------------------------------------------------------

std::shared_ptr<policy_context> policy_context::make(predictor_options p, ladb_options l,
                                                     srpt_options s) {
  auto ctx = std::make_shared<policy_context>();
  ctx->predictor = p;
  ctx->ladb = l;
  ctx->srpt = s;
  ctx->state = latency_aware_state::make(p);
  return ctx;
}

std::unique_ptr<admission_policy> make_admission_policy(policy_kind p,
                                                        const policy_context& ctx) {
  auto state = ctx.state;
  if (!state.model)
    state = latency_aware_state::make(ctx.predictor);
  switch (p) {
    case policy_kind::fcfs:
      return std::make_unique<fcfs_policy>();
    case policy_kind::ladb:
    case policy_kind::ladb_literal: {
      auto o = ctx.ladb;
      o.literal = p == policy_kind::ladb_literal;
      return std::make_unique<ladb_policy>(o, state);
    }
    case policy_kind::srpt:
    case policy_kind::srpt_literal: {
      auto o = ctx.srpt;
      o.literal = p == policy_kind::srpt_literal;
      return std::make_unique<srpt_policy>(o, state);
    }
  }
  throw std::invalid_argument("make_admission_policy: no policy " + std::to_string(int(p)));
}

} // namespace metronome
