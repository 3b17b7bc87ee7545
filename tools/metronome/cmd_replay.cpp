// metronome replay: a request trace through the real scheduler, policies,
// KV page pool, predictor and drift supervision, on a simulated executor
// whose steps take the cost model's time. Writes a JSON report and SVG plots.

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <system_error>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "config/config_loader.hpp"
#include "sim/report.hpp"
#include "sim/settings.hpp"
#include "sim/svg_plot.hpp"
#include "sim/workload.hpp"
#include "tools/metronome/command.hpp"

namespace metronome::cli {

namespace {

struct replay_args {
  std::string trace;
  std::string workload;
  std::string format;
  std::string policy;
  std::optional<std::string> config;
  std::string rate_scale = "1";
  std::optional<std::string> cost_model;
  std::string report;
  std::optional<std::string> plot;
  std::optional<std::string> requests_csv;
  std::optional<std::string> step_trace;
  int32_t max_tokens = 0;
  std::string replicas = "1";
  std::vector<std::string> set;
  bool quiet = false;
};

// -- --set for policy settings without a configuration key -----------------------

bool is_extra(const std::string& kv) {
  return kv.starts_with("ladb.") || kv.starts_with("srpt.") || kv.starts_with("drift.");
}

/// Applies "ladb.KEY=VALUE", "srpt.KEY=VALUE" or "drift.KEY=VALUE".
void apply_extra(sim::scheduling_settings& s, const std::string& kv) {
  const auto eq = kv.find('=');
  if (eq == std::string::npos)
    throw std::runtime_error("--set " + kv + ": expected KEY=VALUE");
  const auto key = kv.substr(0, eq);
  const auto text = kv.substr(eq + 1);
  auto number = [&] {
    const auto v = parse_decimal(text);
    if (!v || *v < 0)
      throw std::runtime_error("--set " + key + ": '" + text + "' is not a number >= 0");
    return *v;
  };
  auto flag = [&] {
    if (text == "true" || text == "1")
      return true;
    if (text == "false" || text == "0")
      return false;
    throw std::runtime_error("--set " + key + ": '" + text + "' is not true or false");
  };
  auto ms = [&] { return sched_time{int64_t(number() * 1e6)}; };
  if (key == "ladb.decode_step_weight")
    s.ladb.decode_step_weight = number();
  else if (key == "ladb.aging_tokens_per_s")
    s.ladb.aging_tokens_per_s = number();
  else if (key == "ladb.starvation_wait_ms")
    s.ladb.starvation_wait = ms();
  else if (key == "ladb.starvation_tokens_per_s")
    s.ladb.starvation_tokens_per_s = number();
  else if (key == "ladb.step_time_factor")
    s.ladb.step_time_factor = number();
  else if (key == "ladb.max_step_ms")
    s.ladb.max_step_ms = number();
  else if (key == "ladb.long_step_share")
    s.ladb.long_step_share = number();
  else if (key == "ladb.max_long_steps")
    s.ladb.max_long_steps = number();
  else if (key == "ladb.max_prompt_wait_ms")
    s.ladb.max_prompt_wait = ms();
  else if (key == "ladb.reclassify")
    s.ladb.reclassify = flag();
  else if (key == "srpt.reclassify")
    s.srpt.reclassify = flag();
  else if (key == "srpt.starvation_tokens_per_s")
    s.srpt.starvation_tokens_per_s = number();
  else if (key == "srpt.decode_step_weight")
    s.srpt.decode_step_weight = number();
  else if (key == "drift.relative_to_baseline")
    s.drift.relative_to_baseline = flag();
  else
    throw std::runtime_error("--set " + key + ": unknown key (ladb.decode_step_weight, "
                             "ladb.aging_tokens_per_s, ladb.starvation_wait_ms, "
                             "ladb.starvation_tokens_per_s, ladb.step_time_factor, "
                             "ladb.max_step_ms, ladb.long_step_share, "
                             "ladb.max_long_steps, ladb.max_prompt_wait_ms, ladb.reclassify, "
                             "srpt.decode_step_weight, srpt.starvation_tokens_per_s, "
                             "srpt.reclassify, "
                             "drift.relative_to_baseline, or a configuration key)");
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty())
      out.push_back(item);
  return out;
}

std::vector<double> parse_scales(const std::string& text) {
  std::vector<double> out;
  for (const auto& item : split(text)) {
    const auto v = parse_decimal(item);
    if (!v || !(*v > 0) || *v > 1e6)
      throw command_error("--rate-scale: '" + item + "' is not a positive number");
    out.push_back(*v);
  }
  if (out.empty())
    throw command_error("--rate-scale: no value given");
  return out;
}

std::vector<policy_kind> parse_policies(const std::string& text) {
  auto names = text == "all" ? std::vector<std::string>{"fcfs", "ladb", "srpt"} : split(text);
  if (names.empty())
    throw command_error("--policy: no policy given");
  std::vector<policy_kind> out;
  for (const auto& n : names) {
    const auto p = parse_policy_kind(n);
    if (!p)
      throw command_error("--policy: unknown policy '" + n + "' (policies: "
                          + std::string(policy_names()) + ", or all)");
    out.push_back(*p);
  }
  return out;
}

/// --replicas: a whole number from 1 to sim::max_replicas.
int32_t parse_replicas(const std::string& text) {
  int32_t v = 0;
  const auto* end = text.data() + text.size();
  const auto [at, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text.front())) || ec != std::errc{}
      || at != end || v < 1 || v > sim::max_replicas)
    throw command_error("--replicas: '" + text + "' is not a whole number from 1 to "
                          + std::to_string(sim::max_replicas),
                        2);
  return v;
}

