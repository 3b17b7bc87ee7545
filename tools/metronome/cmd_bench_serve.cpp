// metronome bench-serve: a live load test of an OpenAI-compatible server
// (Metronome, vLLM, ...), the counterpart of `vllm bench serve`. Replays a
// trace (the formats `metronome replay` reads) or a synthetic workload
// open-loop, with prompts cut to the trace's exact token counts, and writes
// the replay report's keys plus TPOT, SLO attainment and goodput
// (docs/bench-serve.md).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <pthread.h>
#include <signal.h>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/serve/bench_report.hpp"
#include "bench/serve/load_client.hpp"
#include "bench/serve/prompt_builder.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "sim/svg_plot.hpp"
#include "sim/trace.hpp"
#include "sim/workload.hpp"
#include "tools/metronome/command.hpp"

namespace metronome::cli {

namespace {

namespace fs = std::filesystem;

/// Bad input exits with 2 (as CLI parse errors of the other subcommands).
constexpr int usage_error = 2;

// Numbers are taken as text and checked here, so a malformed value gets
// exit code 2 and a message naming the option.
struct bench_serve_args {
  std::string url = "http://127.0.0.1:8080";
  bool allow_remote = false;
  std::string endpoint = "completions";
  std::string model;
  std::string api_key;
  std::string tokenizer;
  std::string corpus;
  std::string trace;
  std::string format;
  std::string workload;
  std::string rate_scale = "1";
  std::string max_requests;
  std::string duration;
  std::string max_concurrency;
  std::string timeout_s = "600";
  std::string drain_timeout_s;
  std::string corpus_offset;
  std::string slo_ttft_ms;
  std::string slo_tpot_ms;
  std::string report;
  std::string plot;
  std::string requests_csv;
  std::string label = "server";
  bool quiet = false;
};

double parse_number(const std::string& option, const std::string& text, bool allow_zero) {
  const auto v = parse_decimal(text);
  if (!v || *v < 0 || (!allow_zero && *v == 0))
    throw command_error(option + ": '" + text + "' is not a number "
                          + (allow_zero ? ">= 0" : "> 0"),
                        usage_error);
  return *v;
}

int64_t parse_count(const std::string& option, const std::string& text) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || v < 1)
    throw command_error(option + ": '" + text + "' is not a whole number >= 1", usage_error);
  return v;
}

sim::trace load_requests(const bench_serve_args& a) {
  if (a.trace.empty() == a.workload.empty())
    throw command_error("give --trace FILE or --workload SPEC", usage_error);
  if (!a.workload.empty()) {
    try {
      return sim::make_workload(a.workload);
    } catch (const sim::workload_error& e) {
      throw command_error(std::string("--") + e.what(), usage_error);
    }
  }
  sim::trace_format format;
  if (a.format.empty())
    format = sim::guess_trace_format(a.trace);
  else if (!sim::parse_trace_format(a.format, format))
    throw command_error("--format: '" + a.format + "' is not azure, mooncake or csv", usage_error);
  if (!fs::exists(a.trace))
    throw command_error("--trace: " + a.trace + ": no such file", usage_error);
  try {
    return sim::read_trace(a.trace, format);
  } catch (const std::exception& e) {
    throw command_error(e.what(), usage_error);
  }
}

/// A one-line progress bar on stderr, redrawn at most ten times a second.
class progress_bar {
public:
  void draw(const bench::load_progress& p, bool force = false) {
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(100))
      return;
    last_ = now;
    const int width = 30;
    const int filled
      = p.total > 0 ? int(std::min<int64_t>(width, p.finished * width / p.total)) : width;
    std::fprintf(stderr, "\r[%s%s] %lld/%lld done, %lld in flight, %lld failed, %.1f s ",
                 std::string(size_t(filled), '=').c_str(),
                 std::string(size_t(width - filled), ' ').c_str(), (long long)p.finished,
                 (long long)p.total, (long long)(p.sent - p.finished), (long long)p.failed,
                 p.elapsed_s);
    std::fflush(stderr);
  }

private:
  std::chrono::steady_clock::time_point last_{};
};

