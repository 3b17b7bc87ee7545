#include "sim/replay.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <stdexcept>
#include <unordered_map>

#include "sched/replica_router.hpp"
#include "sched/step_trace.hpp"

namespace metronome::sim {

namespace {

constexpr int32_t stop_token = 2;
constexpr int32_t other_token = 1000;

double seconds(sched_time t) {
  return double(t.count()) / 1e9;
}

sched_time from_seconds(double s) {
  return sched_time{int64_t(std::llround(s * 1e9))};
}

const char* describe(admit_result r) {
  switch (r) {
    case admit_result::ok:
      return "";
    case admit_result::empty_prompt:
      return "empty_prompt";
    case admit_result::too_long:
      return "too_long";
    case admit_result::too_large_for_cache:
      return "too_large_for_cache";
    case admit_result::queue_full:
      return "queue_full";
    case admit_result::duplicate:
      return "duplicate";
    case admit_result::bad_kv_request:
      return "bad_kv_request";
  }
  return "unknown";
}

/// The replay's mutable state: the loop in replay() drives it.
class replay_loop {
public:
  replay_loop(const trace& t, const replay_options& o) : trace_(t), o_(o) {
    config_ = o.settings.scheduler;
    auto& limits = config_.limits;
    if (limits.max_model_len <= 0)
      limits.max_model_len = o.cost.max_model_len;
    if (o.unbounded_queue)
      limits.max_queued_requests = std::numeric_limits<int32_t>::max();
    const int64_t kv_tokens
      = limits.kv_cache_tokens > 0 ? limits.kv_cache_tokens : o.cost.kv_cache_tokens;
    page_size_ = limits.page_size;
    num_pages_ = int32_t(kv_tokens / page_size_);
    // As the engine: each replica's policies learn from its own requests;
    // the drift supervisor watches one scheduler, so it runs with one only.
    drift_on_ = o.policy != policy_kind::fcfs && o.settings.drift.enabled && o.replicas == 1;
    replicas_.resize(size_t(o.replicas));
    for (auto& r : replicas_) {
      r.ctx = policy_context::make(o.settings.predictor, o.settings.ladb, o.settings.srpt);
      r.sched = std::make_unique<scheduler>(config_, make_admission_policy(o.policy, *r.ctx));
      r.sched->set_capacity(num_pages_, page_size_);
      r.sched->set_step_cost(o.cost.step);
    }
    if (o.replicas > 1) {
      replica_router_config rc;
      rc.replicas = o.replicas;
      rc.page_size = page_size_;
      rc.prefix_affinity = config_.prefix_caching;
      router_.emplace(rc);
    }
    if (!o.step_trace.empty())
      trace_out_ = std::make_unique<step_trace>(o.step_trace);
    detector_ = std::make_unique<drift_detector>(o.settings.drift);
    res_.policy = to_string(o.policy);
    res_.trace_name = t.name;
    res_.rate_scale = o.rate_scale;
    res_.max_batch_size = limits.max_batch_size;
    res_.kv_pages = num_pages_;
    res_.page_size = page_size_;
    res_.cost = o.cost;
    res_.replicas = o.replicas;
    res_.requests.resize(t.requests.size());
    produced_.assign(t.requests.size(), 0);
    last_token_.assign(t.requests.size(), sched_time{0});
    int64_t total_out = 0;
    for (size_t i = 0; i < t.requests.size(); ++i) {
      const auto& q = t.requests[i];
      auto& r = res_.requests[i];
      r.index = int32_t(i);
      r.arrival_s = seconds(arrival(i));
      r.prompt_tokens = q.prompt_tokens;
      r.output_tokens = q.output_tokens;
      auto u = unloaded(o.cost, q.prompt_tokens, q.output_tokens, limits.max_num_batched_tokens);
      r.unloaded_ttft_s = u.ttft_s;
      r.unloaded_e2e_s = u.e2e_s;
      total_out += q.output_tokens;
    }
    res_.itl_s.reserve(size_t(total_out));
  }

