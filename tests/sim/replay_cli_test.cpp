// `metronome replay` as a user runs it: reports, sweeps with the comparison
// against fcfs, SVG plots, the printed summary (units, legend, refused
// requests, a progress bar only on a terminal), and clear errors.

#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/model/test_support.hpp"
#include "tests/test_env.hpp"

namespace metronome {
namespace {

class replay_cli : public ::testing::Test {
protected:
  std::filesystem::path dir = test::scratch_dir("replay-cli-" + std::to_string(::getpid()));

  std::string write_trace() {
    auto path = dir / "trace.csv";
    std::ofstream out(path);
    out << "arrival_s,prompt_tokens,output_tokens\n";
    for (int i = 0; i < 60; ++i)
      out << i * 0.02 << "," << (i % 3 ? 200 : 3000) << "," << (i % 5 ? 8 : 40) << "\n";
    return path.string();
  }

  test::command_result replay(const std::string& args) {
    return test::run_command(test::shell_quote(test::env("BIN")) + " replay " + args);
  }

  nlohmann::json read_json(const std::filesystem::path& p) {
    std::ifstream in(p);
    return nlohmann::json::parse(in);
  }

  /// 20 requests, the 8th with a prompt of 200,000 tokens: longer than the
  /// default cost model's context (131,072), so the scheduler refuses it.
  std::string write_trace_with_a_too_long_request() {
    auto path = dir / "too_long.csv";
    std::ofstream out(path);
    out << "arrival_s,prompt_tokens,output_tokens\n";
    for (int i = 0; i < 20; ++i)
      out << i * 0.02 << "," << (i == 7 ? 200000 : 300) << ",12\n";
    return path.string();
  }

  static std::string read_text(const std::filesystem::path& p) {
    std::ifstream in(p);
    return {std::istreambuf_iterator<char>(in), {}};
  }

  /// The lines of `text`.
  static std::vector<std::string> lines(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
      out.push_back(line);
    return out;
  }

