// The replay loop: a lone request takes its unloaded latency, admission order
// shows in who gets the first token, the same input gives the same report,
// reports have the keys other tools read, refusals are counted (by reason),
// the progress counter settles every request once, and a drift in output
// lengths makes the drift logic switch the policy off and on again.

#include <gtest/gtest.h>

#include "sim/replay.hpp"
#include "sim/report.hpp"
#include "tests/test_env.hpp"

namespace metronome::sim {
namespace {

using namespace std::chrono_literals;

trace csv(const std::string& text) {
  return parse_trace("arrival_s,prompt_tokens,output_tokens\n" + text, trace_format::csv, "t.csv");
}

/// Options for the policy named `policy` (as replay's --policy names it).
replay_options options(std::string_view policy) {
  replay_options o;
  o.policy = parse_policy_kind(policy).value();
  o.cost = cost_model{}; // the built-in provisional H200 model
  return o;
}

TEST(replay, a_lone_request_takes_its_unloaded_latency) {
  for (auto [prompt, out] : {std::pair{100, 1}, {5000, 20}, {2048, 7}}) {
    auto t = csv("0," + std::to_string(prompt) + "," + std::to_string(out) + "\n");
    for (const char* policy : {"fcfs", "ladb", "srpt"}) {
      auto r = replay(t, options(policy));
      ASSERT_EQ(r.requests.size(), 1u);
      const auto& q = r.requests[0];
      EXPECT_NEAR(q.ttft_s, q.unloaded_ttft_s, 1e-6) << policy << " " << prompt;
      EXPECT_NEAR(q.e2e_s, q.unloaded_e2e_s, 1e-6) << policy << " " << prompt;
      EXPECT_EQ(q.produced, out);
      EXPECT_DOUBLE_EQ(q.queue_s, 0.0);
      EXPECT_EQ(r.itl_s.size(), size_t(out - 1));
    }
  }
}

TEST(replay, ladb_lets_a_short_prompt_pass_a_long_one_fcfs_does_not) {
  // A long prompt runs; then a second long one and a short one arrive
  // together, the long one first.
  auto t = csv("0,6000,4\n0.001,6000,4\n0.001,50,4\n");
  auto fcfs = replay(t, options("fcfs"));
  auto ladb = replay(t, options("ladb"));
  auto first_token = [](const replay_result& r, int i) {
    return r.requests[size_t(i)].arrival_s + r.requests[size_t(i)].ttft_s;
  };
  EXPECT_GE(first_token(fcfs, 2), first_token(fcfs, 1)) << "fcfs: the short one waits";
  EXPECT_LT(first_token(ladb, 2), first_token(ladb, 1)) << "ladb: the short one goes first";
  // fcfs: it waits for the whole second prompt (about two unloaded prefills).
  EXPECT_GT(fcfs.requests[2].ttft_s, 1.9 * fcfs.requests[1].unloaded_ttft_s);
  EXPECT_LT(ladb.requests[2].ttft_s, 0.6 * fcfs.requests[2].ttft_s);
  // The order changes, not the work: both finish within a few steps.
  EXPECT_NEAR(ladb.makespan_s, fcfs.makespan_s, 0.05 * fcfs.makespan_s);
}

TEST(replay, the_same_input_gives_the_same_report) {
  auto t = read_trace(test::env("TESTDATA") + "/traces/AzureLLMInferenceTrace_code.csv",
                      trace_format::azure);
  for (const char* policy : {"ladb", "fcfs"}) {
    auto o = options(policy);
    o.rate_scale = 1.5;
    const auto a = make_report(replay(t, o)).dump();
    const auto b = make_report(replay(t, o)).dump();
    EXPECT_EQ(a, b) << policy;
  }
}

TEST(replay, reports_have_the_keys_other_tools_read) {
  auto t = csv("0,100,5\n0.01,200,9\n0.02,3000,3\n0.5,10,30\n");
  auto j = make_report(replay(t, options("ladb")));
  EXPECT_EQ(j["policy"], "ladb");
  EXPECT_EQ(j["requests"], 4);
  EXPECT_GT(j["throughput_tokens_per_s"].get<double>(), 0.0);
  for (const char* key : {"ttft_ms", "itl_ms", "e2e_ms", "queue_ms"})
    for (const char* p : {"p50", "p95", "p99"}) {
      ASSERT_TRUE(j[key].contains(p)) << key << "." << p;
      EXPECT_GE(j[key][p].get<double>(), 0.0);
    }
  EXPECT_LE(j["e2e_ms"]["p50"].get<double>(), j["e2e_ms"]["p99"].get<double>());
  for (const char* key : {"p95_over_p50", "batch_efficiency", "preemptions", "longest_wait_ms",
                          "slowdown_by_output_decile", "predictor", "supervisor", "unloaded"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["predictor"]["samples"], 4);
  EXPECT_EQ(j["slowdown_by_output_decile"].size(), 4u) << "4 requests: 4 non-empty deciles";
  // metronome:scheduling_events_total's kinds, token grouping's among them.
  for (const char* kind : {"limited_step", "long_step", "relaxed_step", "promotion",
                           "reclassification", "timeout_dispatch", "group_admission",
                           "group_preemption", "group_decode"})
    EXPECT_TRUE(j["scheduling_events"].contains(kind)) << kind;
  EXPECT_EQ(j["token_groups"], "") << "off by default";
}

TEST(replay, token_groups_choose_preemption_victims_and_are_counted) {
  // Sixteen requests at once, each 100 + 300 tokens, in a KV cache of 2,048:
  // pages run out while some have generated more than others.
  std::string rows;
  for (int i = 0; i < 16; ++i)
    rows += "0." + std::to_string(100 + i) + ",100,300\n";
  const auto t = csv(rows);
  for (bool grouped : {false, true}) {
    auto o = options("fcfs");
    o.settings.scheduler.limits.kv_cache_tokens = 2048;
    o.max_tokens = 300; // a request may not need more than the cache
    if (grouped)
      o.settings.scheduler.groups = token_groups({32, 128});
    const auto r = replay(t, o);
    EXPECT_GT(r.preemptions, 0) << grouped;
    for (const auto& q : r.requests)
      EXPECT_EQ(q.produced, 300) << grouped;
    const auto j = make_report(r);
    EXPECT_EQ(j["scheduling_events"]["group_preemption"], r.group_stats.preemptions);
    EXPECT_EQ(j["scheduling_events"]["group_admission"], r.group_stats.admissions);
    if (grouped) {
      EXPECT_GT(r.group_stats.preemptions, 0) << "the longest, not the latest, made room";
      EXPECT_EQ(j["token_groups"], "32,128");
    } else {
      EXPECT_EQ(r.group_stats.preemptions + r.group_stats.admissions + r.group_stats.decodes, 0);
    }
  }
}

TEST(replay, percentiles_are_nearest_rank) {
  auto p = percentiles({5, 1, 4, 2, 3, 6, 7, 8, 9, 10});
  EXPECT_DOUBLE_EQ(p["p50"].get<double>(), 5);
  EXPECT_DOUBLE_EQ(p["p95"].get<double>(), 10);
  EXPECT_DOUBLE_EQ(p["mean"].get<double>(), 5.5);
  EXPECT_DOUBLE_EQ(percentiles({})["p99"].get<double>(), 0);
}

TEST(replay, requests_longer_than_the_context_are_refused_and_counted) {
  auto o = options("fcfs");
  o.settings.scheduler.limits.max_model_len = 1000;
  auto r = replay(csv("0,100,5\n0.1,2000,5\n"), o);
  EXPECT_EQ(r.requests[1].refused, "too_long");
  auto j = make_report(r);
  EXPECT_EQ(j["requests"], 1);
  EXPECT_EQ(j["refused"], 1);
  EXPECT_EQ(j["refused_by_reason"], nlohmann::json({{"too_long", 1}}));
}

TEST(replay, the_progress_counter_settles_every_request_once) {
  auto o = options("fcfs");
  o.settings.scheduler.limits.max_model_len = 1000;
  std::atomic<int64_t> settled{0};
  o.progress = &settled;
  replay(csv("0,100,5\n0.1,2000,5\n0.2,50,1\n"), o);
  EXPECT_EQ(settled.load(), 3) << "two finished, one refused";
  replay(csv("0,100,5\n"), o);
  EXPECT_EQ(settled.load(), 4) << "runs may share a counter";
}

TEST(replay, a_jump_in_output_lengths_disables_the_policy_for_the_cool_down) {
  // 20 requests/s of the same prompt: 300 stop after 6 tokens, then 600 run 60.
  std::string text;
  for (int i = 0; i < 900; ++i)
    text += std::to_string(i * 0.05) + ",200," + (i < 300 ? "6" : "60") + "\n";
  auto o = options("ladb");
  o.settings.predictor.warmup_steps = 20;
  o.settings.drift.window = 5s;
  o.settings.drift.sustain = 2s;
  o.settings.drift.disable_for = 8s;
  o.settings.drift.min_samples = 10;
  auto r = replay(csv(text), o);
  ASSERT_GE(r.events.size(), 2u);
  EXPECT_EQ(r.events[0].action, "disable");
  EXPECT_EQ(r.events[0].policy, "fcfs");
  auto at_s = [&](size_t i) { return double(r.events[i].at_ns) * 1e-9; };
  EXPECT_GT(at_s(0), 15.0) << "the jump comes at 15 s";
  EXPECT_LT(at_s(0), 15.0 + 2.0 + 3.0) << "sustain 2 s after the first long ones finish";
  EXPECT_EQ(r.events[1].action, "enable");
  EXPECT_EQ(r.events[1].policy, "ladb");
  EXPECT_NEAR(at_s(1) - at_s(0), 8.0, 0.2);
  EXPECT_NEAR(r.disabled_s, 8.0 * double(r.events.size() / 2), 0.5);
  // The recalibrated predictor knows the new lengths: no second disable.
  EXPECT_EQ(r.events.size(), 2u);
  auto j = make_report(r);
  EXPECT_EQ(j["supervisor"]["switches"], 2);
  // fcfs never drifts: it predicts nothing.
  EXPECT_TRUE(replay(csv(text), [&] {
                auto f = o;
                f.policy = policy_kind::fcfs;
                return f;
              }())
                .events.empty());
}

// Policy names are parsed where they are read (replay's --policy: unknown
// ones are refused there, replay_cli_test); a rate scale is checked here.
TEST(replay, policy_names_parse_both_ways_and_a_bad_rate_scale_is_an_error) {
  for (auto p : {policy_kind::fcfs, policy_kind::ladb, policy_kind::srpt,
                 policy_kind::ladb_literal, policy_kind::srpt_literal})
    EXPECT_EQ(parse_policy_kind(to_string(p)), p);
  EXPECT_FALSE(parse_policy_kind("lifo"));
  auto o = options("fcfs");
  o.rate_scale = 0;
  EXPECT_THROW(replay(csv("0,10,1\n"), o), std::invalid_argument);
}

} // namespace
} // namespace metronome::sim