  replay_result run() {
    constexpr auto never = sched_time::max();
    size_t next = 0;
    while (true) {
      const auto t_arrival = next < trace_.requests.size() ? arrival(next) : never;
      // The earliest step end and wake-up over the replicas: the lowest
      // replica first on a tie.
      auto t_step = never, t_wake = never;
      size_t step_at = 0, wake_at = 0;
      for (size_t k = 0; k < replicas_.size(); ++k) {
        const auto& r = replicas_[k];
        if (!r.running.empty() && r.running.front().end < t_step) {
          t_step = r.running.front().end;
          step_at = k;
        }
        if (r.wake && *r.wake < t_wake) {
          t_wake = *r.wake;
          wake_at = k;
        }
      }
      auto t_drift = never;
      if (drift_on_)
        if (auto c = detector_->next_check())
          t_drift = std::max(*c, now_ + sched_time{1});
      const auto t = std::min({t_arrival, t_step, t_wake, t_drift});
      if (t == never)
        break;
      if (next == trace_.requests.size() && idle())
        break; // everything is done; pending drift checks do not matter
      now_ = std::max(now_, t);
      // Only the replica an event concerns is scheduled after it.
      size_t k = 0;
      if (t == t_step) {
        k = step_at;
        end_step(k);
      } else if (t == t_arrival) {
        k = admit(next++);
      } else if (t == t_wake) {
        k = wake_at;
        replicas_[k].wake.reset();
      } else {
        apply(detector_->evaluate(now_));
      }
      pump(k);
    }
    for (const auto& r : replicas_)
      if (r.sched->num_waiting() + r.sched->num_running() > 0)
        throw std::runtime_error("replay stalled at " + std::to_string(seconds(now_)) + " s with "
                                 + std::to_string(r.sched->num_waiting())
                                 + " requests waiting and no deadline (policy "
                                 + std::string(r.sched->policy().name()) + ")");
    if (disabled_since_)
      res_.disabled_s += seconds(now_ - *disabled_since_);
    res_.kv_strategy = to_string(replicas_.front().sched->config().kv);
    res_.token_groups = replicas_.front().sched->config().groups.to_string();
    for (auto& r : replicas_) {
      const auto& s = *r.sched;
      res_.steps += s.steps();
      res_.preemptions += s.preemptions();
      res_.limited_steps += s.limited_steps();
      res_.group_stats.admissions += s.group_stats().admissions;
      res_.group_stats.preemptions += s.group_stats().preemptions;
      res_.group_stats.decodes += s.group_stats().decodes;
      res_.prefix_queries += s.prefix_queries();
      res_.prefix_hits += s.prefix_hits();
      res_.bucket_admissions += s.bucket_admissions();
      res_.bucket_overflows += s.bucket_overflows();
      add(res_.policy_stats, *r.ctx->state.stats);
      r.record.steps = s.steps();
      r.record.preemptions = s.preemptions();
      r.record.prefix_hits = s.prefix_hits();
      res_.per_replica.push_back(r.record);
    }
    for (const auto& r : res_.requests)
      if (r.e2e_s >= 0)
        res_.makespan_s = std::max(res_.makespan_s, r.arrival_s + r.e2e_s);
    return std::move(res_);
  }

private:
  struct plan_in_flight {
    step_draft draft;
    sched_time end{0};
    double ms = 0;
  };

  /// One replica: a scheduler with its policies, and its simulated executor.
  struct replica_sim {
    std::shared_ptr<policy_context> ctx;
    std::unique_ptr<scheduler> sched;
    /// When the executor has run every plan queued so far.
    sched_time executor_free{0};
    /// The policy's next hold deadline.
    std::optional<sched_time> wake;
    /// Plans queued at the executor, oldest first.
    std::deque<plan_in_flight> running;
    replica_record record;
  };

  static void add(latency_aware_stats& to, const latency_aware_stats& s) {
    to.reclassified_requests += s.reclassified_requests;
    to.reclassifications += s.reclassifications;
    to.timeout_dispatches += s.timeout_dispatches;
    to.promotions += s.promotions;
    to.long_steps += s.long_steps;
    to.relaxed_steps += s.relaxed_steps;
  }

