#include "sim/settings.hpp"

#include "config/config_scalar.hpp"

namespace metronome::sim {

namespace {

sched_time ms(int64_t v) {
  return std::chrono::milliseconds(v);
}

sched_time seconds(double v) {
  return std::chrono::duration_cast<sched_time>(std::chrono::duration<double>(v));
}

} // namespace

engine_limits limits_from_config(const server_config& cfg) {
  engine_limits l;
  l.max_batch_size = cfg.engine.max_batch_size;
  l.max_num_batched_tokens = cfg.engine.max_num_batched_tokens;
  l.prefill_chunk_tokens = cfg.engine.prefill_chunk_tokens;
  l.max_model_len = cfg.model.max_model_len;
  l.page_size = cfg.engine.page_size;
  l.kv_cache_tokens = cfg.engine.kv_cache_tokens;
  l.max_queued_requests = cfg.server.max_queued_requests;
  l.step_timeout = std::chrono::milliseconds(cfg.engine.step_timeout_ms);
  return l;
}

policy_kind policy_from_config(scheduling_policy p) {
  switch (p) {
    case scheduling_policy::fcfs: return policy_kind::fcfs;
    case scheduling_policy::ladb: return policy_kind::ladb;
    case scheduling_policy::srpt: return policy_kind::srpt;
    case scheduling_policy::ladb_literal: return policy_kind::ladb_literal;
  }
  return policy_kind::ladb;
}

scheduling_settings settings_from_config(const server_config& cfg) {
  scheduling_settings s;
  s.scheduler.limits = limits_from_config(cfg);
  s.scheduler.prefix_caching = cfg.engine.prefix_caching;
  s.scheduler.kv = cfg.engine.kv_strategy == kv_strategy_kind::bucketed ? kv_strategy::bucketed
                                                                         : kv_strategy::paged;
  s.scheduler.kv_bucket_min_tokens = cfg.engine.kv_bucket_min_tokens;
  s.scheduler.kv_buckets_per_size = cfg.engine.kv_buckets_per_size;
  // Checked at load (parse_token_bounds); token_groups re-checks.
  s.scheduler.groups = token_groups(parse_token_bounds(cfg.batching.token_groups).value_or(
    std::vector<int32_t>{}));

  s.predictor.cold_start_slope = cfg.predictor.cold_start_slope;
  s.predictor.cold_start_intercept = cfg.predictor.cold_start_intercept;
  s.predictor.warmup_steps = cfg.predictor.warmup_steps;
  s.predictor.update_interval = ms(cfg.predictor.update_interval_ms);
  s.predictor.max_steps_factor = cfg.predictor.max_steps_factor;

  s.ladb.max_batch_size = cfg.batching.max_batch_size;
  s.ladb.min_batch_size = cfg.batching.min_batch_size;
  s.ladb.variance_tolerance = cfg.batching.variance_tolerance;
  s.ladb.min_hold = ms(cfg.batching.min_hold_ms);
  s.ladb.max_hold = ms(cfg.batching.max_hold_ms);
  s.ladb.max_step_ms = double(cfg.batching.target_latency_ms);
  s.ladb.step_time_factor = cfg.batching.step_time_factor;
  s.ladb.long_step_share = cfg.batching.long_step_share;
  s.ladb.timeout = ms(cfg.router.timeout_ms);
  s.ladb.immediate_dispatch = cfg.router.fallback_policy == fallback_policy_kind::immediate_dispatch;
  // The adapted ladb never holds a request: the router's timeout is the
  // least wait of its starvation guard, and `wait` turns the guard off.
  s.ladb.starvation_wait = s.ladb.immediate_dispatch ? ms(cfg.router.timeout_ms) : sched_time::max();
  s.ladb.priority_by_remaining_steps
    = cfg.router.queue_strategy == queue_strategy_kind::priority_by_remaining_steps;
  s.srpt.promote_after = ms(cfg.router.srpt_promote_after_ms);

  const auto& d = cfg.supervisor.drift;
  s.drift.enabled = d.enabled;
  s.drift.window = seconds(d.window_s);
  s.drift.error_threshold = d.error_threshold;
  s.drift.sustain = seconds(d.sustain_s);
  s.drift.disable_for = seconds(d.disable_s);
  s.drift.min_samples = d.min_samples;
  return s;
}

} // namespace metronome::sim
