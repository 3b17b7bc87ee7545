// The engine's stats line (actors/stats_reporter.hpp): its figures over an
// interval, silence while idle, and the actor under CAF's deterministic
// test coordinator, which moves its clock 10 s without waiting.

#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/ostream_sink.h>

#include "caf/all.hpp"
#include "caf/scheduler/test_coordinator.hpp"

#include "actors/engine.hpp"
#include "actors/engine_metrics.hpp"
#include "actors/messages.hpp"
#include "actors/stats_reporter.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

engine_stats_sample busy_sample(double computed, double sampled, double queried, double hits) {
  engine_stats_sample s;
  s.computed_tokens = computed;
  s.sampled_tokens = sampled;
  s.prefix_queries = queried;
  s.prefix_hits = hits;
  s.running = 3;
  s.waiting = 1;
  s.kv_used_pages = 25;
  s.kv_total_pages = 100;
  return s;
}

TEST(StatsReporter, ReportsTheIntervalsFigures) {
  stats_reporter r;
  EXPECT_FALSE(r.sample(busy_sample(1000, 100, 400, 100), 5s)) << "the first sample is the baseline";
  auto line = r.sample(busy_sample(6000, 600, 800, 400), 15s);
  ASSERT_TRUE(line);
  EXPECT_EQ(line->text(), "stats interval_s=10.0 tokens_per_s=500.0 output_tokens_per_s=50.0 "
                          "running=3 waiting=1 kv_usage=0.250 prefix_cache_hit_rate=0.750");
  auto j = json::parse("{" + line->json() + "}");
  EXPECT_EQ(j["event"], "stats");
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 500.0);
  EXPECT_EQ(j["running"], 3);
  EXPECT_DOUBLE_EQ(j["prefix_cache_hit_rate"].get<double>(), 0.75);
}

TEST(StatsReporter, NoLookupsNoHitRate) {
  stats_reporter r;
  r.sample(busy_sample(0, 0, 50, 10), 0s);
  auto line = r.sample(busy_sample(100, 10, 50, 10), 10s);
  ASSERT_TRUE(line);
  EXPECT_NE(line->text().find("prefix_cache_hit_rate=-"), std::string::npos) << line->text();
  EXPECT_TRUE(json::parse("{" + line->json() + "}")["prefix_cache_hit_rate"].is_null());
}

TEST(StatsReporter, SilentWhileIdleButReportsABurstThatEnded) {
  stats_reporter r;
  engine_stats_sample idle;
  r.sample(idle, 0s);
  EXPECT_FALSE(r.sample(idle, 10s));
  // Requests came and went inside the interval: nothing runs now, but the
  // engine worked.
  engine_stats_sample after_burst = idle;
  after_burst.computed_tokens = 2000;
  after_burst.sampled_tokens = 200;
  auto line = r.sample(after_burst, 20s);
  ASSERT_TRUE(line);
  EXPECT_NE(line->text().find("tokens_per_s=200.0 output_tokens_per_s=20.0 running=0 waiting=0"),
            std::string::npos)
    << line->text();
  EXPECT_FALSE(r.sample(after_burst, 30s)) << "idle again";
  // Waiting requests alone count as work (a full KV cache, say).
  engine_stats_sample stuck = after_burst;
  stuck.waiting = 2;
  EXPECT_TRUE(r.sample(stuck, 40s));
}

// -- the actor ----------------------------------------------------------------------

struct test_config : caf::actor_system_config {
  test_config() {
    register_message_types(*this);
    set("scheduler.policy", caf::atom("testing"));
    set("logger.inline-output", true);
  }
};

class StatsReporterActor : public ::testing::Test {
protected:
  StatsReporterActor()
    : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)),
      previous_(spdlog::default_logger()) {
    sink_->set_formatter(std::make_unique<spdlog::pattern_formatter>("%l %v"));
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink_));
  }

  ~StatsReporterActor() override {
    caf::anon_send_exit(scheduler, caf::exit_reason::kill);
    sched.run();
    spdlog::set_default_logger(previous_);
  }

  /// The lines logged so far.
  std::vector<std::string> lines() {
    sink_->flush();
    std::vector<std::string> out;
    std::istringstream in(out_.str());
    for (std::string l; std::getline(in, l);)
      out.push_back(l);
    return out;
  }

  void advance(caf::timespan d) {
    sched.advance_time(d);
    sched.run();
  }

  test_config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched
    = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  /// Stands in for the engine's scheduler: the reporter ends with it.
  caf::actor scheduler = sys.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](int32_t) {}};
  });
  std::shared_ptr<engine_metrics> metrics = std::make_shared<engine_metrics>("tiny");
  std::shared_ptr<engine_status> status = std::make_shared<engine_status>();

private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST_F(StatsReporterActor, LogsEveryIntervalWhileBusyFromTheMetrics) {
  auto reporter = spawn_stats_reporter(sys, scheduler.address(), metrics, status, 10s);
  sched.run();
  advance(10s);
  EXPECT_TRUE(lines().empty()) << "idle: no line";

  status->running = 2;
  status->kv_used_pages = 5;
  status->kv_total_pages = 10;
  metrics->on_step(2, 8, 300, 2, 0.01);  // a prompt chunk and a decode
  metrics->on_step(2, 8, 2, 2, 0.01);    // two decodes
  metrics->on_prefix_cache(64, 16, 1);
  advance(10s);
  ASSERT_EQ(lines().size(), 1u);
  EXPECT_EQ(lines()[0], "info stats interval_s=10.0 tokens_per_s=30.2 output_tokens_per_s=0.4 "
                        "running=2 waiting=0 kv_usage=0.500 prefix_cache_hit_rate=0.250");

  advance(5s);
  EXPECT_EQ(lines().size(), 1u) << "not before the next 10 s";
  status->running = 0;
  status->kv_used_pages = 0;
  advance(5s);
  ASSERT_EQ(lines().size(), 1u) << "the engine went idle without computing: no line";
  advance(30s);
  EXPECT_EQ(lines().size(), 1u);

  caf::anon_send_exit(scheduler, caf::exit_reason::kill);
  sched.run();
  EXPECT_TRUE(reporter->getf(caf::abstract_actor::is_terminated_flag))
    << "it ends with the scheduler";
}

} // namespace
} // namespace metronome