  bool idle() const {
    for (const auto& r : replicas_)
      if (!r.running.empty() || r.sched->num_waiting() > 0 || r.sched->num_running() > 0)
        return false;
    return true;
  }

  /// A prompt of q.prompt_tokens tokens: each hash_ids block the same
  /// tokens wherever it appears (the prefix cache shares them), the rest
  /// unique to the request. Never the stop token.
  static std::vector<int32_t> prompt_of(const trace_request& q, uint64_t id) {
    std::vector<int32_t> p(static_cast<size_t>(q.prompt_tokens));
    auto token = [](uint64_t block, size_t k) {
      uint64_t x = block * 0x9e3779b97f4a7c15ull + k + 1;
      x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
      x ^= x >> 29;
      return int32_t(16 + x % 100000);
    };
    for (size_t t = 0; t < p.size(); ++t) {
      const size_t b = t / size_t(hash_block_tokens);
      p[t] = b < q.hash_ids.size() ? token(uint64_t(q.hash_ids[b]) << 1, t)
                                   : token((id << 1) | 1, t);
    }
    return p;
  }

  sched_time arrival(size_t i) const {
    return from_seconds(trace_.requests[i].arrival_s / o_.rate_scale);
  }

  /// Admits request `i` at the replica the router chooses; returns that
  /// replica.
  size_t admit(size_t i) {
    const auto& q = trace_.requests[i];
    sched_request r;
    r.id = uint64_t(i) + 1;
    r.prompt = prompt_of(q, r.id);
    r.params.max_tokens = o_.max_tokens > 0 ? o_.max_tokens : config_.limits.max_model_len;
    r.stop_ids = {stop_token};
    r.arrival = now_;
    r.request_class = q.request_class;
    r.non_alnum_share = q.non_alnum_share;
    res_.prompt_tokens += q.prompt_tokens;
    size_t k = 0;
    if (router_) {
      // What the live router is given: the request actor resolves an unset
      // max_tokens to the rest of the context before it asks for admission.
      const int32_t max_tokens
        = o_.max_tokens > 0 ? o_.max_tokens
                            : std::max(config_.limits.max_model_len - q.prompt_tokens, 1);
      // Every replica is up: there is always a choice.
      k = size_t(router_->choose(r.prompt, max_tokens).value());
      router_->place(r.id, int32_t(k), r.prompt, max_tokens);
    }
    auto& rep = replicas_[k];
    res_.requests[i].replica = int32_t(k);
    ++rep.record.placed;
    rep.record.prompt_tokens += q.prompt_tokens;
    auto result = rep.sched->add(std::move(r), now_);
    if (result != admit_result::ok) {
      res_.requests[i].refused = describe(result);
      ++rep.record.refused;
      if (router_)
        router_->finish(uint64_t(i) + 1); // its request actor ends at once
      settled();
    }
    return k;
  }

  void settled() {
    if (o_.progress)
      o_.progress->fetch_add(1, std::memory_order_relaxed);
  }

  /// Queues replica k's plans at its executor until its pipeline is full.
  void pump(size_t k) {
    auto& r = replicas_[k];
    while (auto d = r.sched->schedule(now_)) {
      const double ms = o_.cost.step_ms(d->shape);
      const auto start = std::max(now_, r.executor_free);
      r.executor_free = start + sched_time{int64_t(std::llround(ms * 1e6))};
      r.running.push_back({std::move(*d), r.executor_free, ms});
    }
    r.wake.reset();
    if (auto deadline = r.sched->policy().next_deadline(now_); deadline && *deadline > now_)
      r.wake = deadline;
  }

