// Several threads observe while another scrapes: no update is lost, and every
// scrape is valid exposition text (cumulative buckets, +Inf == _count).

#include <atomic>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "metrics/prometheus.hpp"
#include "tests/metrics/exposition_checker.hpp"

namespace metronome::prometheus {
namespace {

constexpr int threads = 8;
constexpr int per_thread = 100'000;

TEST(prometheus_concurrency, no_update_is_lost_and_scrapes_stay_valid) {
  registry reg;
  auto& h = reg.add_histogram("metronome:inter_token_latency_seconds", "ITL.",
                              {0.125, 0.25, 0.5, 1.0});
  auto& c = reg.add_counter("metronome:tokens_total", "Tokens.");
  auto& g = reg.add_gauge("metronome:running", "Running.");
  auto& f = reg.add_counter_family("metronome:ladb_switches_total", "Switches.", {"to"});

  std::atomic<bool> done{false};
  std::atomic<int> scrapes{0};
  std::thread scraper([&] {
    while (!done.load()) {
      auto text = reg.render();
      auto families = test::check_exposition(text);
      if (const auto* fam = test::find_family(families, "metronome:tokens_total")) {
        EXPECT_GE(fam->samples.at(0).value, 0);
      }
      scrapes.fetch_add(1);
    }
  });

  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      // Children created concurrently from every thread: "a", "b", "c".
      auto& mine = f.with({std::string_view(t % 3 == 0 ? "a" : t % 3 == 1 ? "b" : "c")});
      for (int i = 0; i < per_thread; ++i) {
        // Multiples of 1/16: every partial sum is exact in a double, so the
        // final sum does not depend on the order of the adds.
        h.observe(static_cast<double>(i % 20) / 16.0);
        c.inc();
        g.inc();
        g.dec();
        mine.inc();
      }
    });
  }
  for (auto& w : workers)
    w.join();
  // At least one scrape after all the work, so the final text is checked too.
  int seen = scrapes.load();
  while (scrapes.load() < seen + 2)
    std::this_thread::yield();
  done = true;
  scraper.join();

  const double n = static_cast<double>(threads) * per_thread;
  EXPECT_EQ(c.value(), n);
  EXPECT_EQ(g.value(), 0);
  auto s = h.snapshot();
  EXPECT_EQ(s.count(), static_cast<uint64_t>(n));
  // Per thread: i % 20 cycles 0..19 exactly per_thread / 20 times.
  const uint64_t cycles = uint64_t{threads} * (per_thread / 20);
  // value k/16 <= 0.125 for k <= 2; <= 0.25 for k <= 4; <= 0.5 for k <= 8;
  // <= 1 for k <= 16; 17..19 above.
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{3 * cycles, 5 * cycles, 9 * cycles, 17 * cycles,
                                                 20 * cycles}));
  EXPECT_EQ(s.sum, static_cast<double>(cycles) * (19.0 * 20.0 / 2.0) / 16.0);
  double switches = f.with({"a"}).value() + f.with({"b"}).value() + f.with({"c"}).value();
  EXPECT_EQ(switches, n);
  EXPECT_EQ(f.with({"a"}).value(), 3.0 * per_thread); // threads 0, 3, 6
  EXPECT_GT(scrapes.load(), 0);
}

TEST(prometheus_concurrency, concurrent_registration_yields_one_metric) {
  registry reg;
  std::vector<counter*> seen(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      seen[t] = &reg.add_counter("metronome:shared_total", "Shared.");
      for (int i = 0; i < 1000; ++i)
        seen[t]->inc();
    });
  for (auto& w : workers)
    w.join();
  for (auto* p : seen)
    EXPECT_EQ(p, seen[0]);
  EXPECT_EQ(seen[0]->value(), threads * 1000.0);
}

} // namespace
} // namespace metronome::prometheus
