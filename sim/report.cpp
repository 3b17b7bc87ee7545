#include "sim/report.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

namespace metronome::sim {

double percentile_sorted(const std::vector<double>& sorted, double p) {
  if (sorted.empty())
    return 0;
  const double rank = std::ceil(p / 100.0 * double(sorted.size()));
  const size_t i = size_t(std::clamp(rank, 1.0, double(sorted.size()))) - 1;
  return sorted[i];
}

nlohmann::json percentiles(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const double mean
    = values.empty() ? 0.0 : std::accumulate(values.begin(), values.end(), 0.0) / double(values.size());
  return {{"p50", percentile_sorted(values, 50)},
          {"p95", percentile_sorted(values, 95)},
          {"p99", percentile_sorted(values, 99)},
          {"mean", mean}};
}

namespace {

double ratio(double a, double b) {
  return b > 0 ? a / b : 0.0;
}

/// Rounds to 6 significant digits so the JSON stays readable (and equal
/// across runs, which it is anyway).
double tidy(double x) {
  if (x == 0 || !std::isfinite(x))
    return std::isfinite(x) ? 0.0 : x;
  const double scale = std::pow(10.0, 5 - std::floor(std::log10(std::abs(x))));
  return std::round(x * scale) / scale;
}

nlohmann::json tidy(nlohmann::json j) {
  if (j.is_number_float())
    return tidy(j.get<double>());
  if (j.is_object() || j.is_array())
    for (auto& v : j)
      v = tidy(v);
  return j;
}

nlohmann::json ms_percentiles(const std::vector<double>& seconds) {
  std::vector<double> ms;
  ms.reserve(seconds.size());
  for (auto s : seconds)
    ms.push_back(s * 1e3);
  return percentiles(std::move(ms));
}

nlohmann::json slowdown_deciles(const std::vector<const request_record*>& done) {
  auto sorted = done;
  std::stable_sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) {
    return a->output_tokens < b->output_tokens;
  });
  nlohmann::json out = nlohmann::json::array();
  const size_t n = sorted.size();
  for (int d = 0; d < 10; ++d) {
    const size_t lo = n * size_t(d) / 10, hi = n * size_t(d + 1) / 10;
    if (lo >= hi)
      continue;
    std::vector<double> slow, e2e;
    bool have_unloaded = false;
    for (size_t i = lo; i < hi; ++i) {
      const auto* r = sorted[i];
      slow.push_back(r->unloaded_e2e_s > 0 ? r->e2e_s / r->unloaded_e2e_s : 1.0);
      have_unloaded = have_unloaded || r->unloaded_e2e_s > 0;
      e2e.push_back(r->e2e_s * 1e3);
    }
    auto s = percentiles(slow);
    if (!have_unloaded) // a live run: no unloaded reference to compare with
      s = {{"mean", nullptr}, {"p50", nullptr}, {"p95", nullptr}};
    out.push_back({{"decile", d + 1},
                   {"output_tokens_min", sorted[lo]->output_tokens},
                   {"output_tokens_max", sorted[hi - 1]->output_tokens},
                   {"requests", hi - lo},
                   {"mean_slowdown", s["mean"]},
                   {"p50_slowdown", s["p50"]},
                   {"p95_slowdown", s["p95"]},
                   {"mean_e2e_ms", percentiles(e2e)["mean"]}});
  }
  return out;
}

} // namespace

