// Counters, gauges, histograms, quantile estimates and the registry's rules.

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>

#include <gtest/gtest.h>

#include "metrics/prometheus.hpp"
#include "tests/metrics/alloc_counter.hpp"

namespace metronome::prometheus {
namespace {

constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// -- counter and gauge ---------------------------------------------------------------

TEST(prometheus_counter, only_goes_up) {
  counter c;
  EXPECT_EQ(c.value(), 0);
  c.inc();
  c.inc(2.5);
  c.inc(0);
  EXPECT_EQ(c.value(), 3.5);
  EXPECT_THROW(c.inc(-1), std::invalid_argument);
  EXPECT_THROW(c.inc(nan), std::invalid_argument);
  EXPECT_EQ(c.value(), 3.5);
}

TEST(prometheus_gauge, sets_and_moves) {
  gauge g;
  g.set(10);
  g.inc();
  g.dec(4);
  g.inc(-0.5);
  EXPECT_EQ(g.value(), 6.5);
  g.set(-inf);
  EXPECT_EQ(g.value(), -inf);
}

// -- histogram buckets -----------------------------------------------------------------

TEST(prometheus_histogram, le_buckets_are_inclusive_and_cumulative) {
  histogram h({1, 2, 4});
  for (double v : {-3.0, 0.0, 1.0, 1.0000001, 2.0, 3.0, 4.0, 4.5, 1e9})
    h.observe(v);
  auto s = h.snapshot();
  EXPECT_EQ(s.upper_bounds, (std::vector<double>{1, 2, 4}));
  // <=1: -3, 0, 1; <=2: +1.0000001, 2; <=4: +3, 4; +Inf: +4.5, 1e9.
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{3, 5, 7, 9}));
  EXPECT_EQ(s.count(), 9u);
  EXPECT_DOUBLE_EQ(s.sum, -3 + 0 + 1 + 1.0000001 + 2 + 3 + 4 + 4.5 + 1e9);
}

TEST(prometheus_histogram, nan_is_ignored_infinity_is_counted) {
  histogram h({1});
  h.observe(nan);
  EXPECT_EQ(h.snapshot().count(), 0u);
  EXPECT_EQ(h.snapshot().sum, 0);
  h.observe(inf);
  EXPECT_EQ(h.snapshot().cumulative, (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(h.snapshot().sum, inf);
}

TEST(prometheus_histogram, bounds_are_validated) {
  EXPECT_THROW(histogram({1, 1}), std::invalid_argument);
  EXPECT_THROW(histogram({2, 1}), std::invalid_argument);
  EXPECT_THROW(histogram({1, nan}), std::invalid_argument);
  EXPECT_THROW(histogram({-inf, 1}), std::invalid_argument);
  EXPECT_THROW(histogram({1, inf, 2}), std::invalid_argument);
  EXPECT_EQ(histogram({1, 2, inf}).upper_bounds(), (std::vector<double>{1, 2}));
  histogram only_inf({});
  only_inf.observe(5);
  EXPECT_EQ(only_inf.snapshot().cumulative, (std::vector<uint64_t>{1}));
}

TEST(prometheus_histogram, observe_does_not_allocate) {
  registry reg;
  auto& h = reg.add_histogram("h", "H.", buckets::time_to_first_token_seconds());
  auto& c = reg.add_counter("c_total", "C.");
  auto& g = reg.add_gauge("g", "G.");
  auto& fam = reg.add_counter_family("f_total", "F.", {"to"});
  fam.with({"fcfs"}); // created once, looked up below
  auto before = test::allocations_on_this_thread();
  for (int i = 0; i < 10000; ++i) {
    h.observe(i * 0.001);
    c.inc();
    g.set(i);
    fam.with({"fcfs"}).inc();
  }
  EXPECT_EQ(test::allocations_on_this_thread() - before, 0u);
  EXPECT_EQ(h.snapshot().count(), 10000u);
  EXPECT_EQ(fam.with({"fcfs"}).value(), 10000);
}

TEST(prometheus_histogram, allocation_counter_sees_allocations) {
  // The no-allocation test above only means something if the counter counts.
  auto before = test::allocations_on_this_thread();
  auto p = std::make_unique<int[]>(100);
  asm volatile("" : : "g"(p.get()) : "memory"); // keep the allocation
  EXPECT_GE(test::allocations_on_this_thread() - before, 1u);
}

// -- quantiles -------------------------------------------------------------------------

TEST(prometheus_quantile, follows_histogram_quantile) {
  histogram h({1, 2, 4});
  h.observe(0.5);
  for (int i = 0; i < 3; ++i)
    h.observe(1.5);
  auto s = h.snapshot(); // cumulative 1, 4, 4, 4
  // rank 2 of 4 lies in (1, 2], which holds ranks 1..4: 1 + (2 - 1) / 3.
  EXPECT_DOUBLE_EQ(s.quantile(0.5), 1.0 + 1.0 / 3.0);
  // rank 0.4 in the first bucket, which starts at 0: 1 x 0.4 / 1.
  EXPECT_DOUBLE_EQ(s.quantile(0.1), 0.4);
  EXPECT_DOUBLE_EQ(s.quantile(1.0), 2.0);
  EXPECT_DOUBLE_EQ(s.quantile(0.0), 0.0);
  EXPECT_EQ(s.quantile(-0.1), -inf);
  EXPECT_EQ(s.quantile(1.1), inf);
  EXPECT_TRUE(std::isnan(s.quantile(nan)));
  EXPECT_DOUBLE_EQ(s.mean(), (0.5 + 4.5) / 4);
}

TEST(prometheus_quantile, empty_and_overflowing_histograms) {
  histogram h({1, 2});
  EXPECT_TRUE(std::isnan(h.snapshot().quantile(0.5)));
  EXPECT_TRUE(std::isnan(h.snapshot().mean()));
  h.observe(100);
  h.observe(200);
  // Everything above the last finite bound: the estimate is that bound.
  EXPECT_EQ(h.snapshot().quantile(0.5), 2.0);
  EXPECT_EQ(h.snapshot().quantile(0.99), 2.0);
}

double exact_quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::max<size_t>(rank, 1) - 1];
}

