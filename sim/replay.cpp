#include "sim/replay.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <stdexcept>
#include <unordered_map>

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
    ctx_ = policy_context::make(o.settings.predictor, o.settings.ladb, o.settings.srpt);
    drift_on_ = o.policy != policy_kind::fcfs && o.settings.drift.enabled;
    sched_ = std::make_unique<scheduler>(config_, make_admission_policy(o.policy, *ctx_));
    sched_->set_capacity(num_pages_, page_size_);
    sched_->set_step_cost(o.cost.step);
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
      const auto t_step = running_.empty() ? never : running_.front().end;
      const auto t_wake = wake_.value_or(never);
      auto t_drift = never;
      if (drift_on_)
        if (auto c = detector_->next_check())
          t_drift = std::max(*c, now_ + sched_time{1});
      const auto t = std::min({t_arrival, t_step, t_wake, t_drift});
      if (t == never)
        break;
      if (next == trace_.requests.size() && running_.empty() && sched_->num_waiting() == 0
          && sched_->num_running() == 0)
        break; // everything is done; pending drift checks do not matter
      now_ = std::max(now_, t);
      if (t == t_step) {
        end_step();
      } else if (t == t_arrival) {
        admit(next++);
      } else if (t == t_wake) {
        wake_.reset();
      } else {
        apply(detector_->evaluate(now_));
      }
      pump();
    }
    if (sched_->num_waiting() + sched_->num_running() > 0)
      throw std::runtime_error("replay stalled at " + std::to_string(seconds(now_)) + " s with "
                               + std::to_string(sched_->num_waiting())
                               + " requests waiting and no deadline (policy "
                               + std::string(sched_->policy().name()) + ")");
    if (disabled_since_)
      res_.disabled_s += seconds(now_ - *disabled_since_);
    res_.steps = sched_->steps();
    res_.preemptions = sched_->preemptions();
    res_.prefix_queries = sched_->prefix_queries();
    res_.prefix_hits = sched_->prefix_hits();
    res_.kv_strategy = to_string(sched_->config().kv);
    res_.bucket_admissions = sched_->bucket_admissions();
    res_.bucket_overflows = sched_->bucket_overflows();
    res_.policy_stats = *ctx_->state.stats;
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

  void admit(size_t i) {
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
    auto result = sched_->add(std::move(r), now_);
    if (result != admit_result::ok) {
      res_.requests[i].refused = describe(result);
      settled();
    }
  }

  void settled() {
    if (o_.progress)
      o_.progress->fetch_add(1, std::memory_order_relaxed);
  }

  void pump() {
    while (auto d = sched_->schedule(now_)) {
      const double ms = o_.cost.step_ms(d->shape);
      const auto start = std::max(now_, executor_free_);
      executor_free_ = start + sched_time{int64_t(std::llround(ms * 1e6))};
      running_.push_back({std::move(*d), executor_free_, ms});
    }
    wake_.reset();
    if (auto deadline = sched_->policy().next_deadline(now_); deadline && *deadline > now_)
      wake_ = deadline;
  }

  void end_step() {
    auto p = std::move(running_.front());
    running_.pop_front();
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
    auto u = sched_->update_from_output(out, now_);
    if (trace_out_ && u.step)
      trace_out_->write(seconds(now_), *u.step);
    res_.sum_batch += out.num_seqs;
    res_.busy_s += out.seconds;
    res_.sum_used_pages += sched_->used_pages();
    res_.sum_reserved_unused_pages += sched_->reserved_unused_pages();
    for (const auto& ev : u.tokens) {
      const auto idx = size_t(ev.id - 1);
      auto& rec = res_.requests[idx];
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
      if (ev.finish_reason != finish_kind::none) {
        rec.e2e_s = seconds(now_ - arrived);
        settled();
      }
    }
    auto outcomes = ctx_->state.model->drain_outcomes();
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
    if (order->recalibrate_window) {
      ctx_->state.model->recalibrate(now_, *order->recalibrate_window);
      disabled_since_ = now_;
    } else {
      if (disabled_since_)
        res_.disabled_s += seconds(now_ - *disabled_since_);
      disabled_since_.reset();
    }
    sched_->set_policy(make_admission_policy(order->policy, *ctx_), now_);
    res_.events.push_back(std::move(order->event));
  }

  const trace& trace_;
  const replay_options& o_;
  /// The scheduler's settings, max_model_len and the queue resolved.
  scheduler_config config_;
  int32_t page_size_ = 16;
  int32_t num_pages_ = 0;
  std::shared_ptr<policy_context> ctx_;
  std::unique_ptr<scheduler> sched_;
  std::unique_ptr<drift_detector> detector_;
  std::unique_ptr<step_trace> trace_out_; // o.step_trace, if any
  bool drift_on_ = false;
  std::optional<sched_time> disabled_since_;
  sched_time now_{0};
  sched_time executor_free_{0};
  std::optional<sched_time> wake_;
  std::deque<plan_in_flight> running_;
  std::vector<int32_t> produced_;
  std::vector<sched_time> last_token_;
  replay_result res_;
};

} // namespace

replay_result replay(const trace& t, const replay_options& options) {
  if (!(options.rate_scale > 0) || !std::isfinite(options.rate_scale))
    throw std::invalid_argument("rate scale must be a positive number");
  replay_loop loop(t, options);
  return loop.run();
}

} // namespace metronome::sim
