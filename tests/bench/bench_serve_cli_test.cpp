// `metronome bench-serve` end to end: a real `metronome serve` (tiny
// Llama-3 on the CPU, started once for the suite on a free port) loaded
// with a short synthetic workload, a short CSV trace and the chat
// endpoint; then the refusals and option errors that need no server.

#include <csignal>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bench/serve/load_client.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

/// `metronome serve --port 0` in a child process; the port is read from
/// the line it prints when it listens.
class server_process {
public:
  server_process() {
    const auto model = test::served_model("tiny-llama3", "llama3");
    const auto log = test::scratch_dir("bench-serve-server-" + std::to_string(::getpid()))
                     / "serve.log";
    log_path_ = log.string();
    const std::string cmd = "exec " + test::shell_quote(test::env("BIN")) + " serve --model "
                            + test::shell_quote(model.string())
                            + " --host 127.0.0.1 --port 0 --served-model-name tiny > "
                            + test::shell_quote(log_path_) + " 2>&1";
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Up to 60 s for the line "... on http://127.0.0.1:PORT ...".
    for (int i = 0; i < 600 && port_ == 0; ++i) {
      ::usleep(100'000);
      std::ifstream in(log_path_);
      std::string text((std::istreambuf_iterator<char>(in)), {});
      const auto at = text.find("on http://127.0.0.1:");
      if (at != std::string::npos)
        port_ = std::atoi(text.c_str() + at + std::strlen("on http://127.0.0.1:"));
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
    }
  }

  ~server_process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }

  int port() const {
    return port_;
  }

  std::string log() const {
    std::ifstream in(log_path_);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }

private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_path_;
};

/// The sum of a Prometheus counter family's samples.
double counter_sum(const std::string& metrics, const std::string& name) {
  double sum = 0;
  std::istringstream in(metrics);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with(name + "{") || line.starts_with(name + " "))
      sum += std::atof(line.c_str() + line.rfind(' ') + 1);
  return sum;
}

/// Every key of a replay report (sim/report.cpp make_report) and the live
/// run's own.
const char* const report_keys[] = {
  "policy", "trace", "rate_scale", "requests", "refused", "refused_by_reason",
  "throughput_tokens_per_s", "total_tokens_per_s", "makespan_s", "ttft_ms", "itl_ms", "e2e_ms",
  "queue_ms", "p95_over_p50",
  "unloaded", "e2e_p95_over_unloaded_p95", "steps", "mean_batch_size", "batch_efficiency",
  "busy_fraction", "preemptions", "longest_wait_ms", "slowdown_by_output_decile", "predictor",
  "supervisor", "engine", "cost_model", "prefix_cache_queries", "prefix_cache_hits",
  "prefix_cache_hit_rate",
  // bench-serve's own
  "tpot_ms", "sent", "succeeded", "failed", "interrupted", "not_sent", "partial",
  "request_throughput_per_s", "wall_s", "slo", "goodput", "prompt_tokens", "errors", "server",
  "client"};

struct csv_row {
  std::map<std::string, std::string> cells;
  double num(const std::string& k) const {
    return std::atof(cells.at(k).c_str());
  }
};

std::vector<csv_row> read_csv(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  std::vector<std::string> header;
  std::istringstream h(line);
  for (std::string c; std::getline(h, c, ',');)
    header.push_back(c);
  std::vector<csv_row> rows;
  while (std::getline(in, line)) {
    csv_row r;
    std::istringstream l(line);
    std::string c;
    for (size_t i = 0; i < header.size() && std::getline(l, c, ','); ++i)
      r.cells[header[i]] = c;
    rows.push_back(std::move(r));
  }
  return rows;
}