sim::cost_model load_cost_model(const std::optional<std::string>& path) {
  namespace fs = std::filesystem;
  if (path)
    return sim::cost_model::load(*path);
  // The source tree's, else the installed one: <prefix>/share/metronome/
  // cost_models beside this executable's <prefix>/bin.
  const fs::path shipped = METRONOME_DEFAULT_COST_MODEL;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const fs::path installed = ec ? fs::path()
                                : exe.parent_path().parent_path() / "share" / "metronome"
                                    / "cost_models" / shipped.filename();
  for (const auto& candidate : {shipped, installed})
    if (!candidate.empty() && fs::exists(candidate, ec))
      return sim::cost_model::load(candidate);
  std::fprintf(stderr, "warning: %s not found: using the built-in provisional H200 model\n",
               shipped.c_str());
  return sim::cost_model{};
}

/// A one-line progress bar on stderr while the replays run, in bench-serve's
/// style: requests settled (finished or refused) over all runs, runs done,
/// wall time. Its own thread redraws it ten times a second; stop() draws the
/// last state and ends the line. Make one only when stderr is a terminal.
class progress_bar {
public:
  progress_bar(int64_t total_requests, size_t runs)
    : total_(total_requests), runs_(runs), start_(std::chrono::steady_clock::now()),
      thread_([this] { loop(); }) {}

  ~progress_bar() {
    stop();
  }

  progress_bar(const progress_bar&) = delete;
  progress_bar& operator=(const progress_bar&) = delete;

  /// Requests settled so far (sim::replay_options::progress).
  std::atomic<int64_t> settled{0};
  /// Runs finished so far.
  std::atomic<size_t> runs_done{0};

  /// Stops the redraws, draws the final state and a newline. Idempotent.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      if (stopped_)
        return;
      stopped_ = true;
    }
    wake_.notify_all();
    thread_.join();
    draw();
    std::fputc('\n', stderr);
    std::fflush(stderr);
  }

private:
  void loop() {
    std::unique_lock lock(mutex_);
    while (!stopped_) {
      draw();
      wake_.wait_for(lock, std::chrono::milliseconds(100));
    }
  }

  void draw() const {
    const int width = 30;
    const int64_t done = std::min(settled.load(std::memory_order_relaxed), total_);
    const int filled = total_ > 0 ? int(done * width / total_) : width;
    const int percent = total_ > 0 ? int(done * 100 / total_) : 100;
    const double elapsed
      = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::fprintf(stderr, "\r[%s%s] %3d%% %lld/%lld requests, %zu/%zu runs, %.1f s ",
                 std::string(size_t(filled), '=').c_str(),
                 std::string(size_t(width - filled), ' ').c_str(), percent, (long long)done,
                 (long long)total_, runs_done.load(std::memory_order_relaxed), runs_, elapsed);
    std::fflush(stderr);
  }

  const int64_t total_;
  const size_t runs_;
  const std::chrono::steady_clock::time_point start_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopped_ = false;
  std::thread thread_; // last: starts once the rest is set
};

