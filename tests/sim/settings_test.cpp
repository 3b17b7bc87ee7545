// metronome.yaml's scheduling sections reach the policies, the predictor and
// the drift supervisor with their units converted.

#include <gtest/gtest.h>

#include "config/config_loader.hpp"
#include "sim/settings.hpp"

namespace metronome::sim {
namespace {

using namespace std::chrono_literals;

TEST(settings, configuration_keys_map_to_policy_settings) {
  auto cfg = load_config_string(R"(
engine:
  policy: ladb-literal
  max_batch_size: 64
  max_num_batched_tokens: 4096
  prefill_chunk_tokens: 512
  page_size: 32
  kv_cache_tokens: 65536
  step_timeout_ms: 1500
server:
  max_queued_requests: 7
model:
  max_model_len: 8192
batching:
  max_batch_size: 16
  min_batch_size: 2
  variance_tolerance: 0.5
  min_hold_ms: 10
  max_hold_ms: 90
  target_latency_ms: 250
  step_time_factor: 2.5
  long_step_share: 0.1
predictor:
  warmup_steps: 7
  update_interval_ms: 250
  max_steps_factor: 1.5
  cold_start_slope: 0.5
  cold_start_intercept: 3
router:
  queue_strategy: fcfs
  timeout_ms: 400
  fallback_policy: wait
  srpt_promote_after_ms: 75
supervisor:
  drift:
    enabled: false
    window_s: 60
    error_threshold: 0.5
    sustain_s: 30
    disable_s: 120.5
    min_samples: 9
)",
                                "test.yaml");
  auto s = settings_from_config(cfg);
  const engine_limits& l = s.scheduler.limits;
  EXPECT_EQ(l.max_batch_size, 64);
  EXPECT_EQ(l.max_num_batched_tokens, 4096);
  EXPECT_EQ(l.prefill_chunk_tokens, 512);
  EXPECT_EQ(l.max_model_len, 8192);
  EXPECT_EQ(l.page_size, 32);
  EXPECT_EQ(l.kv_cache_tokens, 65536);
  EXPECT_EQ(l.max_queued_requests, 7);
  EXPECT_EQ(l.step_timeout, 1500ms);
  EXPECT_EQ(s.ladb.max_batch_size, 16);
  EXPECT_EQ(s.ladb.min_batch_size, 2);
  EXPECT_DOUBLE_EQ(s.ladb.variance_tolerance, 0.5);
  EXPECT_EQ(s.ladb.min_hold, 10ms);
  EXPECT_EQ(s.ladb.max_hold, 90ms);
  EXPECT_EQ(s.ladb.timeout, 400ms);
  EXPECT_FALSE(s.ladb.immediate_dispatch);
  EXPECT_EQ(s.ladb.starvation_wait, sched_time::max()) << "fallback wait: no promotion";
  EXPECT_DOUBLE_EQ(s.ladb.max_step_ms, 250.0);
  EXPECT_DOUBLE_EQ(s.ladb.step_time_factor, 2.5);
  EXPECT_DOUBLE_EQ(s.ladb.long_step_share, 0.1);
  EXPECT_FALSE(s.ladb.priority_by_remaining_steps);
  EXPECT_EQ(s.srpt.promote_after, 75ms);
  EXPECT_EQ(s.predictor.warmup_steps, 7);
  EXPECT_EQ(s.predictor.update_interval, 250ms);
  EXPECT_DOUBLE_EQ(s.predictor.max_steps_factor, 1.5);
  EXPECT_DOUBLE_EQ(s.predictor.cold_start_slope, 0.5);
  EXPECT_DOUBLE_EQ(s.predictor.cold_start_intercept, 3.0);
  EXPECT_FALSE(s.drift.enabled);
  EXPECT_EQ(s.drift.window, 60s);
  EXPECT_DOUBLE_EQ(s.drift.error_threshold, 0.5);
  EXPECT_EQ(s.drift.sustain, 30s);
  EXPECT_EQ(s.drift.disable_for, 120500ms);
  EXPECT_EQ(s.drift.min_samples, 9);
}

// One set of engine limits: what a configuration with no keys gives is
// engine_limits{}, the defaults every runner, the scheduler and the replay
// start from.
TEST(settings, the_configurations_default_limits_are_engine_limits_defaults) {
  const auto l = limits_from_config(server_config{});
  EXPECT_EQ(l, engine_limits{});
  EXPECT_EQ(l.max_batch_size, 128);
  EXPECT_EQ(l.max_model_len, 0) << "0: the model's";
  EXPECT_EQ(l.step_timeout, 30s);
  EXPECT_EQ(settings_from_config(server_config{}).scheduler.limits, engine_limits{});
}

TEST(settings, defaults_match_the_original_systems_values) {
  auto s = settings_from_config(server_config{});
  EXPECT_EQ(s.ladb.min_hold, 50ms);
  EXPECT_EQ(s.ladb.max_hold, 120ms);
  EXPECT_EQ(s.ladb.timeout, 250ms);
  EXPECT_EQ(s.ladb.starvation_wait, 250ms) << "the router's timeout";
  EXPECT_DOUBLE_EQ(s.ladb.max_step_ms, 500.0);
  EXPECT_EQ(s.srpt.promote_after, 150ms);
  EXPECT_DOUBLE_EQ(s.predictor.cold_start_slope, 0.8);
  EXPECT_DOUBLE_EQ(s.predictor.cold_start_intercept, 5.0);
  EXPECT_DOUBLE_EQ(s.predictor.max_steps_factor, 1.2);
  EXPECT_DOUBLE_EQ(s.drift.error_threshold, 0.3);
  EXPECT_EQ(s.drift.sustain, 300s);
  EXPECT_EQ(s.drift.disable_for, 300s);
  EXPECT_FALSE(s.scheduler.groups.enabled()) << "token groups are off by default";
}

TEST(settings, token_groups_reach_the_scheduler) {
  server_config cfg;
  cfg.batching.token_groups = "32,128";
  const auto s = settings_from_config(cfg);
  EXPECT_EQ(s.scheduler.groups.bounds(), (std::vector<int32_t>{32, 128}));
  EXPECT_EQ(s.scheduler.groups.group_of(33), 1);
}

} // namespace
} // namespace metronome::sim
