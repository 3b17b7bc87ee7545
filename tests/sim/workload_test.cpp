// Synthetic workloads (sim/workload.hpp): determinism, arrival rates and
// length distributions within statistical bounds, spec errors, and
// `metronome replay --workload`.

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numbers>
#include <numeric>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "sim/workload.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

using sim::make_workload;

std::vector<double> gaps(const sim::trace& t) {
  std::vector<double> g;
  for (size_t i = 1; i < t.requests.size(); ++i)
    g.push_back(t.requests[i].arrival_s - t.requests[i - 1].arrival_s);
  return g;
}

double mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
}

double cv(const std::vector<double>& v) {
  const double m = mean(v);
  double s = 0;
  for (double x : v)
    s += (x - m) * (x - m);
  return std::sqrt(s / double(v.size() - 1)) / m;
}

std::vector<double> lengths(const sim::trace& t, bool prompt) {
  std::vector<double> out;
  for (const auto& r : t.requests)
    out.push_back(prompt ? r.prompt_tokens : r.output_tokens);
  return out;
}

std::string error_of(const std::string& spec) {
  try {
    make_workload(spec);
  } catch (const sim::workload_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(workload, is_deterministic_for_a_seed_and_differs_across_seeds) {
  const std::string spec
    = "gamma:rate=20,cv=2,prompt=lognormal:600:300,output=uniform:64:448,n=500,seed=1";
  const auto a = make_workload(spec), b = make_workload(spec);
  ASSERT_EQ(a.requests.size(), 500u);
  EXPECT_EQ(a.name, spec);
  for (size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].arrival_s, b.requests[i].arrival_s);
    EXPECT_EQ(a.requests[i].prompt_tokens, b.requests[i].prompt_tokens);
    EXPECT_EQ(a.requests[i].output_tokens, b.requests[i].output_tokens);
  }
  const auto c = make_workload(
    "gamma:rate=20,cv=2,prompt=lognormal:600:300,output=uniform:64:448,n=500,seed=2");
  EXPECT_NE(a.requests[10].arrival_s, c.requests[10].arrival_s);
  EXPECT_EQ(a.requests.front().arrival_s, 0.0);
  EXPECT_TRUE(std::is_sorted(a.requests.begin(), a.requests.end(),
                             [](auto& x, auto& y) { return x.arrival_s < y.arrival_s; }));
}

TEST(workload, lengths_and_arrivals_draw_from_separate_streams) {
  const auto a = make_workload("poisson:rate=5,n=200,prompt=fixed:100,output=fixed:10,seed=4");
  const auto b = make_workload("poisson:rate=5,n=200,prompt=uniform:1:900,output=fixed:10,seed=4");
  for (size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].arrival_s, b.requests[i].arrival_s);
    EXPECT_EQ(a.requests[i].output_tokens, b.requests[i].output_tokens);
  }
}

TEST(workload, poisson_gaps_have_the_rate_and_cv_one) {
  const int n = 40000;
  const auto t = make_workload("poisson:rate=20,n=40000,seed=11");
  const auto g = gaps(t);
  // The mean of n exponential gaps has sd (1/rate)/sqrt(n): five of those.
  EXPECT_NEAR(mean(g), 0.05, 5 * 0.05 / std::sqrt(double(n)));
  EXPECT_NEAR(cv(g), 1.0, 0.03);
}

TEST(workload, gamma_gaps_have_the_rate_and_the_requested_burstiness) {
  for (double c : {0.5, 2.0}) {
    const auto t = make_workload(fmt::format("gamma:rate=10,cv={},n=40000,seed=5", c));
    const auto g = gaps(t);
    EXPECT_NEAR(mean(g), 0.1, 5 * c * 0.1 / std::sqrt(40000.0)) << "cv " << c;
    EXPECT_NEAR(cv(g), c, 0.08 * c) << "cv " << c;
  }
  // burstiness is the gamma shape: 4 means cv 0.5.
  const auto t = make_workload("gamma:rate=10,burstiness=4,n=40000,seed=5");
  EXPECT_NEAR(cv(gaps(t)), 0.5, 0.04);
}

