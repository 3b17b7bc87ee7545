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
  /// The engine's limits (scheduler.limits: max_model_len 0 = the model's,
  /// for the replay the cost model's; kv_cache_tokens 0 = the device's, for
  /// the replay the cost model's capacity), prefix caching and the KV
  /// strategy.
  scheduler_config scheduler;
  predictor_options predictor;
  ladb_options ladb;
  srpt_options srpt;
  drift_options drift;
};

/// The engine limits of `cfg`: engine.max_batch_size,
/// max_num_batched_tokens, page_size, kv_cache_tokens and step_timeout_ms,
/// model.max_model_len (0 = the model's) and server.max_queued_requests.
engine_limits limits_from_config(const server_config& cfg);

/// The admission policy engine.policy names.
policy_kind policy_from_config(scheduling_policy p);

/// The settings of `cfg`; scheduler.limits as limits_from_config.
scheduling_settings settings_from_config(const server_config& cfg);

} // namespace metronome::sim
