#include "bench/serve/bench_report.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "sim/replay.hpp"
#include "sim/report.hpp"

namespace metronome::bench {

namespace {

using outcome = request_result::outcome;

double per_s(double x, double seconds) {
  return seconds > 0 ? x / seconds : 0.0;
}

/// Keys of a replay report that only a simulation can fill: null here, so a
/// reader of replay reports finds every key.
constexpr const char* simulator_only_keys[] = {
  "unloaded", "e2e_p95_over_unloaded_p95", "steps", "mean_batch_size", "batch_efficiency",
  "busy_fraction", "preemptions", "predictor", "supervisor", "engine", "cost_model",
  "prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_rate"};

std::string csv_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"')
      out += '"';
    out += (c == '\n' || c == '\r') ? ' ' : c;
  }
  return out + "\"";
}

const char* outcome_name(outcome o) {
  switch (o) {
    case outcome::not_sent:
      return "not_sent";
    case outcome::ok:
      return "ok";
    case outcome::failed:
      return "failed";
    case outcome::interrupted:
      return "interrupted";
  }
  return "?";
}

} // namespace

double tpot_s(const request_result& r) {
  if (r.state != outcome::ok || r.output_tokens < 2 || r.ttft_s < 0)
    return -1;
  return (r.e2e_s - r.ttft_s) / double(r.output_tokens - 1);
}

nlohmann::json make_bench_report(const std::vector<request_result>& results,
                                 const bench_run_info& info) {
  // The records the replay report is made of: successes, and requests the
  // server answered with an HTTP error as "refused"; other failures (no
  // connection, timeouts, broken streams) never finished and are left out
  // of the latencies (counted under "failed").
  std::vector<sim::request_record> records;
  std::vector<double> itl, tpot;
  int64_t prompt_tokens = 0, output_tokens = 0, built_prompt_tokens = 0, server_prompt_tokens = 0;
  int64_t sent = 0, ok = 0, failed = 0, interrupted = 0, not_sent = 0, mismatched = 0;
  int64_t met = 0, met_tokens = 0;
  double makespan = 0;
  std::map<std::string, int64_t> errors;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    switch (r.state) {
      case outcome::not_sent:
        ++not_sent;
        continue;
      case outcome::ok:
        ++ok;
        break;
      case outcome::failed:
        ++failed;
        break;
      case outcome::interrupted:
        ++interrupted;
        break;
    }
    ++sent;
    if (!r.error.empty())
      ++errors[r.error.substr(0, 160)];
    sim::request_record q;
    q.index = int32_t(i);
    q.arrival_s = r.arrival_s;
    q.prompt_tokens = r.server_prompt_tokens >= 0 ? r.server_prompt_tokens : r.prompt_tokens;
    q.output_tokens = r.output_tokens;
    q.produced = r.output_tokens;
    q.queue_s = r.queue_s;
    if (r.state == outcome::ok) {
      q.ttft_s = r.ttft_s;
      q.e2e_s = r.e2e_s;
      itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
      if (const double t = tpot_s(r); t >= 0)
        tpot.push_back(t * 1e3);
      prompt_tokens += q.prompt_tokens;
      output_tokens += r.output_tokens;
      built_prompt_tokens += r.prompt_tokens;
      if (r.server_prompt_tokens >= 0) {
        server_prompt_tokens += r.server_prompt_tokens;
        mismatched += r.server_prompt_tokens != r.prompt_tokens;
      }
      makespan = std::max(makespan, r.arrival_s + r.e2e_s);
      const bool ttft_ok = info.slo_ttft_ms <= 0 || r.ttft_s * 1e3 <= info.slo_ttft_ms;
      const double t = tpot_s(r);
      const bool tpot_ok = info.slo_tpot_ms <= 0 || t < 0 || t * 1e3 <= info.slo_tpot_ms;
      if (ttft_ok && tpot_ok) {
        ++met;
        met_tokens += r.output_tokens;
      }
    } else if (r.state == outcome::failed && r.http_status >= 400) {
      q.refused = fmt::format("http_{}", r.http_status);
    }
    records.push_back(std::move(q));
  }

  nlohmann::json j = sim::latency_report(records, itl, makespan, prompt_tokens, output_tokens);
  j["policy"] = info.label;
  j["trace"] = info.trace_name;
  j["rate_scale"] = info.rate_scale;
  for (const char* key : simulator_only_keys)
    j[key] = nullptr;
  j["tpot_ms"] = sim::percentiles(tpot);
  j["sent"] = sent;
  j["succeeded"] = ok;
  j["failed"] = failed;
  j["interrupted"] = interrupted;
  j["not_sent"] = not_sent;
  j["partial"] = info.interrupted;
  j["request_throughput_per_s"] = per_s(double(ok), makespan);
  j["wall_s"] = info.wall_s;
  j["slo"] = {{"ttft_ms", info.slo_ttft_ms > 0 ? nlohmann::json(info.slo_ttft_ms) : nullptr},
              {"tpot_ms", info.slo_tpot_ms > 0 ? nlohmann::json(info.slo_tpot_ms) : nullptr},
              {"met", met},
              {"attainment", sent > 0 ? double(met) / double(sent) : 0.0}};
  j["goodput"] = {{"requests_per_s", per_s(double(met), makespan)},
                  {"output_tokens_per_s", per_s(double(met_tokens), makespan)}};
  j["prompt_tokens"] = {{"built", built_prompt_tokens},
                        {"server", server_prompt_tokens},
                        {"mismatched_requests", mismatched}};
  nlohmann::json errs = nlohmann::json::object();
  for (const auto& [text, count] : errors)
    errs[text] = count;
  j["errors"] = errs;
  j["server"] = {{"url", info.url},
                 {"model", info.model},
                 {"endpoint", info.endpoint == api_endpoint::chat ? "chat" : "completions"}};
  j["client"] = {{"max_concurrency", info.max_concurrency}, {"timeout_s", info.timeout_s}};
  return j;
}