  /// Replica k's oldest plan ends now.
  void end_step(size_t k) {
    auto& rep = replicas_[k];
    auto& sched = *rep.sched;
    auto p = std::move(rep.running.front());
    rep.running.pop_front();
    const auto& plan = p.draft.plan;
    step_output out;
    out.step = plan.step;
    out.num_seqs = int32_t(plan.chunks.size());
    out.seconds = p.ms / 1e3;
    out.device_seconds = out.seconds;
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      out.num_tokens += plan.chunks[i].num_tokens;
      if (!p.draft.samples[i])
        continue;
      const auto id = plan.chunks[i].id;
      const auto idx = size_t(id - 1);
      const bool last = ++produced_[idx] == trace_.requests[idx].output_tokens;
      out.tokens.push_back({id, last ? stop_token : other_token, 0});
    }
    auto u = sched.update_from_output(out, now_);
    if (trace_out_ && u.step && k == 0)
      trace_out_->write(seconds(now_), *u.step);
    res_.sum_batch += out.num_seqs;
    res_.busy_s += out.seconds;
    rep.record.busy_s += out.seconds;
    res_.sum_used_pages += sched.used_pages();
    res_.sum_reserved_unused_pages += sched.reserved_unused_pages();
    for (const auto& ev : u.tokens) {
      const auto idx = size_t(ev.id - 1);
      auto& rec = res_.requests[idx];
      if (size_t(rec.replica) != k)
        throw std::logic_error("replay: request " + std::to_string(ev.id) + " placed on replica "
                               + std::to_string(rec.replica) + " ran on replica "
                               + std::to_string(k));
      const auto arrived = arrival(idx);
      if (rec.produced == 0) {
        rec.ttft_s = seconds(now_ - arrived);
        if (ev.first_scheduled)
          rec.queue_s = seconds(*ev.first_scheduled - arrived);
      } else {
        res_.itl_s.push_back(float(seconds(now_ - last_token_[idx])));
      }
      last_token_[idx] = now_;
      ++rec.produced;
      ++res_.output_tokens;
      ++rep.record.output_tokens;
      if (ev.finish_reason != finish_kind::none) {
        rec.e2e_s = seconds(now_ - arrived);
        if (router_)
          router_->finish(ev.id); // its request actor ends: the router hears
        settled();
      }
    }
    auto outcomes = rep.ctx->state.model->drain_outcomes();
    for (const auto& o : outcomes) {
      res_.predictions.push_back(o);
      if (drift_on_)
        detector_->record(o);
    }
    if (drift_on_ && !outcomes.empty())
      apply(detector_->evaluate(now_));
  }

  void apply(const drift_verdict& v) {
    auto order = drift_order_of(v, now_, o_.settings.drift, o_.policy, policy_kind::fcfs);
    if (!order)
      return;
    auto& r = replicas_.front(); // drift runs with one replica only
    if (order->recalibrate_window) {
      r.ctx->state.model->recalibrate(now_, *order->recalibrate_window);
      disabled_since_ = now_;
    } else {
      if (disabled_since_)
        res_.disabled_s += seconds(now_ - *disabled_since_);
      disabled_since_.reset();
    }
    r.sched->set_policy(make_admission_policy(order->policy, *r.ctx), now_);
    res_.events.push_back(std::move(order->event));
  }

  const trace& trace_;
  const replay_options& o_;
  /// The scheduler's settings, max_model_len and the queue resolved.
  scheduler_config config_;
  int32_t page_size_ = 16;
  int32_t num_pages_ = 0;
  std::vector<replica_sim> replicas_;
  /// With more than one replica: places each arrival.
  std::optional<replica_router> router_;
  std::unique_ptr<drift_detector> detector_;
  std::unique_ptr<step_trace> trace_out_; // o.step_trace, if any
  bool drift_on_ = false;
  std::optional<sched_time> disabled_since_;
  sched_time now_{0};
  std::vector<int32_t> produced_;
  std::vector<sched_time> last_token_;
  replay_result res_;
};

} // namespace

replay_result replay(const trace& t, const replay_options& options) {
  if (!(options.rate_scale > 0) || !std::isfinite(options.rate_scale))
    throw std::invalid_argument("rate scale must be a positive number");
  if (options.replicas < 1 || options.replicas > max_replicas)
    throw std::invalid_argument("replicas must be 1 to " + std::to_string(max_replicas) + ", got "
                                + std::to_string(options.replicas));
  replay_loop loop(t, options);
  return loop.run();
}

} // namespace metronome::sim