/// The summary table: one row per run under a row of the columns' units,
/// then the refused requests' reasons of each run that refused any.
void print_table(const std::vector<nlohmann::json>& reports) {
  const char* row = "%-13s %6s %8s %8s %8s %8s %8s %8s %9s %7s %7s %8s\n";
  std::printf(row, "policy", "rate", "ttft50", "ttft95", "ttft99", "e2e50", "e2e95", "e2e99",
              "tok/s", "slow10", "cached", "refused");
  std::printf(row, "", "x", "ms", "ms", "ms", "ms", "ms", "ms", "tok/s", "x", "%", "requests");
  for (const auto& r : reports) {
    double worst = 0;
    for (const auto& d : r["slowdown_by_output_decile"])
      worst = std::max(worst, d["mean_slowdown"].get<double>());
    std::printf("%-13s %6.3g %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %9.1f %7.2f %7.1f %8lld\n",
                r["policy"].get<std::string>().c_str(), r["rate_scale"].get<double>(),
                r["ttft_ms"]["p50"].get<double>(), r["ttft_ms"]["p95"].get<double>(),
                r["ttft_ms"]["p99"].get<double>(), r["e2e_ms"]["p50"].get<double>(),
                r["e2e_ms"]["p95"].get<double>(), r["e2e_ms"]["p99"].get<double>(),
                r["throughput_tokens_per_s"].get<double>(), worst,
                100.0 * r["prefix_cache_hit_rate"].get<double>(),
                (long long)r["refused"].get<int64_t>());
  }
  for (const auto& r : reports) {
    if (r["refused"].get<int64_t>() == 0)
      continue;
    std::string reasons;
    for (const auto& [reason, n] : r["refused_by_reason"].items())
      reasons += fmt::format("{}{} {}", reasons.empty() ? "" : ", ", reason, n.get<int64_t>());
    std::printf("  %s x%g: %lld of %lld requests refused (%s)\n",
                r["policy"].get<std::string>().c_str(), r["rate_scale"].get<double>(),
                (long long)r["refused"].get<int64_t>(),
                (long long)(r["refused"].get<int64_t>() + r["requests"].get<int64_t>()),
                reasons.c_str());
  }
}

/// What the table's columns mean.
void print_legend() {
  std::printf(
    "\n"
    "rate     arrival rate multiplier (x the trace's arrival rate)\n"
    "ttftNN   time to first token from arrival, NNth percentile (ms)\n"
    "e2eNN    end-to-end latency, arrival to last token, NNth percentile (ms)\n"
    "tok/s    output tokens per second of simulated time, first arrival to last token\n"
    "slow10   worst output-length decile's mean slowdown (e2e / e2e alone on an idle engine)\n"
    "cached   prompt tokens found in the prefix cache (%% of those looked up)\n"
    "refused  requests the scheduler refused at admission (too long for the context, too\n"
    "         large for the KV cache); left out of every other column\n");
}