nlohmann::json latency_report(const std::vector<request_record>& requests,
                              const std::vector<double>& itl_s, double makespan_s,
                              int64_t prompt_tokens, int64_t output_tokens) {
  std::vector<const request_record*> done;
  std::vector<double> ttft, e2e, queue;
  int64_t refused = 0;
  std::map<std::string, int64_t> refused_by_reason;
  double longest_wait = 0;
  for (const auto& q : requests) {
    if (!q.refused.empty()) {
      ++refused;
      ++refused_by_reason[q.refused];
      continue;
    }
    if (q.e2e_s < 0)
      continue;
    done.push_back(&q);
    ttft.push_back(q.ttft_s);
    e2e.push_back(q.e2e_s);
    queue.push_back(std::max(q.queue_s, 0.0));
    longest_wait = std::max(longest_wait, q.queue_s);
  }
  nlohmann::json j;
  j["requests"] = done.size();
  j["refused"] = refused;
  j["refused_by_reason"] = refused_by_reason.empty() ? nlohmann::json::object()
                                                     : nlohmann::json(refused_by_reason);
  j["throughput_tokens_per_s"] = ratio(double(output_tokens), makespan_s);
  j["total_tokens_per_s"] = ratio(double(output_tokens + prompt_tokens), makespan_s);
  j["makespan_s"] = makespan_s;
  j["ttft_ms"] = ms_percentiles(ttft);
  j["itl_ms"] = ms_percentiles(itl_s);
  j["e2e_ms"] = ms_percentiles(e2e);
  j["queue_ms"] = ms_percentiles(queue);
  auto p95_over_p50 = [](const nlohmann::json& p) {
    return ratio(p["p95"].get<double>(), p["p50"].get<double>());
  };
  j["p95_over_p50"] = {{"ttft", p95_over_p50(j["ttft_ms"])},
                       {"itl", p95_over_p50(j["itl_ms"])},
                       {"e2e", p95_over_p50(j["e2e_ms"])},
                       {"queue", p95_over_p50(j["queue_ms"])}};
  j["longest_wait_ms"] = longest_wait * 1e3;
  j["slowdown_by_output_decile"] = slowdown_deciles(done);
  return tidy(j);
}

nlohmann::json make_report(const replay_result& r) {
  std::vector<double> itl(r.itl_s.begin(), r.itl_s.end());
  nlohmann::json j
    = latency_report(r.requests, itl, r.makespan_s, r.prompt_tokens, r.output_tokens);
  std::vector<double> ul_ttft, ul_e2e;
  for (const auto& q : r.requests)
    if (q.refused.empty() && q.e2e_s >= 0) {
      ul_ttft.push_back(q.unloaded_ttft_s);
      ul_e2e.push_back(q.unloaded_e2e_s);
    }
  j["policy"] = r.policy;
  j["trace"] = r.trace_name;
  j["rate_scale"] = r.rate_scale;
  j["unloaded"] = {{"ttft_ms", ms_percentiles(ul_ttft)}, {"e2e_ms", ms_percentiles(ul_e2e)}};
  j["e2e_p95_over_unloaded_p95"]
    = ratio(j["e2e_ms"]["p95"].get<double>(), j["unloaded"]["e2e_ms"]["p95"].get<double>());
  const double steps = double(std::max<int64_t>(r.steps, 1));
  j["steps"] = r.steps;
  j["mean_batch_size"] = r.sum_batch / steps;
  j["batch_efficiency"] = r.sum_batch / steps / std::max(r.max_batch_size, 1);
  // The replicas' mean: each executor's busy time over the makespan.
  j["busy_fraction"] = ratio(r.busy_s, r.makespan_s * std::max(r.replicas, 1));
  j["preemptions"] = r.preemptions;
  // metronome:scheduling_events_total{kind} as the server counts it.
  j["scheduling_events"] = {{"limited_step", r.limited_steps},
                            {"long_step", r.policy_stats.long_steps},
                            {"relaxed_step", r.policy_stats.relaxed_steps},
                            {"promotion", r.policy_stats.promotions},
                            {"reclassification", r.policy_stats.reclassifications},
                            {"timeout_dispatch", r.policy_stats.timeout_dispatches},
                            {"group_admission", r.group_stats.admissions},
                            {"group_preemption", r.group_stats.preemptions},
                            {"group_decode", r.group_stats.decodes}};
  j["token_groups"] = r.token_groups;
  j["prefix_cache_queries"] = r.prefix_queries;
  j["prefix_cache_hits"] = r.prefix_hits;
  j["prefix_cache_hit_rate"] = r.prefix_queries > 0 ? double(r.prefix_hits) / double(r.prefix_queries) : 0.0;
  // Pages in use (tables) and reserved by buckets but not yet used: what
  // each strategy holds, and wastes, per step on average.
  j["kv"] = {{"strategy", r.kv_strategy},
             {"bucket_admissions", r.bucket_admissions},
             {"bucket_overflows", r.bucket_overflows},
             {"mean_used_pages", r.sum_used_pages / steps},
             {"mean_reserved_unused_pages", r.sum_reserved_unused_pages / steps},
             {"pages", r.kv_pages}};
  const auto acc = measure_accuracy(r.predictions);
  std::vector<prediction_outcome> learned;
  for (const auto& o : r.predictions)
    if (o.expected_error >= 0)
      learned.push_back(o);
  const auto lacc = measure_accuracy(learned);
  j["predictor"] = {{"samples", acc.samples},
                    {"mae_steps", acc.mae},
                    {"mean_relative_error", acc.mean_relative_error},
                    {"spearman", acc.spearman},
                    {"learned",
                     {{"samples", lacc.samples},
                      {"mae_steps", lacc.mae},
                      {"mean_relative_error", lacc.mean_relative_error},
                      {"spearman", lacc.spearman}}},
                    {"reclassified_requests", r.policy_stats.reclassified_requests},
                    {"reclassifications", r.policy_stats.reclassifications},
                    {"timeout_dispatches", r.policy_stats.timeout_dispatches},
                    {"promotions", r.policy_stats.promotions},
                    {"long_steps", r.policy_stats.long_steps},
                    {"relaxed_steps", r.policy_stats.relaxed_steps}};
  nlohmann::json events = nlohmann::json::array();
  for (const auto& e : r.events)
    events.push_back({{"at_s", double(e.at_ns) * 1e-9},
                      {"action", e.action},
                      {"policy", e.policy},
                      {"cause", e.cause},
                      {"error", e.error},
                      {"limit", e.limit},
                      {"samples", e.samples}});
  j["supervisor"] = {{"events", events}, {"switches", r.events.size()}, {"disabled_s", r.disabled_s}};
  j["engine"] = {{"max_batch_size", r.max_batch_size},
                 {"kv_pages", r.kv_pages},
                 {"page_size", r.page_size}};
  j["cost_model"] = r.cost.to_json();
  j["replicas"] = r.replicas;
  nlohmann::json per = nlohmann::json::array();
  for (size_t i = 0; i < r.per_replica.size(); ++i) {
    const auto& p = r.per_replica[i];
    per.push_back({{"replica", i},
                   {"placed", p.placed},
                   {"refused", p.refused},
                   {"prompt_tokens", p.prompt_tokens},
                   {"output_tokens", p.output_tokens},
                   {"steps", p.steps},
                   {"preemptions", p.preemptions},
                   {"prefix_cache_hits", p.prefix_hits},
                   {"busy_fraction", ratio(p.busy_s, r.makespan_s)}});
  }
  j["per_replica"] = per;
  return tidy(j);
}

