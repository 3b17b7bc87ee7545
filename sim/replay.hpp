#pragma once
// Trace replay: the real scheduler, admission policies, KV page pool,
// predictor and drift logic, with only the executor replaced by a simulated
// one that advances a virtual clock by the cost model's step time. With
// several replicas (data parallel, docs/scale-out.md) the real replica
// router places each request on one of them.
//
// Design note. A discrete-event loop over three kinds of events in virtual
// time: arrivals (trace time / rate_scale), the end of the executor's current
// step, and wake-ups (a policy's hold deadline, the drift detector's next
// check). It drives `scheduler` the way the scheduler actor does: after every
// event it calls schedule() until the pipeline (pipeline_depth plans) is full
// (the scheduler grants pages from its own pool), and queues the plan at the
// simulated executor, which runs plans back to back; a plan's
// duration is the cost model's time for its shape (decodes, KV tokens read,
// prompt tokens and their attention pairs). At a step's end the executor
// samples one token per sampling chunk: the request's stop token once it has
// produced its trace's output length, another token before. The stop token is
// an EOS id: no policy ever sees the true length. Finished requests' outcomes
// go from the predictor to a drift_detector; its verdicts recalibrate the
// predictor and switch the scheduler's policy (fcfs while disabled), as the
// drift supervisor actor does in the server. Nothing reads a wall clock or a
// random source, so the same input gives the same result.
//
// Replicas. With replicas = N each replica is a scheduler of its own (its
// own KV pages, policy and predictor) with a simulated executor of its own,
// all on one virtual clock; the executors run in parallel. An arrival goes
// to the replica sched/replica_router.hpp chooses (the live router's class,
// given what the live router is given: the prompt and max_tokens as the
// request actor resolves it), and only that replica is scheduled after it;
// a step's end schedules its own replica. A request leaves the router's
// load when it finishes or is refused, as the router actor hears of its
// request actor's end. Simultaneous events go to the lowest replica first.
// As in the server, the drift supervisor runs only with one replica, and
// the step trace records replica 0's steps.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "sched/drift_detector.hpp"
#include "sched/ladb_policy.hpp"
#include "sched/scheduler.hpp"
#include "sim/cost_model.hpp"
#include "sim/settings.hpp"
#include "sim/trace.hpp"

namespace metronome::sim {

struct replay_options {
  policy_kind policy = policy_kind::fcfs;
  /// Arrival rate multiplier: arrivals at trace time / rate_scale.
  double rate_scale = 1.0;
  scheduling_settings settings;
  cost_model cost;
  /// max_tokens of every request; 0 = up to the context (as a client that
  /// sets none). The trace's true length ends it first (as EOS).
  int32_t max_tokens = 0;
  /// Never refuse a request for a full queue (the replay measures latency,
  /// not admission control).
  bool unbounded_queue = true;
  /// Where to write the simulated steps in the step trace's columns
  /// (sched/step_trace.hpp; wall and device time are the cost model's);
  /// empty = nowhere.
  std::filesystem::path step_trace;
  /// Incremented (relaxed) once per request as it is settled: refused at
  /// admission or finished. Another thread may read it to show progress;
  /// null = nothing counted. Several replays may share one counter.
  std::atomic<int64_t>* progress = nullptr;
  /// Replicas behind the router, 1 to max_replicas (1: no router, as the
  /// server with one replica).
  int32_t replicas = 1;
};

/// The most replicas a replay models.
constexpr int32_t max_replicas = 64;

/// What one replica did.
struct replica_record {
  /// Requests the router placed here, and of them refused at admission.
  int64_t placed = 0;
  int64_t refused = 0;
  /// Prompt tokens of the requests placed here, and output tokens it produced.
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t prefix_hits = 0;
  /// Seconds its executor ran steps.
  double busy_s = 0;
};

/// One request's fate.
struct request_record {
  int32_t index = 0;
  double arrival_s = 0;
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;
  /// Seconds from arrival; negative when it never got there.
  double queue_s = -1;
  double ttft_s = -1;
  double e2e_s = -1;
  /// On an idle engine (cost_model unloaded()).
  double unloaded_ttft_s = 0;
  double unloaded_e2e_s = 0;
  /// Tokens it produced.
  int32_t produced = 0;
  /// Refused at admission ("" if admitted): too_long, too_large_for_cache, ...
  std::string refused;
  /// The replica it was placed on.
  int32_t replica = 0;
};

struct replay_result {
  /// The policy's name (to_string(replay_options::policy)), as reported.
  std::string policy;
  std::string trace_name;
  double rate_scale = 1;
  std::vector<request_record> requests;
  /// Every inter-token gap of every request, seconds.
  std::vector<float> itl_s;
  /// The drift supervisor's decisions (virtual clock, ns from the first arrival).
  std::vector<drift_event> events;
  /// Predicted vs actual of every predicted finished request.
  std::vector<prediction_outcome> predictions;
  latency_aware_stats policy_stats;
  int64_t steps = 0;
  int64_t preemptions = 0;
  /// Steps whose prompt chunks were cut to the policy's step time limit.
  int64_t limited_steps = 0;
  /// Token-aware grouping: its bounds ("" off) and the decisions it changed.
  std::string token_groups;
  token_group_stats group_stats;
  /// Prefix cache: prompt tokens looked up at admissions and found cached.
  int64_t prefix_queries = 0;
  int64_t prefix_hits = 0;
  /// Sum over steps (of every replica) of sequences in the step.
  double sum_batch = 0;
  /// KV strategy: admissions into buckets and into overflow pages, and sums
  /// over steps of pages in use and of pages buckets hold reserved unused.
  std::string kv_strategy = "paged";
  int64_t bucket_admissions = 0;
  int64_t bucket_overflows = 0;
  double sum_used_pages = 0;
  double sum_reserved_unused_pages = 0;
  int32_t max_batch_size = 0;
  /// Seconds the executors ran steps, summed over the replicas.
  double busy_s = 0;
  /// First arrival to last token.
  double makespan_s = 0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  /// Seconds of virtual time under each policy.
  double disabled_s = 0;
  /// Each replica's KV pages.
  int64_t kv_pages = 0;
  int32_t page_size = 0;
  cost_model cost;
  int32_t replicas = 1;
  /// By replica index. The counts above are their sums.
  std::vector<replica_record> per_replica;
};

/// Replays `t`. Throws std::runtime_error when the replay stalls (a policy
/// that holds requests without a deadline), std::invalid_argument for a rate
/// scale that is not positive or replicas outside 1..max_replicas.
replay_result replay(const trace& t, const replay_options& options);

} // namespace metronome::sim