void print_summary(const nlohmann::json& r) {
  auto p = [&](const char* key, const char* q) { return r[key][q].get<double>(); };
  std::printf("%s: %lld sent, %lld ok, %lld failed%s over %.1f s (%s, %s)\n",
              r["trace"].get<std::string>().c_str(), (long long)r["sent"].get<int64_t>(),
              (long long)r["succeeded"].get<int64_t>(), (long long)r["failed"].get<int64_t>(),
              r["partial"].get<bool>() ? " (interrupted: partial)" : "",
              r["makespan_s"].get<double>(), r["server"]["model"].get<std::string>().c_str(),
              r["server"]["endpoint"].get<std::string>().c_str());
  std::printf("%-6s %9s %9s %9s %9s\n", "ms", "p50", "p95", "p99", "mean");
  for (const char* key : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"})
    std::printf("%-6.*s %9.1f %9.1f %9.1f %9.1f\n", int(std::string(key).size() - 3), key,
                p(key, "p50"), p(key, "p95"), p(key, "p99"), p(key, "mean"));
  std::printf("throughput %.1f output tok/s, %.2f req/s; SLO attainment %.1f%%, goodput %.2f "
              "req/s, %.1f tok/s\n",
              r["throughput_tokens_per_s"].get<double>(),
              r["request_throughput_per_s"].get<double>(),
              100 * r["slo"]["attainment"].get<double>(),
              r["goodput"]["requests_per_s"].get<double>(),
              r["goodput"]["output_tokens_per_s"].get<double>());
  for (const auto& [text, count] : r["errors"].items())
    std::printf("  %lld x %s\n", (long long)count.get<int64_t>(), text.c_str());
}

/// Ctrl-C and SIGTERM for the whole command, from before the prompts are
/// made until the report is written: both are blocked in every thread the
/// command starts, and a thread of this object waits for them. A signal
/// before the run makes it send nothing; one during the run stops it (the
/// load client aborts what is in flight); either way the report is written.
/// One owner for the whole span leaves no moment without a handler (two
/// handlers in turn had one: a signal lost, or the process killed before
/// its report).
class signal_watch {
public:
  signal_watch() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
    thread_ = std::thread([this] {
      for (;;) {
        int sig = 0;
        if (sigwait(&set_, &sig) != 0)
          continue;
        std::lock_guard lock(mu_);
        if (done_)
          return;
        signalled_ = true;
        if (client_)
          client_->stop();
      }
    });
  }
  ~signal_watch() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
      client_ = nullptr;
    }
    pthread_kill(thread_.native_handle(), SIGTERM); // wakes the sigwait
    thread_.join();
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  signal_watch(const signal_watch&) = delete;
  signal_watch& operator=(const signal_watch&) = delete;

  /// From now on a signal stops `c` (null: none); at once if one came
  /// already. Any thread.
  void watch(bench::load_client* c) {
    std::lock_guard lock(mu_);
    client_ = c;
    if (c && signalled_)
      c->stop();
  }

private:
  sigset_t set_{}, old_{};
  std::mutex mu_;
  bool done_ = false, signalled_ = false;
  bench::load_client* client_ = nullptr;
  std::thread thread_;
};