  /// {series label: "stroke|dasharray"} of the plotted lines in `svg`, and
  /// the same of the legend entries under "legend:" + label; fails the test
  /// when one label is drawn two ways.
  static std::map<std::string, std::string> styles(const std::string& svg) {
    std::map<std::string, std::string> out;
    static const std::regex element(R"re(<(path|line) data-(series|legend)="([^"]*)"[^>]*>)re");
    static const std::regex stroke(R"re( stroke="([^"]*)")re");
    static const std::regex dash(R"re( stroke-dasharray="([^"]*)")re");
    for (std::sregex_iterator it(svg.begin(), svg.end(), element), end; it != end; ++it) {
      const std::string tag = (*it)[0].str();
      std::smatch m;
      std::string style;
      if (std::regex_search(tag, m, stroke))
        style = m[1].str();
      style += "|";
      if (std::regex_search(tag, m, dash))
        style += m[1].str();
      const std::string key = ((*it)[2] == "legend" ? "legend:" : "") + (*it)[3].str();
      auto [at, added] = out.emplace(key, style);
      EXPECT_EQ(at->second, style) << key << " is drawn two ways";
    }
    return out;
  }
};

TEST_F(replay_cli, one_policy_writes_a_flat_report) {
  auto report = dir / "one.json";
  auto r = replay("--trace " + write_trace() + " --policy ladb --report " + report.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = read_json(report);
  EXPECT_EQ(j["policy"], "ladb");
  EXPECT_EQ(j["requests"], 60);
  EXPECT_TRUE(j["ttft_ms"].contains("p95"));
  EXPECT_NE(r.output.find("ladb"), std::string::npos) << "prints a table";
}

TEST_F(replay_cli, a_sweep_compares_every_policy_with_fcfs_and_plots) {
  auto report = dir / "sweep.json";
  auto plot = dir / "sweep.svg";
  auto r = replay("--trace " + write_trace() + " --format csv --policy all --rate-scale 1,2 "
                  "--report " + report.string() + " --plot " + plot.string() + " --quiet");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(r.output.empty()) << r.output;
  auto j = read_json(report);
  ASSERT_EQ(j["runs"].size(), 6u);
  EXPECT_EQ(j["runs"][0]["policy"], "fcfs");
  EXPECT_EQ(j["runs"][5]["rate_scale"], 2);
  ASSERT_EQ(j["comparison"].size(), 2u);
  for (const char* p : {"ladb", "srpt"}) {
    const auto& c = j["comparison"][0]["vs_fcfs"][p];
    for (const char* key : {"p95_e2e_vs_fcfs", "p95_ttft_vs_fcfs", "throughput_vs_fcfs",
                            "worst_decile_slowdown_vs_fcfs", "targets_met"})
      EXPECT_TRUE(c.contains(key)) << p << " " << key;
  }
  std::ifstream svg(plot);
  std::string text((std::istreambuf_iterator<char>(svg)), {});
  EXPECT_EQ(text.rfind("<svg", 0), 0u);
  EXPECT_NE(text.find("P95 E2E latency against load"), std::string::npos);
  EXPECT_NE(text.find("E2E latency CDF"), std::string::npos);
}

TEST_F(replay_cli, the_summary_counts_refused_requests_in_the_table_and_the_report) {
  auto report = dir / "refused.json";
  auto r = replay("--trace " + write_trace_with_a_too_long_request()
                  + " --policy fcfs --report " + report.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = read_json(report);
  EXPECT_EQ(j["refused"], 1);
  EXPECT_EQ(j["refused_by_reason"], nlohmann::json({{"too_long", 1}}));
  EXPECT_EQ(j["requests"], 19);
  // The table's refused column (last) and the reasons under the table.
  bool row = false;
  for (const auto& line : lines(r.output))
    if (line.starts_with("fcfs ")) {
      row = true;
      EXPECT_TRUE(line.ends_with(" 1")) << "refused column: " << line;
    }
  EXPECT_TRUE(row) << r.output;
  EXPECT_NE(r.output.find("fcfs x1: 1 of 20 requests refused (too_long 1)"), std::string::npos)
    << r.output;

  // None refused: 0 in the column, {} in the report, no reasons line.
  auto clean = dir / "clean.json";
  r = replay("--trace " + write_trace() + " --policy fcfs --report " + clean.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  j = read_json(clean);
  EXPECT_EQ(j["refused"], 0);
  EXPECT_EQ(j["refused_by_reason"], nlohmann::json::object());
  EXPECT_EQ(r.output.find("requests refused ("), std::string::npos) << r.output;
}

TEST_F(replay_cli, the_summary_gives_every_figure_a_unit_and_explains_the_columns) {
  auto r = replay("--trace " + write_trace() + " --policy fcfs,ladb --report "
                  + (dir / "units.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto out = lines(r.output);
  // The header names the columns, the next line their units.
  size_t header = out.size();
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].starts_with("policy "))
      header = i;
  ASSERT_LT(header + 1, out.size()) << r.output;
  std::istringstream names(out[header]), units(out[header + 1]);
  std::vector<std::string> n{std::istream_iterator<std::string>(names), {}};
  std::vector<std::string> u{std::istream_iterator<std::string>(units), {}};
  const std::vector<std::string> want_names{"policy", "rate",  "ttft50", "ttft95", "ttft99",
                                            "e2e50",  "e2e95", "e2e99",  "tok/s",  "slow10",
                                            "cached", "refused"};
  const std::vector<std::string> want_units{"x",  "ms",    "ms", "ms", "ms",      "ms",
                                            "ms", "tok/s", "x",  "%",  "requests"};
  EXPECT_EQ(n, want_names) << out[header];
  EXPECT_EQ(u, want_units) << "every column but the policy's has a unit: " << out[header + 1];
  // The first line's duration, and a legend line for every column.
  EXPECT_TRUE(std::regex_search(r.output, std::regex(": 60 requests over [0-9.]+ s, cost model ")))
    << r.output;
  for (const char* legend : {"rate     ", "ttftNN   ", "e2eNN    ", "tok/s    ", "slow10   ",
                             "cached   ", "refused  "}) {
    bool found = false;
    for (const auto& line : out)
      found = found || line.starts_with(legend);
    EXPECT_TRUE(found) << "no legend line for '" << legend << "'\n" << r.output;
  }
  EXPECT_NE(r.output.find("NNth percentile (ms)"), std::string::npos) << r.output;
}

TEST_F(replay_cli, no_progress_bar_when_stderr_is_not_a_terminal) {
  // run_command reads stdout and stderr through a pipe, as a log would.
  auto r = replay("--trace " + write_trace() + " --policy all --rate-scale 1,2 --report "
                  + (dir / "pipe.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("runs, "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[="), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("6 replays in"), std::string::npos) << "still a summary: " << r.output;
}

TEST_F(replay_cli, a_progress_bar_when_stderr_is_a_terminal) {
  // script(1) runs the command on a pseudo-terminal.
  if (test::run_command("command -v script").exit_code != 0)
    GTEST_SKIP() << "no script(1) to give the command a terminal";
  const std::string cmd = test::shell_quote(test::env("BIN")) + " replay --trace "
                          + write_trace() + " --policy fcfs,ladb --report "
                          + (dir / "tty.json").string();
  auto r = test::run_command("script -qec " + test::shell_quote(cmd) + " /dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\r["), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("100% 120/120 requests, 2/2 runs, "), std::string::npos) << r.output;
  // --quiet: nothing, terminal or not.
  auto q = test::run_command("script -qec " + test::shell_quote(cmd + " --quiet") + " /dev/null");
  ASSERT_EQ(q.exit_code, 0) << q.output;
  EXPECT_TRUE(q.output.empty()) << q.output;
}

TEST_F(replay_cli, each_policy_keeps_its_colour_and_dash_whatever_the_order) {
  auto plot = [&](const std::string& policies) {
    auto svg = dir / ("order-" + policies + ".svg");
    auto r = replay("--trace " + write_trace() + " --policy " + policies
                    + " --rate-scale 1,2 --quiet --report " + (dir / "order.json").string()
                    + " --plot " + svg.string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return styles(read_text(svg));
  };
  const auto a = plot("fcfs,ladb,srpt");
  const auto b = plot("srpt,fcfs,ladb");
  const auto c = plot("ladb");
  EXPECT_EQ(a, b);
  ASSERT_TRUE(a.contains("ladb"));
  EXPECT_EQ(c.at("ladb"), a.at("ladb")) << "alone or with others";
  for (const char* p : {"fcfs", "ladb", "srpt"})
    EXPECT_EQ(a.at(p), a.at(std::string("legend:") + p)) << p << ": the legend matches the line";
  EXPECT_NE(a.at("fcfs"), a.at("ladb"));
  EXPECT_NE(a.at("ladb"), a.at("srpt"));
}

TEST_F(replay_cli, bad_input_gets_a_message_naming_it) {
  auto bad = dir / "bad.csv";
  std::ofstream(bad) << "arrival_s,prompt_tokens,output_tokens\n0,ten,5\n";
  auto r = replay("--trace " + bad.string() + " --policy fcfs --report " + (dir / "x.json").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(bad.string() + ":2: prompt_tokens: 'ten' is not an integer"),
            std::string::npos)
    << r.output;
  r = replay("--trace " + write_trace() + " --policy lifo --report " + (dir / "x.json").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("unknown policy 'lifo'"), std::string::npos) << r.output;
  r = replay("--trace " + write_trace() + " --format tsv --policy fcfs --report x.json");
  EXPECT_NE(r.output.find("--format: 'tsv' is not azure, mooncake or csv"), std::string::npos);
  r = replay("--trace " + write_trace() + " --policy fcfs --rate-scale 0 --report x.json");
  EXPECT_NE(r.output.find("--rate-scale: '0' is not a positive number"), std::string::npos);
  r = replay("--trace " + write_trace() + " --policy fcfs --cost-model /nonexistent.json "
             "--report x.json");
  EXPECT_NE(r.output.find("/nonexistent.json: cannot open the cost model"), std::string::npos);
  r = replay("--trace " + write_trace() + " --policy fcfs --set ladb.bogus=1 --report x.json");
  EXPECT_NE(r.output.find("--set ladb.bogus: unknown key"), std::string::npos) << r.output;
  r = replay("--trace " + write_trace() + " --policy fcfs --set engine.max_batch_size=0 "
             "--report x.json");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("engine.max_batch_size"), std::string::npos) << r.output;
}

TEST_F(replay_cli, one_replica_gives_the_report_of_the_replay_before_replicas) {
  // tests/sim/data/replay_one_replica.json holds the reports of these runs
  // as the replay wrote them before it modelled replicas (commit 83512ed):
  // with one replica, flag or none, every key it had keeps its value.
  // After a deliberate change of the scheduler, the policies or the cost
  // model, regenerate it with tests/sim/data/README.md's command.
  const auto golden
    = read_json(test::env("SOURCE_DIR") + "/tests/sim/data/replay_one_replica.json");
  const std::string traces = test::env("TESTDATA") + "/traces/";
  for (const char* flag : {"", " --replicas 1"}) {
    nlohmann::json got;
    for (const auto& [name, args] : std::map<std::string, std::string>{
           {"azure", "--trace " + traces + "AzureLLMInferenceTrace_code.csv --policy all "
                     "--rate-scale 0.5"},
           {"mooncake", "--trace " + traces + "synthetic_trace.jsonl --policy ladb "
                        "--rate-scale 0.1"}}) {
      const auto report = dir / (name + ".json");
      auto r = replay(args + flag + " --quiet --report " + report.string());
      ASSERT_EQ(r.exit_code, 0) << r.output;
      auto j = read_json(report);
      auto& runs = j.contains("runs") ? j["runs"] : j;
      for (auto& run : runs.is_array() ? runs : nlohmann::json::array({runs}))
        EXPECT_EQ(run["replicas"], 1) << name;
      got[name] = j;
    }
    // The new keys, then the rest against the golden reports.
    auto strip = [](nlohmann::json& run) {
      EXPECT_EQ(run["per_replica"].size(), 1u);
      EXPECT_EQ(run["per_replica"][0]["busy_fraction"], run["busy_fraction"]);
      run.erase("replicas");
      run.erase("per_replica");
      // Newer still: the scheduling events and token groups (off here).
      EXPECT_EQ(run["token_groups"], "");
      EXPECT_EQ(run["scheduling_events"]["group_admission"], 0);
      run.erase("scheduling_events");
      run.erase("token_groups");
    };
    for (auto& run : got["azure"]["runs"])
      strip(run);
    strip(got["mooncake"]);
    const auto diff = nlohmann::json::diff(golden, got);
    EXPECT_TRUE(diff.empty()) << "flag '" << flag << "': " << diff.dump(1);
  }
}

TEST_F(replay_cli, several_replicas_are_reported_with_what_each_did) {
  auto report = dir / "replicas.json";
  auto r = replay("--trace " + write_trace() + " --policy fcfs --replicas 3 --report "
                  + report.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(", 3 replicas behind the router"), std::string::npos) << r.output;
  auto j = read_json(report);
  EXPECT_EQ(j["replicas"], 3);
  EXPECT_EQ(j["requests"], 60) << "latencies over all requests";
  ASSERT_EQ(j["per_replica"].size(), 3u);
  int64_t placed = 0, produced = 0;
  for (const auto& p : j["per_replica"]) {
    for (const char* key : {"replica", "placed", "refused", "prompt_tokens", "output_tokens",
                            "steps", "preemptions", "prefix_cache_hits", "busy_fraction"})
      EXPECT_TRUE(p.contains(key)) << key;
    placed += p["placed"].get<int64_t>();
    produced += p["output_tokens"].get<int64_t>();
  }
  EXPECT_EQ(placed, 60);
  EXPECT_GT(produced, 0);
}

TEST_F(replay_cli, a_bad_replica_count_is_refused_naming_the_flag) {
  for (const char* bad : {"0", "-1", "two", "65", "2.5", "1e1", "+2", "99999999999"}) {
    auto r = replay("--trace " + write_trace() + " --policy fcfs --replicas " + bad
                    + " --report " + (dir / "bad.json").string());
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.output.find(std::string("--replicas: '") + bad
                            + "' is not a whole number from 1 to 64"),
              std::string::npos)
      << bad << ": " << r.output;
  }
  auto r = replay("--trace " + write_trace() + " --policy fcfs --replicas 64 --quiet --report "
                  + (dir / "most.json").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

} // namespace
} // namespace metronome
