// `metronome replay` as a user runs it: reports, sweeps with the comparison
// against fcfs, SVG plots, and clear errors.

#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/model/test_support.hpp"

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

} // namespace
} // namespace metronome