TEST(prometheus_quantile, uniform_data_is_recovered_closely) {
  histogram h(linear_buckets(0.5, 0.5, 20)); // 0.5 .. 10
  std::vector<double> values;
  for (int i = 0; i < 10000; ++i) {
    values.push_back((i + 0.5) / 1000.0); // uniform on (0, 10)
    h.observe(values.back());
  }
  auto s = h.snapshot();
  for (double q : {0.05, 0.25, 0.5, 0.9, 0.95, 0.99})
    EXPECT_NEAR(s.quantile(q), exact_quantile(values, q), 0.01) << q;
}

TEST(prometheus_quantile, estimate_lies_in_the_bucket_of_the_true_quantile) {
  // Log-normal latencies (median 200 ms) against vLLM's TTFT layout.
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(std::log(0.2), 1.0);
  auto bounds = buckets::time_to_first_token_seconds();
  histogram h(bounds);
  std::vector<double> values;
  for (int i = 0; i < 20000; ++i) {
    values.push_back(dist(rng));
    h.observe(values.back());
  }
  auto s = h.snapshot();
  for (double q : {0.1, 0.5, 0.9, 0.95, 0.99}) {
    double truth = exact_quantile(values, q);
    auto upper = std::lower_bound(bounds.begin(), bounds.end(), truth);
    ASSERT_NE(upper, bounds.end());
    double lower = upper == bounds.begin() ? 0.0 : *(upper - 1);
    double est = s.quantile(q);
    EXPECT_GE(est, lower) << "q=" << q << " truth=" << truth;
    EXPECT_LE(est, *upper) << "q=" << q << " truth=" << truth;
  }
}

TEST(prometheus_quantile, windows_between_snapshots) {
  histogram h({1, 10, 100});
  for (int i = 0; i < 100; ++i)
    h.observe(50); // an old, slow period
  auto earlier = h.snapshot();
  for (int i = 0; i < 10; ++i)
    h.observe(0.5); // the last window is fast
  auto window = h.snapshot().since(earlier);
  EXPECT_EQ(window.count(), 10u);
  EXPECT_DOUBLE_EQ(window.sum, 5.0);
  EXPECT_LE(window.quantile(0.99), 1.0);
  EXPECT_GT(h.snapshot().quantile(0.5), 10.0);
  EXPECT_THROW(window.since(histogram({1}).snapshot()), std::invalid_argument);
}

// -- bucket layouts ----------------------------------------------------------------------