TEST(workload, constant_gaps_are_exact_and_duration_bounds_the_trace) {
  const auto t = make_workload("constant:rate=4,duration=10");
  ASSERT_EQ(t.requests.size(), 40u);
  for (double g : gaps(t))
    EXPECT_NEAR(g, 0.25, 1e-9);
  const auto p = make_workload("poisson:rate=10,duration=1000,seed=3");
  EXPECT_NEAR(double(p.requests.size()), 10000.0, 5 * std::sqrt(10000.0));
  EXPECT_LT(p.requests.back().arrival_s, 1000.0);
  // n and duration together: whichever ends first.
  EXPECT_EQ(make_workload("poisson:rate=10,duration=1000,n=50").requests.size(), 50u);
}

TEST(workload, diurnal_modulation_puts_more_arrivals_in_the_high_half) {
  // rate x (1 + 0.8 sin(2 pi t / 100)): the first half of each period
  // holds (50 + 80/pi) / 100 = 75.5% of the expected arrivals.
  const auto t = make_workload("poisson:rate=50,diurnal=0.8:100,duration=2000,seed=9");
  EXPECT_NEAR(double(t.requests.size()), 100000.0, 5 * std::sqrt(100000.0));
  double high = 0;
  for (const auto& r : t.requests)
    high += std::fmod(r.arrival_s, 100.0) < 50.0;
  EXPECT_NEAR(high / double(t.requests.size()), 0.5 + 0.8 / std::numbers::pi, 0.01);
}

TEST(workload, bursts_multiply_the_rate_inside_them) {
  // 2 s of every 10 at 5x: 10*5*2 = 100 expected in bursts per 10 s, 80 outside.
  const auto t = make_workload("gamma:rate=10,cv=1.5,burst=10:2:5,duration=2000,seed=2");
  double in = 0;
  for (const auto& r : t.requests)
    in += std::fmod(r.arrival_s, 10.0) < 2.0;
  EXPECT_NEAR(in / double(t.requests.size()), 100.0 / 180.0, 0.02);
  EXPECT_NEAR(double(t.requests.size()), 36000.0, 0.05 * 36000);
}

TEST(workload, length_distributions_stay_in_their_bounds) {
  const auto u = make_workload("poisson:rate=1,n=20000,prompt=uniform:130:900,output=fixed:77");
  const auto p = lengths(u, true);
  EXPECT_EQ(*std::min_element(p.begin(), p.end()), 130);
  EXPECT_EQ(*std::max_element(p.begin(), p.end()), 900);
  EXPECT_NEAR(mean(p), 515.0, 5 * 222.0 / std::sqrt(20000.0));
  for (double o : lengths(u, false))
    ASSERT_EQ(o, 77);

  const auto n = make_workload(
    "poisson:rate=1,n=20000,prompt=normal:500:100:300:700,output=lognormal:1000:500");
  const auto np = lengths(n, true);
  EXPECT_GE(*std::min_element(np.begin(), np.end()), 300);
  EXPECT_LE(*std::max_element(np.begin(), np.end()), 700);
  EXPECT_NEAR(mean(np), 500.0, 3.0);
  const auto no = lengths(n, false);
  EXPECT_GE(*std::min_element(no.begin(), no.end()), 1);
  EXPECT_NEAR(mean(no), 1000.0, 25.0);
  EXPECT_NEAR(cv(no), 0.5, 0.05);

  const auto m = make_workload("poisson:rate=1,n=20000,prompt=mix:4*fixed:100|1*uniform:1000:2000");
  double small = 0;
  for (double x : lengths(m, true)) {
    small += x == 100;
    ASSERT_TRUE(x == 100 || (x >= 1000 && x <= 2000)) << x;
  }
  EXPECT_NEAR(small / 20000.0, 0.8, 0.015);
}

