#pragma once
// The report of a live load run (`metronome bench-serve`): the keys of a
// replay report (sim::latency_report, the same code and percentiles), with
// the simulator-only keys present and null, plus what only a live run has:
// TPOT, SLO attainment and goodput, failures by cause. docs/bench-serve.md
// lists every key.
//
// Threading: plain functions of their arguments; any thread.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/serve/load_client.hpp"
#include "sim/svg_plot.hpp"

namespace metronome::bench {

/// What the report says about the run besides the per-request results.
struct bench_run_info {
  /// The report's "policy" key (whatever the server runs; e.g. "ladb").
  std::string label = "server";
  /// The trace file's name or the workload spec.
  std::string trace_name;
  double rate_scale = 1;
  std::string url;
  std::string model;
  api_endpoint endpoint = api_endpoint::completions;
  int32_t max_concurrency = 0;
  double timeout_s = 600;
  /// SLO thresholds in ms; 0 = none (always met).
  double slo_ttft_ms = 0;
  double slo_tpot_ms = 0;
  /// Stopped by Ctrl-C (the report is partial).
  bool interrupted = false;
  /// Wall-clock seconds from the start of sending to the end of the run.
  double wall_s = 0;
};

/// TPOT of one request: (e2e - ttft) / (output_tokens - 1); -1 when it
/// has fewer than 2 output tokens or did not succeed.
double tpot_s(const request_result& r);

/// The report JSON.
nlohmann::json make_bench_report(const std::vector<request_result>& results,
                                 const bench_run_info& info);

/// One CSV row per request sent (header first).
std::string requests_csv(const std::vector<request_result>& results);

/// CDFs of e2e, TTFT, ITL and TPOT (ms) of the successful requests, in the
/// replay plots' style (render with sim::render_svg).
std::vector<sim::plot_panel> bench_panels(const std::vector<request_result>& results,
                                          const bench_run_info& info);

} // namespace metronome::bench
