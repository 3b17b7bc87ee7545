#pragma once
// The engine's Prometheus metrics, named in vLLM's convention with the
// `metronome:` prefix. Per-request latencies are observed once per request
// (or per token gap), never per batch. Those vLLM has too carry its
// `model_name` label (the served model's name), so dashboards written for
// vLLM select them the same way: every per-request histogram and counter,
// and the engine's running / waiting / KV-usage gauges and preemption and
// prefix-cache counters. The step, process and HTTP metrics carry none.
// Thread-safe: actors on any thread observe, the network edge renders.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "metrics/process_metrics.hpp"
#include "metrics/prometheus.hpp"
#include "sched/finish_kind.hpp"

namespace metronome {

struct engine_status;

/// The counters and gauges the stats line reads (stats_reporter.hpp), from
/// the same sources as /metrics.
struct engine_stats_sample {
  /// Since the start: tokens the steps computed (prompt and output), tokens
  /// they sampled (output), prompt tokens looked up in the prefix cache and
  /// found there.
  double computed_tokens = 0;
  double sampled_tokens = 0;
  double prefix_queries = 0;
  double prefix_hits = 0;
  /// Now.
  int32_t running = 0;
  int32_t waiting = 0;
  int32_t kv_used_pages = 0;
  int32_t kv_total_pages = 0;
};

class engine_metrics {
public:
  /// `model_name`: the model's name in the API, the value of every
  /// model_name label (escaped when rendered).
  explicit engine_metrics(const std::string& model_name);

  /// One engine step ran: `num_seqs` sequences (of at most max_batch_size)
  /// computed `num_tokens` tokens and sampled `sampled_tokens` in `seconds`.
  void on_step(int32_t num_seqs, int32_t max_batch_size, int64_t num_tokens,
               int64_t sampled_tokens, double seconds);

  /// A request's first token: queue time and time to first token.
  void on_first_token(double queue_s, double ttft_s);

  /// The time between two consecutive output tokens of one request.
  void on_token_gap(double seconds);

  /// A request ended normally (stop, length: the finished_reason label is
  /// its to_string), or was cancelled (counted apart, in no latency
  /// histogram). queue_s and ttft_s as on_first_token's (0 when no token
  /// came): with e2e_s they split the request into prefill (first scheduled
  /// to first token) and decode (first token to last) time. Any thread.
  void on_finish(finish_kind reason, double e2e_s, int32_t prompt_tokens,
                 int32_t completion_tokens, double queue_s = 0, double ttft_s = 0);

  /// A request failed with error code `code` (its to_string).
  void on_error(const std::string& code);

  /// The server answered `route` (a path; any other than the API's own
  /// counts as "other") with `status`. Any thread.
  void on_http_response(std::string_view route, int status);

  void on_preemptions(int64_t n);
  void on_executor_restart();

  /// Data parallel: adds the per-replica series (labelled replica="0", ...,
  /// for `n` replicas; none for fewer than 2): membership, running, waiting
  /// and KV usage from engine_status at render(), and the counters below.
  /// Once, before any actor observes (spawn_engine).
  void enable_replicas(int32_t n);
  /// The router placed a request on `replica`. Router thread.
  void on_routed(int32_t replica);
  /// `replica` ran a step that computed `num_tokens`. Its scheduler's
  /// thread; replica -1 (the only one) counts nowhere.
  void on_replica_step(int32_t replica, int64_t num_tokens);
  /// `replica`'s executor failed. Its scheduler's thread.
  void on_replica_restart(int32_t replica);
  /// A request whose worker was lost before its first token was admitted
  /// again. Its request actor's thread.
  void on_rerun();
  /// The worker registry: a worker "joined", was "lost" or "refused".
  /// Registry thread.
  void on_worker_event(const std::string& event);
  /// The scheduler changed policy (to `policy`, for `why`).
  void on_policy_switch(const std::string& policy, const std::string& why);

  /// The kv precision supervisor made a transition (`event`: "kept",
  /// "rematerialized", "cooldown_started", "cooldown_ended"; "" counts
  /// nothing) and admissions are now in full precision (`cooling_down`) or
  /// in fp8_e5m2: metronome:kv_precision_events_total{event} and the mode
  /// gauge metronome:kv_precision_mode{mode="fp8_e5m2"|"bf16"}. Its thread.
  void on_kv_precision_event(const std::string& event, bool cooling_down);