std::string requests_csv(const std::vector<request_result>& results) {
  std::string out = "index,arrival_s,queue_s,ttft_s,e2e_s,tpot_s,prompt_tokens,"
                    "server_prompt_tokens,output_tokens,max_tokens,content_chunks,http_status,"
                    "outcome,error\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    if (r.state == outcome::not_sent)
      continue;
    out += fmt::format("{},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{},{},{},{},{},{},{},{}\n", i,
                       r.arrival_s, r.queue_s, r.ttft_s, r.e2e_s, tpot_s(r), r.prompt_tokens,
                       r.server_prompt_tokens, r.output_tokens, r.max_tokens, r.content_chunks,
                       r.http_status, outcome_name(r.state), csv_quote(r.error));
  }
  return out;
}

std::vector<sim::plot_panel> bench_panels(const std::vector<request_result>& results,
                                          const bench_run_info& info) {
  std::vector<double> e2e, ttft, itl, tpot;
  for (const auto& r : results) {
    if (r.state != outcome::ok)
      continue;
    e2e.push_back(r.e2e_s * 1e3);
    ttft.push_back(r.ttft_s * 1e3);
    for (double g : r.itl_s)
      itl.push_back(g * 1e3);
    if (const double t = tpot_s(r); t >= 0)
      tpot.push_back(t * 1e3);
  }
  const auto where = fmt::format("{} x{}", info.trace_name, info.rate_scale);
  auto panel = [&](const std::string& title, const std::string& x, std::vector<double> v) {
    sim::plot_panel p{fmt::format("{}, {}", title, where), x, "fraction of requests", true, false,
                      {}};
    p.series.push_back(sim::cdf_series(info.label, std::move(v)));
    return p;
  };
  std::vector<sim::plot_panel> panels;
  panels.push_back(panel("E2E latency CDF", "end-to-end latency (ms)", std::move(e2e)));
  panels.push_back(panel("TTFT CDF", "time to first token (ms)", std::move(ttft)));
  panels.push_back(panel("ITL CDF", "inter-token latency (ms)", std::move(itl)));
  panels.push_back(panel("TPOT CDF", "time per output token (ms)", std::move(tpot)));
  return panels;
}

} // namespace metronome::bench
