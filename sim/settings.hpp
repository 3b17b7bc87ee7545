#pragma once
// The scheduling settings of metronome.yaml (engine limits, batching,
// predictor, router, supervisor.drift) as the policies, the drift
// supervisor and the replay take them. `metronome serve` and `metronome
// replay` both map the configuration through here, so a replay runs exactly
// the policy settings the server would.

#include "sched/drift_detector.hpp"
#include "sched/ladb_policy.hpp"
#include "sched/scheduler.hpp"
#include "config/server_config.hpp"

namespace metronome::sim {

struct scheduling_settings {
  /// max_model_len 0 = the model's (for the replay, the cost model's).
  scheduler_config limits = [] {
    scheduler_config c;
    c.max_model_len = 0;
    return c;
  }();
  int32_t page_size = 16;
  /// 0: the device's (the cost model's) capacity.
  int64_t kv_cache_tokens = 0;
  predictor_options predictor;
  ladb_options ladb;
  srpt_options srpt;
  drift_options drift;
};

/// The settings of `cfg`. limits.max_model_len is cfg.model.max_model_len
/// (0 = the model's, for the replay the cost model's).
scheduling_settings settings_from_config(const server_config& cfg);

} // namespace metronome::sim