void run(const replay_args& a) {
  if (a.trace.empty() == a.workload.empty())
    throw command_error("give --trace FILE or --workload SPEC", 2);
  sim::trace_format format = sim::trace_format::csv;
  if (!a.trace.empty()) {
    if (a.format.empty())
      format = sim::guess_trace_format(a.trace);
    else if (!sim::parse_trace_format(a.format, format))
      throw command_error("--format: '" + a.format + "' is not azure, mooncake or csv");
    if (!std::filesystem::exists(a.trace))
      throw command_error("--trace: " + a.trace + ": no such file");
  }
  const auto policies = parse_policies(a.policy);
  const auto scales = parse_scales(a.rate_scale);
  const auto replicas = parse_replicas(a.replicas);
  sim::trace t;
  sim::cost_model cost;
  server_config cfg;
  try {
    t = a.trace.empty() ? sim::make_workload(a.workload) : sim::read_trace(a.trace, format);
  } catch (const sim::workload_error& e) {
    throw command_error(std::string("--") + e.what(), 2);
  } catch (const std::exception& e) {
    throw command_error(e.what());
  }
  try {
    cost = load_cost_model(a.cost_model);
    cfg = load_config(a.config ? std::optional<std::filesystem::path>(*a.config) : std::nullopt, {});
  } catch (const std::exception& e) {
    throw command_error(e.what());
  }
  if (t.requests.empty())
    throw command_error(a.trace.empty() ? "--workload: no requests"
                                        : "--trace: " + a.trace + ": no requests");

  sim::replay_options base;
  try {
    // Configuration keys first (with their checks), then the policy
    // settings that have no configuration key.
    for (const auto& kv : a.set)
      if (!is_extra(kv))
        apply_set(cfg, kv);
    validate(cfg, a.config.value_or("--set"));
    base.settings = sim::settings_from_config(cfg);
    for (const auto& kv : a.set)
      if (is_extra(kv))
        apply_extra(base.settings, kv);
  } catch (const std::exception& e) {
    throw command_error(e.what());
  }
  base.cost = cost;
  base.max_tokens = a.max_tokens;
  base.replicas = replicas;
  if (a.step_trace) {
    if (policies.size() != 1 || scales.size() != 1)
      throw command_error("--step-trace: give one policy and one rate scale (the trace is one "
                          "run's steps)");
    base.step_trace = *a.step_trace;
  }
  struct job {
    policy_kind policy;
    double scale;
  };
  std::vector<job> jobs;
  for (double s : scales)
    for (const auto& p : policies)
      jobs.push_back({p, s});

  // Runs are independent and deterministic: spread them over the cores and
  // keep the results in job order.
  std::vector<sim::replay_result> results(jobs.size());
  std::vector<std::string> errors(jobs.size());
  std::atomic<size_t> next{0};
  const auto start = std::chrono::steady_clock::now();
  // On a terminal only: nothing in logs or pipes.
  std::unique_ptr<progress_bar> bar;
  if (!a.quiet && isatty(STDERR_FILENO))
    bar = std::make_unique<progress_bar>(int64_t(t.requests.size() * jobs.size()), jobs.size());
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < jobs.size();) {
      auto o = base;
      o.policy = jobs[i].policy;
      o.rate_scale = jobs[i].scale;
      o.progress = bar ? &bar->settled : nullptr;
      try {
        results[i] = sim::replay(t, o);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
      if (bar)
        bar->runs_done.fetch_add(1, std::memory_order_relaxed);
    }
  };
  const size_t threads
    = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, std::min<size_t>(jobs.size(), 8));
  std::vector<std::thread> pool;
  for (size_t i = 1; i < threads; ++i)
    pool.emplace_back(worker);
  worker();
  for (auto& th : pool)
    th.join();
  if (bar)
    bar->stop();
  for (size_t i = 0; i < jobs.size(); ++i)
    if (!errors[i].empty())
      throw command_error(std::string(to_string(jobs[i].policy)) + " at rate scale "
                          + fmt::format("{}", jobs[i].scale) + ": " + errors[i]);
  const double wall
    = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<nlohmann::json> reports;
  for (const auto& r : results)
    reports.push_back(sim::make_report(r));
  nlohmann::json doc;
  if (reports.size() == 1) {
    doc = reports.front();
  } else {
    doc["trace"] = t.name;
    doc["runs"] = reports;
    nlohmann::json cmp = nlohmann::json::array();
    for (double s : scales) {
      std::vector<nlohmann::json> at;
      for (const auto& r : reports)
        if (r["rate_scale"].get<double>() == s)
          at.push_back(r);
      auto c = sim::compare_to_fcfs(at);
      if (!c.is_null())
        cmp.push_back({{"rate_scale", s}, {"vs_fcfs", c}});
    }
    doc["comparison"] = cmp;
  }
  std::ofstream out(a.report);
  if (!out)
    throw command_error("--report: cannot write " + a.report);
  out << doc.dump(1) << "\n";
  if (a.plot) {
    std::ofstream svg(*a.plot);
    if (!svg)
      throw command_error("--plot: cannot write " + *a.plot);
    svg << sim::render_svg(sim::replay_panels(results, reports, scales.back()));
  }
  if (a.requests_csv) {
    std::ofstream csv(*a.requests_csv);
    if (!csv)
      throw command_error("--requests: cannot write " + *a.requests_csv);
    csv << "policy,rate_scale,index,arrival_s,prompt_tokens,output_tokens,queue_s,ttft_s,e2e_s,"
           "unloaded_ttft_s,unloaded_e2e_s,refused\n";
    for (const auto& r : results)
      for (const auto& q : r.requests)
        csv << fmt::format("{},{},{},{:.6f},{},{},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{}\n",
                           r.policy, r.rate_scale, q.index, q.arrival_s, q.prompt_tokens,
                           q.output_tokens, q.queue_s, q.ttft_s, q.e2e_s, q.unloaded_ttft_s,
                           q.unloaded_e2e_s, q.refused);
  }
  if (!a.quiet) {
    std::printf("%s: %zu requests over %.1f s, cost model %s%s%s\n", t.name.c_str(),
                t.requests.size(), t.duration_s(), cost.name.c_str(),
                cost.provisional ? " (provisional)" : "",
                replicas > 1 ? fmt::format(", {} replicas behind the router", replicas).c_str()
                             : "");
    print_table(reports);
    for (const auto& r : reports)
      for (const auto& e : r["supervisor"]["events"]) {
        std::printf("  %s x%g: at %.1f s %s -> %s (%s", r["policy"].get<std::string>().c_str(),
                    r["rate_scale"].get<double>(), e["at_s"].get<double>(),
                    e["action"].get<std::string>().c_str(), e["policy"].get<std::string>().c_str(),
                    e["cause"].get<std::string>().c_str());
        if (e["action"] == "disable")
          std::printf(": mean relative error %.3f > %.3f over %lld predictions",
                      e["error"].get<double>(), e["limit"].get<double>(),
                      (long long)e["samples"].get<int64_t>());
        std::printf(")\n");
      }
    print_legend();
    std::fprintf(stderr, "[%zu replays in %.1f s]\n", jobs.size(), wall);
  }
}