void run(const bench_serve_args& a) {
  // -- options ------------------------------------------------------------------
  bench::server_address server;
  try {
    server = bench::parse_url(a.url);
  } catch (const std::invalid_argument& e) {
    throw command_error(std::string("--url: ") + e.what(), usage_error);
  }
  if (!a.allow_remote && !bench::is_loopback_host(server.host))
    throw command_error("--url: " + server.host + " is not a loopback address; pass "
                          "--allow-remote to load a remote server",
                        usage_error);
  bench::api_endpoint endpoint;
  if (a.endpoint == "completions")
    endpoint = bench::api_endpoint::completions;
  else if (a.endpoint == "chat")
    endpoint = bench::api_endpoint::chat;
  else
    throw command_error("--endpoint: '" + a.endpoint + "' is not completions or chat",
                        usage_error);
  const double scale = parse_number("--rate-scale", a.rate_scale, false);
  const double timeout = parse_number("--timeout-s", a.timeout_s, false);
  // Optional numbers: absent = 0 (no bound / no objective) unless said.
  auto optional_number = [](const char* option, const std::string& text, double absent) {
    return text.empty() ? absent : parse_number(option, text, false);
  };
  auto optional_count = [](const char* option, const std::string& text) {
    return text.empty() ? int64_t{0} : parse_count(option, text);
  };
  const double drain = a.drain_timeout_s.empty()
                         ? timeout
                         : parse_number("--drain-timeout-s", a.drain_timeout_s, true);
  const int64_t max_requests = optional_count("--max-requests", a.max_requests);
  const double duration = optional_number("--duration", a.duration, 0);
  const int64_t max_concurrency = optional_count("--max-concurrency", a.max_concurrency);
  const double slo_ttft = optional_number("--slo-ttft-ms", a.slo_ttft_ms, 0);
  const double slo_tpot = optional_number("--slo-tpot-ms", a.slo_tpot_ms, 0);
  if (a.tokenizer.empty())
    throw command_error("--tokenizer DIR is required (the served model's Hugging Face folder or "
                        "one with its tokenizer.json)",
                        usage_error);
  const fs::path corpus = a.corpus.empty() ? bench::default_corpus_path() : fs::path(a.corpus);
  if (!fs::exists(corpus))
    throw command_error("--corpus: " + corpus.string() + ": no such file", usage_error);

  signal_watch signals;

  // -- the requests -------------------------------------------------------------
  sim::trace t = load_requests(a);
  std::vector<bench::load_request> requests;
  for (const auto& r : t.requests) {
    const double at = r.arrival_s / scale;
    if ((duration > 0 && at >= duration)
        || (max_requests > 0 && int64_t(requests.size()) >= max_requests))
      break;
    bench::load_request q;
    q.arrival_s = at;
    q.prompt_tokens = r.prompt_tokens;
    q.max_tokens = std::max(r.output_tokens, 1);
    requests.push_back(std::move(q));
  }
  if (requests.empty())
    throw command_error((a.trace.empty() ? "--workload" : "--trace " + a.trace)
                          + ": no requests within the bounds",
                        usage_error);

  std::shared_ptr<const tokenizer> tok;
  try {
    tok = tokenizer::load(a.tokenizer);
  } catch (const std::exception& e) {
    throw command_error(std::string("--tokenizer: ") + e.what(), usage_error);
  }
  // Only as much corpus as the prompts need (about 4 bytes a token, twice
  // over): encoding all of a large corpus would take longer than the run.
  int64_t first_offset = 0;
  if (!a.corpus_offset.empty()) {
    size_t used = 0;
    try {
      first_offset = std::stoll(a.corpus_offset, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != a.corpus_offset.size() || first_offset < 0)
      throw command_error("--corpus-offset: '" + a.corpus_offset + "' is not a whole number >= 0",
                          usage_error);
  }
  int64_t needed = first_offset;
  for (const auto& q : requests)
    needed += q.prompt_tokens;
  const size_t max_bytes = size_t(std::min<int64_t>(needed, int64_t(1) << 26)) * 8 + (1 << 16);
  std::optional<bench::prompt_builder> builder;
  try {
    builder.emplace(bench::prompt_builder::from_file(
      tok, corpus, endpoint == bench::api_endpoint::completions, max_bytes));
  } catch (const std::exception& e) {
    throw command_error(std::string("--corpus: ") + e.what(), usage_error);
  }
  int64_t offset = first_offset;
  for (auto& q : requests) {
    try {
      auto p = builder->make(q.prompt_tokens, offset);
      q.prompt = std::move(p.text);
      q.prompt_tokens = p.tokens;
    } catch (const std::exception& e) {
      throw command_error(std::string("--corpus: ") + e.what());
    }
    offset += q.prompt_tokens;
  }

  std::string model = a.model;
  if (model.empty()) {
    try {
      model = bench::first_model(server, std::min(timeout, 30.0), a.api_key);
    } catch (const std::exception& e) {
      throw command_error(std::string("--url: ") + e.what()
                          + " (is the server up? or pass --model)");
    }
  }

  // -- the run ------------------------------------------------------------------
  const bool show_progress = !a.quiet && isatty(STDERR_FILENO);
  auto bar = std::make_shared<progress_bar>();
  bench::load_options o;
  o.server = server;
  o.endpoint = endpoint;
  o.model = model;
  o.api_key = a.api_key;
  o.timeout_s = timeout;
  o.max_concurrency = int32_t(std::min<int64_t>(max_concurrency, INT32_MAX));
  o.drain_timeout_s = drain;
  if (show_progress)
    o.on_progress = [bar](const bench::load_progress& p) { bar->draw(p, p.finished == p.total); };
  if (!a.quiet)
    std::fprintf(stderr, "bench-serve: %zu requests to %s (%s, model %s) over %.1f s\n",
                 requests.size(), a.url.c_str(), a.endpoint.c_str(), model.c_str(),
                 requests.back().arrival_s);
  o.stop_on_signals = false; // signal_watch owns them
  bench::load_client client(o);
  signals.watch(&client);
  const auto start = std::chrono::steady_clock::now();
  std::vector<bench::request_result> results;
  try {
    results = client.run(requests);
  } catch (const std::exception& e) {
    signals.watch(nullptr);
    throw command_error(std::string("--url: ") + e.what());
  }
  signals.watch(nullptr);
  if (show_progress)
    std::fprintf(stderr, "\n");

  // -- the report ---------------------------------------------------------------
  bench::bench_run_info info;
  info.label = a.label;
  info.trace_name = t.name;
  info.rate_scale = scale;
  info.url = a.url;
  info.model = model;
  info.endpoint = endpoint;
  info.max_concurrency = o.max_concurrency;
  info.timeout_s = timeout;
  info.slo_ttft_ms = slo_ttft;
  info.slo_tpot_ms = slo_tpot;
  info.interrupted = client.stopped();
  info.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto report = bench::make_bench_report(results, info);
  if (!a.report.empty()) {
    std::ofstream out(a.report);
    if (!out)
      throw command_error("--report: cannot write " + a.report);
    // Error texts come from servers: replace invalid UTF-8 rather than lose
    // the report.
    out << report.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  if (!a.plot.empty()) {
    std::ofstream svg(a.plot);
    if (!svg)
      throw command_error("--plot: cannot write " + a.plot);
    svg << sim::render_svg(bench::bench_panels(results, info));
  }
  if (!a.requests_csv.empty()) {
    std::ofstream csv(a.requests_csv);
    if (!csv)
      throw command_error("--requests-csv: cannot write " + a.requests_csv);
    csv << bench::requests_csv(results);
  }
  if (!a.quiet)
    print_summary(report);
  if (info.interrupted)
    std::fprintf(stderr, "bench-serve: interrupted; the report covers what was sent\n");
}

void setup(CLI::App& app) {
  auto a = std::make_shared<bench_serve_args>();
  auto* cmd = app.add_subcommand("bench-serve", "Load-test an OpenAI-compatible server with a "
                                                "trace or a synthetic workload (open loop)");
  cmd->add_option("--url", a->url, "Server base URL, http://HOST:PORT")->type_name("URL");
  cmd->add_flag("--allow-remote", a->allow_remote, "Allow a host that is not loopback");
  cmd->add_option("--endpoint", a->endpoint, "API route to load")
    ->type_name("{completions,chat}");
  cmd->add_option("--model", a->model, "Model name (unset: the first of GET /v1/models)");
  cmd->add_option("--api-key", a->api_key, "Sent as Authorization: Bearer KEY");
  cmd->add_option("--tokenizer", a->tokenizer,
                  "The served model's Hugging Face folder (tokenizer.json): prompts are cut to "
                  "exact token counts with it (required)")
    ->type_name("PATH");
  cmd->add_option("--corpus", a->corpus, "Text to cut prompts from (unset: "
                                         "shared/testdata/corpora/moby_dick.txt)")
    ->type_name("PATH");
  cmd->add_option("--trace", a->trace, "Trace file (Azure CSV, Mooncake JSONL or simple CSV)")
    ->type_name("PATH");
  cmd->add_option("--format", a->format, "Trace format (unset: from the file)")
    ->type_name("{azure,mooncake,csv}");
  cmd->add_option("--workload", a->workload,
                  "Synthetic workload instead of --trace, e.g. "
                  "poisson:rate=20,prompt=uniform:130:900,output=uniform:64:448,n=500,seed=1")
    ->type_name("SPEC");
  cmd->add_option("--corpus-offset", a->corpus_offset,
                  "Token of the corpus the first prompt starts at; runs against one server "
                  "with different offsets share no prompt prefix")
    ->type_name("INT")
    ->default_str("0");
  cmd->add_option("--rate-scale", a->rate_scale, "Arrival rate multiplier: arrivals at trace "
                                                 "time / scale")
    ->type_name("FLOAT");
  cmd->add_option("--max-requests", a->max_requests, "Send at most N requests")
    ->type_name("INT");
  cmd->add_option("--duration", a->duration, "Send only arrivals in the first S seconds")
    ->type_name("FLOAT");
  cmd->add_option("--max-concurrency", a->max_concurrency,
                  "At most N requests in flight; later arrivals wait (unset: no cap)")
    ->type_name("INT");
  cmd->add_option("--timeout-s", a->timeout_s, "Per-request deadline, connect to last byte")
    ->type_name("FLOAT");
  cmd->add_option("--drain-timeout-s", a->drain_timeout_s,
                  "After the last arrival, abort requests still running after S seconds "
                  "(unset: --timeout-s)")
    ->type_name("FLOAT");
  cmd->add_option("--slo-ttft-ms", a->slo_ttft_ms, "TTFT objective for attainment and goodput")
    ->type_name("FLOAT");
  cmd->add_option("--slo-tpot-ms", a->slo_tpot_ms, "TPOT objective for attainment and goodput")
    ->type_name("FLOAT");
  cmd->add_option("--report", a->report, "Where to write the JSON report")->type_name("PATH");
  cmd->add_option("--plot", a->plot, "Where to write SVG plots (e2e, TTFT, ITL, TPOT CDFs)")
    ->type_name("PATH");
  cmd->add_option("--requests-csv", a->requests_csv, "Where to write one CSV row per request")
    ->type_name("PATH");
  cmd->add_option("--label", a->label, "The report's \"policy\"");
  cmd->add_flag("--quiet", a->quiet, "No progress bar and no summary");
  cmd->callback([a] { run(*a); });
}

const int registered = register_command(65, &setup);

} // namespace

} // namespace metronome::cli