nlohmann::json compare_to_fcfs(const std::vector<nlohmann::json>& reports) {
  const nlohmann::json* base = nullptr;
  for (const auto& r : reports)
    if (r.value("policy", "") == "fcfs")
      base = &r;
  if (!base)
    return nullptr;
  auto p95 = [](const nlohmann::json& r, const char* key) { return r[key]["p95"].get<double>(); };
  nlohmann::json out = nlohmann::json::object();
  for (const auto& r : reports) {
    const std::string name = r["policy"];
    if (name == "fcfs")
      continue;
    const double e2e = ratio(p95(r, "e2e_ms"), p95(*base, "e2e_ms"));
    const double ttft = ratio(p95(r, "ttft_ms"), p95(*base, "ttft_ms"));
    const double tput = ratio(r["throughput_tokens_per_s"].get<double>(),
                              (*base)["throughput_tokens_per_s"].get<double>());
    double worst = 0;
    int worst_decile = 0;
    const auto& a = r["slowdown_by_output_decile"];
    const auto& b = (*base)["slowdown_by_output_decile"];
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      const double x = ratio(a[i]["mean_slowdown"].get<double>(), b[i]["mean_slowdown"].get<double>());
      if (x > worst) {
        worst = x;
        worst_decile = a[i]["decile"].get<int>();
      }
    }
    out[name] = {{"p95_e2e_vs_fcfs", e2e},
                 {"p95_ttft_vs_fcfs", ttft},
                 {"throughput_vs_fcfs", tput},
                 {"worst_decile_slowdown_vs_fcfs", worst},
                 {"worst_decile", worst_decile},
                 {"targets_met",
                  {{"p95_e2e", e2e <= 0.6},
                   {"p95_ttft", ttft <= 0.6},
                   {"throughput", std::abs(tput - 1.0) <= 0.03},
                   {"no_starvation", worst <= 1.5}}}};
  }
  return tidy(out);
}

} // namespace metronome::sim
