#pragma once
// The replay report: latency percentiles, throughput, batch efficiency,
// slowdown by output-length decile, predictor accuracy and supervisor
// events, as JSON other tools can read, and the side-by-side comparison of
// policies against fcfs with the targets of issue 6.
//
// Keys every report has: policy, requests, throughput_tokens_per_s, and
// ttft_ms, itl_ms, e2e_ms, queue_ms as {"p50", "p95", "p99"} (plus "mean").

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/replay.hpp"

namespace metronome::sim {

/// {"p50", "p95", "p99", "mean"} of `values` (nearest rank); zeros if empty.
nlohmann::json percentiles(std::vector<double> values);

/// The nearest-rank percentile p (0..100) of sorted values.
double percentile_sorted(const std::vector<double>& sorted, double p);

/// The keys that replay and `metronome bench-serve` reports share, from
/// per-request records: requests, refused, refused_by_reason ({reason:
/// count}, {} when none was refused), throughput_tokens_per_s,
/// total_tokens_per_s, makespan_s, ttft_ms, itl_ms, e2e_ms, queue_ms,
/// p95_over_p50, longest_wait_ms, slowdown_by_output_decile. A record with
/// `refused` set counts as refused; one with e2e_s < 0 (never finished) is
/// left out. A decile without unloaded_e2e_s (a live run has none) has null
/// slowdowns. Any thread.
nlohmann::json latency_report(const std::vector<request_record>& requests,
                              const std::vector<double>& itl_s, double makespan_s,
                              int64_t prompt_tokens, int64_t output_tokens);

/// The report of one replay: latency_report() plus the simulator's keys,
/// among them replicas (N) and per_replica, by index: placed (requests
/// routed there), refused (of them), prompt_tokens (theirs), output_tokens
/// (produced there), steps, preemptions, prefix_cache_hits, busy_fraction.
/// Latencies are over all requests, counts over all replicas, and
/// busy_fraction is the replicas' mean.
nlohmann::json make_report(const replay_result& r);

/// Comparison of reports of one trace at one rate scale against the fcfs
/// one among them: ratios and whether each target is met (P95 e2e and P95
/// TTFT at most 0.6x, throughput within 3%, no output decile's mean slowdown
/// above 1.5x fcfs'). Null when there is no fcfs report.
nlohmann::json compare_to_fcfs(const std::vector<nlohmann::json>& reports);

} // namespace metronome::sim