void setup(CLI::App& app) {
  auto a = std::make_shared<replay_args>();
  auto* cmd = app.add_subcommand("replay", "Replay a request trace through the scheduler on a "
                                           "simulated executor");
  cmd->add_option("--trace", a->trace, "Trace file (Azure CSV, Mooncake JSONL or simple CSV)")
    ->type_name("PATH");
  cmd->add_option("--workload", a->workload,
                  "Synthetic workload instead of --trace, e.g. "
                  "poisson:rate=20,prompt=uniform:130:900,output=uniform:64:448,n=500,seed=1 "
                  "(docs/bench-serve.md)")
    ->type_name("SPEC");
  cmd->add_option("--format", a->format, "Trace format (unset: from the file)")
    ->type_name("{azure,mooncake,csv}");
  cmd->add_option("--policy", a->policy,
                  "Policy, or several separated by commas, or all (fcfs,ladb,srpt)")
    ->type_name("POLICY,...")
    ->required();
  cmd->add_option("--config", a->config, "metronome.yaml (engine limits, batching, predictor, "
                                         "router, supervisor.drift)")
    ->type_name("PATH");
  cmd->add_option("--rate-scale", a->rate_scale,
                  "Arrival rate multiplier, or several separated by commas (a sweep)")
    ->type_name("FLOAT,...");
  cmd->add_option("--cost-model", a->cost_model,
                  "Step-time model (unset: sim/cost_models/h200-llama3-8b.json)")
    ->type_name("PATH");
  cmd->add_option("--report", a->report, "Where to write the JSON report")
    ->type_name("PATH")
    ->required();
  cmd->add_option("--plot", a->plot, "Where to write SVG plots (CDFs, P95 against load)")
    ->type_name("PATH");
  cmd->add_option("--requests", a->requests_csv,
                  "Where to write one CSV row per request and run (latencies, unloaded "
                  "latencies)")
    ->type_name("PATH");
  cmd->add_option("--step-trace", a->step_trace,
                  "Where to write one CSV row per simulated step (the columns of serve's "
                  "logging.step_trace); one policy and one rate scale only")
    ->type_name("PATH");
  cmd->add_option("--max-tokens", a->max_tokens,
                  "max_tokens of every request, 0 to 16777216 (0: up to the context)")
    ->check(CLI::Range(0, 1 << 24).description(""));
  cmd->add_option("--replicas", a->replicas,
                  "Data parallel replicas behind the router, 1 to 64, each with its own "
                  "scheduler, KV cache and executor (docs/scale-out.md)")
    ->type_name("N");
  cmd->add_option("--set", a->set,
                  "KEY=VALUE: a configuration key (engine.max_batch_size=64), or a policy "
                  "setting without one (ladb.step_time_factor=2, ladb.aging_tokens_per_s=100, "
                  "drift.relative_to_baseline=false, ...); repeatable")
    ->type_name("KEY=VALUE");
  cmd->add_flag("--quiet", a->quiet,
                "Print nothing (otherwise: a summary table with its units and legend, and a "
                "progress bar while stderr is a terminal)");
  cmd->callback([a] { run(*a); });
}

const int registered = register_command(60, &setup);

} // namespace

} // namespace metronome::cli