TEST(workload, spec_errors_name_the_parameter) {
  EXPECT_NE(error_of("weibull:rate=1,n=3").find("workload: arrival: unknown arrival process "
                                                "'weibull'"),
            std::string::npos);
  EXPECT_NE(error_of("poisson:n=3").find("workload: rate: missing"), std::string::npos);
  EXPECT_NE(error_of("poisson").find("workload: rate: missing"), std::string::npos);
  EXPECT_NE(error_of("poisson:rate=-1,n=3").find("workload: rate: must be > 0"), std::string::npos);
  EXPECT_NE(error_of("poisson:rate=ten,n=3").find("workload: rate: 'ten' is not a number"),
            std::string::npos);
  EXPECT_NE(error_of("poisson:rate=1,cv=2,n=3").find("workload: cv: only for gamma"),
            std::string::npos);
  EXPECT_NE(error_of("poisson:rate=1").find("workload: n: give n=COUNT or duration=SECONDS"),
            std::string::npos);
  EXPECT_NE(error_of("poisson:rate=1,n=3,foo=1").find("workload: foo: unknown parameter"),
            std::string::npos);
  EXPECT_NE(error_of("poisson:rate=1,n=3,prompt=uniform:900:130").find("workload: prompt: "),
            std::string::npos);
  EXPECT_NE(error_of("poisson:rate=1,n=3,output=zipf:2").find(
              "workload: output: unknown distribution 'zipf'"),
            std::string::npos);
  EXPECT_NE(error_of("poisson:rate=1,n=3,output=fixed:0").find("workload: output: '0' is not a "
                                                               "token count"),
            std::string::npos);
  EXPECT_NE(error_of("poisson:rate=1,n=3,diurnal=1.5:60").find("workload: diurnal: "),
            std::string::npos);
  EXPECT_NE(error_of("poisson:rate=1,n=3,burst=10:20:2").find("workload: burst: "),
            std::string::npos);
  // Periods too short to integrate are refused, not integrated for hours.
  EXPECT_NE(error_of("poisson:rate=1,n=1000,diurnal=0.5:1e-6").find("at least 0.1 seconds"),
            std::string::npos);
  EXPECT_NE(error_of("poisson:rate=1,n=1000,burst=1:1e-9:2").find("0.01 <= LENGTH_S"),
            std::string::npos);
  EXPECT_NE(error_of("gamma:rate=1,n=3,cv=1,burstiness=1").find("workload: cv: give cv or "
                                                                "burstiness"),
            std::string::npos);
  EXPECT_NE(error_of("poisson:rate=1,n=3,prompt=mix:").find("workload: prompt: mix needs"),
            std::string::npos);
}

TEST(workload, replay_reads_a_workload_like_a_trace) {
  const auto dir = test::scratch_dir("workload-replay-" + std::to_string(::getpid()));
  const auto report = dir / "r.json";
  const std::string bin = test::shell_quote(test::env("BIN"));
  auto r = test::run_command(bin + " replay --workload "
                             "poisson:rate=20,prompt=uniform:130:900,output=uniform:8:64,n=40,seed=1"
                             " --policy fcfs --quiet --report " + report.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(report);
  auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["requests"], 40);
  EXPECT_EQ(j["trace"], "poisson:rate=20,prompt=uniform:130:900,output=uniform:8:64,n=40,seed=1");

  r = test::run_command(bin + " replay --workload poisson:rate=0,n=4 --policy fcfs --report "
                        + report.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--workload: rate: must be > 0"), std::string::npos) << r.output;
  r = test::run_command(bin + " replay --workload poisson:rate=1,n=4 --trace x.csv --policy fcfs "
                        "--report " + report.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("give --trace FILE or --workload SPEC"), std::string::npos) << r.output;
}

} // namespace
} // namespace metronome