TEST(prometheus_buckets, layouts) {
  EXPECT_EQ(linear_buckets(1, 2, 3), (std::vector<double>{1, 3, 5}));
  EXPECT_EQ(exponential_buckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_THROW(linear_buckets(0, 0, 3), std::invalid_argument);
  EXPECT_THROW(exponential_buckets(0, 2, 3), std::invalid_argument);
  EXPECT_THROW(exponential_buckets(1, 1, 3), std::invalid_argument);
  // vLLM's layouts (vllm/v1/metrics/loggers.py), so vllm: dashboards fit.
  EXPECT_EQ(buckets::time_to_first_token_seconds(),
            (std::vector<double>{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
                                 2560.0}));
  EXPECT_EQ(buckets::request_latency_seconds(),
            (std::vector<double>{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                                 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}));
  auto itl = buckets::inter_token_latency_seconds();
  for (double b : {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                   7.5, 10.0, 20.0, 40.0, 80.0})
    EXPECT_NE(std::find(itl.begin(), itl.end(), b), itl.end()) << b;
  auto ratio = buckets::ratio();
  EXPECT_EQ(ratio.size(), 20u);
  EXPECT_EQ(ratio.front(), 0.05);
  EXPECT_EQ(ratio.back(), 1.0);
  for (const auto& layout : {itl, ratio, buckets::powers_of_two()})
    EXPECT_NO_THROW(histogram{layout});
}

// -- registry rules ----------------------------------------------------------------------

TEST(prometheus_registry, same_definition_returns_the_same_metric) {
  registry reg;
  auto& a = reg.add_counter("metronome:x_total", "X.", {{"model", "m"}});
  auto& b = reg.add_counter("metronome:x_total", "X.", {{"model", "m"}});
  EXPECT_EQ(&a, &b);
  auto& h1 = reg.add_histogram("metronome:h", "H.", {1, 2});
  auto& h2 = reg.add_histogram("metronome:h", "H.", {1, 2, inf});
  EXPECT_EQ(&h1, &h2);
  auto& f = reg.add_counter_family("metronome:f_total", "F.", {"to"});
  EXPECT_EQ(&f.with({"a"}), &f.with({"a"}));
  EXPECT_NE(&f.with({"a"}), &f.with({"b"}));
}

TEST(prometheus_registry, conflicting_definitions_throw) {
  registry reg;
  reg.add_counter("x_total", "X.");
  EXPECT_THROW(reg.add_gauge("x_total", "X."), std::invalid_argument);
  EXPECT_THROW(reg.add_counter("x_total", "Other help."), std::invalid_argument);
  EXPECT_THROW(reg.add_counter("x_total", "X.", {{"a", "b"}}), std::invalid_argument);
  EXPECT_THROW(reg.add_counter_family("x_total", "X.", {"a"}), std::invalid_argument);
  reg.add_histogram("lat", "L.", {1});
  EXPECT_THROW(reg.add_histogram("lat", "L.", {2}), std::invalid_argument);
  // Sample names clash across families.
  EXPECT_THROW(reg.add_gauge("lat_count", "C."), std::invalid_argument);
  EXPECT_THROW(reg.add_gauge("lat_bucket", "B."), std::invalid_argument);
  reg.add_gauge("q_sum", "S.");
  EXPECT_THROW(reg.add_histogram("q", "Q.", {1}), std::invalid_argument);
}

TEST(prometheus_registry, names_are_validated) {
  registry reg;
  for (auto bad : {"", "1abc", "a-b", "a b", "a.b", "\xc3\xa9"})
    EXPECT_THROW(reg.add_gauge(bad, "x"), std::invalid_argument) << bad;
  EXPECT_NO_THROW(reg.add_gauge("metronome:kv_cache_usage_perc", "ok"));
  EXPECT_NO_THROW(reg.add_gauge(":leading_colon", "ok"));
  EXPECT_NO_THROW(reg.add_gauge("_x9", "ok"));
  for (auto bad : {"", "__reserved", "a-b", "a:b", "9a"})
    EXPECT_THROW(reg.add_gauge_family(std::string("g_") + std::to_string(std::string(bad).size()),
                                      "x", {bad}),
                 std::invalid_argument)
      << bad;
  EXPECT_THROW(reg.add_histogram_family("hh", "x", {"le"}, {1}), std::invalid_argument);
  EXPECT_THROW(reg.add_histogram("hc", "x", {1}, {{"le", "1"}}), std::invalid_argument);
  EXPECT_THROW(reg.add_counter_family("dup_total", "x", {"a"}, {{"a", "1"}}),
               std::invalid_argument);
  EXPECT_THROW(reg.add_counter_family("dup2_total", "x", {"a", "a"}), std::invalid_argument);
  EXPECT_NO_THROW(reg.add_counter_family("le_ok_total", "le is fine outside histograms", {"le"}));
}

TEST(prometheus_registry, family_arity_is_checked) {
  registry reg;
  auto& f = reg.add_gauge_family("g", "G.", {"a", "b"});
  EXPECT_THROW(f.with({"x"}), std::invalid_argument);
  EXPECT_THROW(f.with({"x", "y", "z"}), std::invalid_argument);
  EXPECT_NO_THROW(f.with({"x", "y"}));
  EXPECT_EQ(f.label_names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f.type(), metric_type::gauge);
}

} // namespace
} // namespace metronome::prometheus