  /// Scheduling events since the last call, by kind: "limited_step" (a
  /// prompt chunk cut to the step time limit), "long_step" (a prompt run
  /// past it on the long-step budget), "relaxed_step" (no limit: the queue
  /// waited too long), "promotion" (starvation guard), "reclassification",
  /// "timeout_dispatch" (ladb-literal), and token-aware grouping's
  /// (batching.token_groups) "group_admission" (admitted ahead of a higher
  /// group), "group_preemption" (a higher group preempted instead of the
  /// latest admitted), "group_decode" (a decode left out of a step for a
  /// lower group's). Scheduler thread.
  void on_scheduling_event(const std::string& kind, int64_t n);

  /// Prefix cache: prompt tokens looked up and found cached since the last
  /// call, and the pages named now (held or kept). Scheduler thread.
  void on_prefix_cache(int64_t queried, int64_t hit, int32_t cached_pages);
  /// KV buckets (engine.kv_strategy bucketed): admissions into a bucket and
  /// into overflow pages since the last call, and the pages buckets hold
  /// reserved but unused now.
  void on_kv_buckets(int64_t bucketed, int64_t overflowed, int32_t reserved_unused_pages);
  /// fp8_e5m2 KV cache: values the runner's writes saturated or found not
  /// finite since the last call (step_output::kv_overflows). Scheduler thread.
  void on_kv_overflow_values(int64_t values);

  /// The step-time model's learned factors (decode and prompt parts).
  void on_step_model(double decode_scale, double prefill_scale);

  /// The text for GET /metrics, with gauges refreshed from `status` and the
  /// process metrics (memory, heap, descriptors, CPU) sampled now.
  std::string render(const engine_status& status);

  /// The stats line's figures now, the gauges from `status`. Any thread.
  engine_stats_sample sample(const engine_status& status) const;

  prometheus::registry& registry() {
    return registry_;
  }

private:
  prometheus::registry registry_;
  prometheus::histogram& ttft_;
  prometheus::histogram& itl_;
  prometheus::histogram& e2e_;
  prometheus::histogram& queue_;
  prometheus::histogram& batch_size_;
  prometheus::histogram& batch_efficiency_;
  prometheus::histogram& step_time_;
  prometheus::counter& computed_tokens_;
  prometheus::counter& sampled_tokens_;
  prometheus::counter& prompt_tokens_;
  prometheus::counter& generation_tokens_;
  prometheus::counter& preemptions_;
  prometheus::counter& restarts_;
  prometheus::family<prometheus::counter>& finished_;
  prometheus::counter& cancelled_;
  prometheus::histogram& request_prompt_tokens_;
  prometheus::histogram& request_generation_tokens_;
  prometheus::histogram& prefill_time_;
  prometheus::histogram& decode_time_;
  prometheus::family<prometheus::gauge>& build_info_;
  prometheus::family<prometheus::counter>& errors_;
  prometheus::family<prometheus::counter>& http_responses_;
  prometheus::family<prometheus::counter>& policy_switches_;
  prometheus::family<prometheus::counter>& kv_precision_events_;
  prometheus::family<prometheus::gauge>& kv_precision_mode_;
  prometheus::counter& reruns_;
  prometheus::family<prometheus::counter>& worker_events_;
  prometheus::family<prometheus::counter>& scheduling_events_;
  prometheus::family<prometheus::gauge>& step_model_;
  prometheus::counter& prefix_queries_;
  prometheus::counter& prefix_hits_;
  prometheus::gauge& prefix_pages_;
  prometheus::counter& bucket_admissions_;
  prometheus::counter& bucket_overflows_;
  prometheus::counter& kv_overflow_values_;
  prometheus::gauge& reserved_unused_;
  prometheus::gauge& kv_usage_;
  prometheus::gauge& running_;
  prometheus::gauge& waiting_;
  prometheus::gauge& live_actors_;
  prometheus::gauge& ready_;
  prometheus::family<prometheus::gauge>& memory_;
  /// process_* and metronome:heap_* (metrics/process_metrics.hpp).
  prometheus::process_metrics process_;
  /// One replica's series (enable_replicas).
  struct replica_series {
    prometheus::gauge* up;
    prometheus::gauge* running;
    prometheus::gauge* waiting;
    prometheus::gauge* kv_usage;
    prometheus::counter* routed;
    prometheus::counter* steps;
    prometheus::counter* tokens;
    prometheus::counter* restarts;
  };
  std::vector<replica_series> replicas_;
};

} // namespace metronome