class bench_serve_cli : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    server_ = new server_process();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  void SetUp() override {
    ASSERT_GT(server_->port(), 0) << "metronome serve did not start:\n" << server_->log();
  }

  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(server_->port());
  }

  std::string metrics() const {
    bench::server_address a;
    a.port = uint16_t(server_->port());
    return bench::http_get(a, "/metrics", 10).body;
  }

  test::command_result bench(const std::string& args) const {
    return test::run_command(test::shell_quote(test::env("BIN")) + " bench-serve --url " + url()
                             + " --tokenizer "
                             + test::shell_quote(test::env("TESTDATA") + "/tokenizers/llama3")
                             + " " + args);
  }

  nlohmann::json read_json(const std::filesystem::path& p) const {
    std::ifstream in(p);
    return nlohmann::json::parse(in);
  }

  /// The checks every successful run must pass.
  void expect_all_succeeded(const nlohmann::json& j, const std::vector<csv_row>& rows, size_t n,
                            bool exact_prompts) {
    for (const char* key : report_keys)
      EXPECT_TRUE(j.contains(key)) << key;
    EXPECT_EQ(j["requests"], n);
    EXPECT_EQ(j["sent"], n);
    EXPECT_EQ(j["succeeded"], n);
    EXPECT_EQ(j["failed"], 0) << j["errors"].dump();
    EXPECT_EQ(j["partial"], false);
    for (const char* key : {"ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "queue_ms"})
      for (const char* p : {"p50", "p95", "p99", "mean"})
        EXPECT_TRUE(j[key].contains(p)) << key << " " << p;
    EXPECT_GT(j["itl_ms"]["p50"].get<double>(), 0) << "inter-token gaps were measured";
    EXPECT_GT(j["throughput_tokens_per_s"].get<double>(), 0);
    EXPECT_EQ(j["steps"], nullptr) << "simulator-only keys are null";
    ASSERT_EQ(rows.size(), n);
    for (const auto& r : rows) {
      EXPECT_EQ(r.cells.at("outcome"), "ok") << r.cells.at("error");
      EXPECT_EQ(r.cells.at("http_status"), "200");
      EXPECT_EQ(r.cells.at("output_tokens"), r.cells.at("max_tokens")) << "ignore_eos";
      EXPECT_GE(r.num("content_chunks"), 1);
      EXPECT_GT(r.num("ttft_s"), 0);
      EXPECT_LT(r.num("ttft_s"), r.num("e2e_s"));
      if (exact_prompts) {
        EXPECT_EQ(r.cells.at("server_prompt_tokens"), r.cells.at("prompt_tokens"))
          << "the prompt has the trace's exact token count";
      }
    }
  }

  static server_process* server_;
};

server_process* bench_serve_cli::server_ = nullptr;

TEST_F(bench_serve_cli, a_synthetic_workload_runs_and_reports_every_key) {
  const auto dir = test::scratch_dir("bench-serve-workload-" + std::to_string(::getpid()));
  const double before = counter_sum(metrics(), "metronome:request_success_total");
  const auto r
    = bench("--workload poisson:rate=20,prompt=uniform:20:80,output=uniform:4:12,n=12,seed=3 "
            "--slo-ttft-ms 60000 --slo-tpot-ms 60000 --report " + (dir / "r.json").string()
            + " --requests-csv " + (dir / "r.csv").string() + " --plot "
            + (dir / "p.svg").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ttft"), std::string::npos) << "prints a summary";
  const auto j = read_json(dir / "r.json");
  expect_all_succeeded(j, read_csv(dir / "r.csv"), 12, true);
  EXPECT_EQ(j["server"]["model"], "tiny") << "taken from GET /v1/models";
  EXPECT_EQ(j["slo"]["attainment"], 1.0);
  EXPECT_GT(j["goodput"]["requests_per_s"].get<double>(), 0);
  EXPECT_EQ(j["prompt_tokens"]["mismatched_requests"], 0);
  double after = before;
  for (int i = 0; i < 50 && after - before < 12; ++i) { // metrics may trail the responses
    after = counter_sum(metrics(), "metronome:request_success_total");
    if (after - before < 12)
      ::usleep(100'000);
  }
  EXPECT_EQ(after - before, 12) << "the server's /metrics count the requests";
  std::ifstream svg(dir / "p.svg");
  std::string text((std::istreambuf_iterator<char>(svg)), {});
  EXPECT_EQ(text.rfind("<svg", 0), 0u);
  EXPECT_NE(text.find("TTFT CDF"), std::string::npos);
}

TEST_F(bench_serve_cli, a_corpus_offset_keeps_a_repeated_workload_out_of_the_prefix_cache) {
  // The same workload three times: at a fresh offset, again at that offset
  // (the server's prefix cache serves the repeated prompts), and at another
  // offset (nothing of it is cached).
  const std::string w = "--workload constant:rate=50,prompt=fixed:96,output=fixed:2,n=6 "
                        "--quiet --corpus-offset ";
  auto hits_of = [&](const std::string& offset) {
    const double before = counter_sum(metrics(), "metronome:prefix_cache_hits_total");
    const auto r = bench(w + offset);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return counter_sum(metrics(), "metronome:prefix_cache_hits_total") - before;
  };
  hits_of("7000");
  EXPECT_GE(hits_of("7000"), 6 * 80) << "the same prompts again: their full pages are cached";
  EXPECT_LT(hits_of("23000"), 6 * 16) << "another stretch of the corpus shares no prefix";
}

TEST_F(bench_serve_cli, a_csv_trace_with_one_request_too_long_records_the_failure) {
  const auto dir = test::scratch_dir("bench-serve-trace-" + std::to_string(::getpid()));
  {
    std::ofstream t(dir / "trace.csv");
    t << "arrival_s,prompt_tokens,output_tokens\n";
    for (int i = 0; i < 8; ++i)
      t << i * 0.1 << "," << 16 + 9 * i << "," << 3 + i % 4 << "\n";
    t << "0.45,5000,4\n"; // beyond the tiny model's 4096-token context: HTTP 400
  }
  const auto r = bench("--trace " + (dir / "trace.csv").string() + " --rate-scale 2 "
                       "--max-concurrency 4 --quiet --report " + (dir / "r.json").string()
                       + " --requests-csv " + (dir / "r.csv").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(r.output.empty()) << r.output;
  const auto j = read_json(dir / "r.json");
  EXPECT_EQ(j["sent"], 9);
  EXPECT_EQ(j["succeeded"], 8);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["refused"], 1) << "an HTTP error counts as refused, as in replay";
  EXPECT_EQ(j["requests"], 8);
  EXPECT_EQ(j["rate_scale"], 2);
  auto rows = read_csv(dir / "r.csv");
  ASSERT_EQ(rows.size(), 9u);
  // --max-concurrency 4: when any request was sent, at most 4 were in flight
  // (sent = arrival + queue; done = arrival + e2e).
  for (auto& a : rows) {
    if (a.num("e2e_s") < 0)
      continue;
    const double sent = a.num("arrival_s") + a.num("queue_s");
    int in_flight = 0;
    for (auto& b : rows)
      if (b.num("e2e_s") >= 0 && b.num("arrival_s") + b.num("queue_s") <= sent
          && sent < b.num("arrival_s") + b.num("e2e_s"))
        ++in_flight;
    EXPECT_LE(in_flight, 4) << "at " << sent << " s";
  }
  std::vector<csv_row> ok;
  for (auto& row : rows) {
    if (row.cells["prompt_tokens"] == "5000") {
      EXPECT_EQ(row.cells["outcome"], "failed");
      EXPECT_EQ(row.cells["http_status"], "400");
      EXPECT_NE(row.cells["error"].find("HTTP 400"), std::string::npos);
    } else {
      ok.push_back(row);
    }
    // Arrivals at trace time / 2.
    EXPECT_LT(row.num("arrival_s"), 0.4);
  }
  for (const auto& row : ok) {
    EXPECT_EQ(row.cells.at("outcome"), "ok");
    EXPECT_EQ(row.cells.at("output_tokens"), row.cells.at("max_tokens"));
    EXPECT_LT(row.num("ttft_s"), row.num("e2e_s"));
    EXPECT_EQ(row.cells.at("server_prompt_tokens"), row.cells.at("prompt_tokens"));
  }
}

TEST_F(bench_serve_cli, the_chat_endpoint_reports_the_servers_prompt_count) {
  const auto dir = test::scratch_dir("bench-serve-chat-" + std::to_string(::getpid()));
  const auto r = bench("--endpoint chat --model tiny --workload "
                       "constant:rate=10,prompt=fixed:30,output=fixed:5,n=3 --quiet --report "
                       + (dir / "r.json").string() + " --requests-csv " + (dir / "r.csv").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = read_json(dir / "r.json");
  expect_all_succeeded(j, read_csv(dir / "r.csv"), 3, false);
  EXPECT_EQ(j["server"]["endpoint"], "chat");
  EXPECT_GT(j["prompt_tokens"]["server"].get<int64_t>(), j["prompt_tokens"]["built"].get<int64_t>())
    << "the chat template adds tokens";
}

TEST_F(bench_serve_cli, ctrl_c_stops_sending_and_writes_a_partial_report) {
  const auto dir = test::scratch_dir("bench-serve-int-" + std::to_string(::getpid()));
  // Long outputs at 2/s; SIGINT 1.6 s after the run starts (its first line
  // on stderr), when 3 or 4 requests are streaming: not at a fixed time, which
  // on a loaded machine can fall before the prompts are made.
  const std::string err = (dir / "err.txt").string();
  const auto r = test::run_command(
    test::shell_quote(test::env("BIN")) + " bench-serve --url " + url() + " --tokenizer "
    + test::shell_quote(test::env("TESTDATA") + "/tokenizers/llama3")
    + " --workload constant:rate=2,prompt=fixed:50,output=fixed:1500,n=20 --report "
    + (dir / "r.json").string() + " 2> " + err + " & p=$!; for i in $(seq 600); do grep -q "
    + "'requests to' " + err + " && break; sleep 0.05; done; sleep 1.6; kill -INT $p; wait $p; "
    + "cat " + err);
  ASSERT_TRUE(std::filesystem::exists(dir / "r.json")) << r.output;
  const auto j = read_json(dir / "r.json");
  EXPECT_EQ(j["partial"], true);
  EXPECT_GE(j["interrupted"].get<int>(), 1) << "the requests in flight were aborted";
  EXPECT_GE(j["not_sent"].get<int>(), 10) << "nothing was sent after Ctrl-C";
}

test::command_result bench_no_server(const std::string& args) {
  return test::run_command(test::shell_quote(test::env("BIN")) + " bench-serve " + args);
}

TEST(bench_serve_errors, a_remote_url_needs_allow_remote) {
  auto r = bench_no_server("--url http://10.11.12.13:8000 --tokenizer x --workload "
                           "poisson:rate=1,n=1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--url: 10.11.12.13 is not a loopback address; pass --allow-remote"),
            std::string::npos)
    << r.output;
  r = bench_no_server("--url https://127.0.0.1:8000 --tokenizer x --workload poisson:rate=1,n=1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("https is not supported"), std::string::npos) << r.output;
}

TEST(bench_serve_errors, malformed_options_exit_2_naming_the_option) {
  const std::string tok = test::shell_quote(test::env("TESTDATA") + "/tokenizers/llama3");
  struct bad {
    std::string args, message;
  };
  const std::vector<bad> cases = {
    {"--max-concurrency abc --workload poisson:rate=1,n=1 --tokenizer " + tok,
     "--max-concurrency: 'abc' is not a whole number >= 1"},
    {"--corpus-offset -5 --workload poisson:rate=1,n=1 --tokenizer " + tok,
     "--corpus-offset: '-5' is not a whole number >= 0"},
    {"--rate-scale 0 --workload poisson:rate=1,n=1 --tokenizer " + tok,
     "--rate-scale: '0' is not a number > 0"},
    {"--timeout-s -3 --workload poisson:rate=1,n=1 --tokenizer " + tok,
     "--timeout-s: '-3' is not a number > 0"},
    {"--endpoint embeddings --workload poisson:rate=1,n=1 --tokenizer " + tok,
     "--endpoint: 'embeddings' is not completions or chat"},
    {"--workload poisson:rate=1,n=1,prompt=zipf:3 --tokenizer " + tok,
     "--workload: prompt: unknown distribution 'zipf'"},
    {"--workload poisson:rate=1,n=1", "--tokenizer DIR is required"},
    {"--tokenizer " + tok, "give --trace FILE or --workload SPEC"},
    {"--trace /nonexistent.csv --tokenizer " + tok, "--trace: /nonexistent.csv: no such file"},
    {"--workload poisson:rate=1,n=1 --tokenizer /nonexistent-dir", "--tokenizer: "},
    {"--workload poisson:rate=1,n=1 --corpus /nonexistent.txt --tokenizer " + tok,
     "--corpus: /nonexistent.txt: no such file"},
  };
  for (const auto& c : cases) {
    auto r = bench_no_server("--url http://127.0.0.1:1 " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST(bench_serve_errors, a_server_that_is_not_there_is_a_clear_error) {
  const std::string tok = test::shell_quote(test::env("TESTDATA") + "/tokenizers/llama3");
  auto r = bench_no_server("--url http://127.0.0.1:1 --workload poisson:rate=1,n=1 --tokenizer "
                           + tok);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("GET http://127.0.0.1:1/v1/models: connect"), std::string::npos)
    << r.output;
}

} // namespace
} // namespace metronome
