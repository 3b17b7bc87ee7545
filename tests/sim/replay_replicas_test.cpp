// Replay with N replicas behind the router: more replicas cut the queueing
// of a load one cannot carry and share the work between them; the router
// hears of finished and refused requests (their load leaves their
// replica); every request runs on the one replica it was placed on; the
// same input places every request the same way; and bad counts are errors.
// (One replica against the replay before replicas: replay_cli_test's
// golden report.)

#include <gtest/gtest.h>

#include <numeric>

#include "sim/replay.hpp"
#include "sim/report.hpp"

namespace metronome::sim {
namespace {

trace csv(const std::string& text) {
  return parse_trace("arrival_s,prompt_tokens,output_tokens\n" + text, trace_format::csv, "t.csv");
}

replay_options options(std::string_view policy, int32_t replicas) {
  replay_options o;
  o.policy = parse_policy_kind(policy).value();
  o.cost = cost_model{}; // the built-in provisional H200 model
  o.replicas = replicas;
  return o;
}

/// 400 requests of 2,000-token prompts, 16 output tokens, one every 30 ms
/// (33/s): about 1.4 times what one replica serves on the built-in model (a
/// request's prefill alone takes about 40 ms), about 0.7 times what two do.
trace saturating() {
  std::string text;
  for (int i = 0; i < 400; ++i)
    text += std::to_string(i * 0.03) + ",2000,16\n";
  return csv(text);
}

/// 300 requests in 3 s, prompts of 100-3,099 tokens, outputs of 1-120.
trace mixed() {
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += std::to_string(i * 0.01) + "," + std::to_string(100 + (i * 37) % 3000) + ","
            + std::to_string(1 + (i * 13) % 120) + "\n";
  return csv(text);
}

TEST(replay_replicas, two_replicas_cut_p95_ttft_where_one_saturates_and_share_the_work) {
  const auto t = saturating();
  for (const char* policy : {"fcfs", "ladb"}) {
    const auto one = make_report(replay(t, options(policy, 1)));
    const auto two = make_report(replay(t, options(policy, 2)));
    const double p95_one = one["ttft_ms"]["p95"].get<double>();
    const double p95_two = two["ttft_ms"]["p95"].get<double>();
    EXPECT_LT(p95_two, 0.5 * p95_one) << policy << ": one replica queues, two keep up";
    EXPECT_EQ(one["requests"], 400);
    EXPECT_EQ(two["requests"], 400);
    EXPECT_EQ(two["replicas"], 2);
    ASSERT_EQ(two["per_replica"].size(), 2u);
    // Equal requests at a steady rate: each goes where fewer are unfinished,
    // so the two replicas' counts of unfinished requests never differ by
    // more than a few and their totals stay close. 45-55% leaves room for
    // the placements at moments when both are equal (the lower index wins).
    for (const auto& r : two["per_replica"]) {
      EXPECT_GE(r["placed"].get<int64_t>(), 180) << policy << " " << r.dump();
      EXPECT_LE(r["placed"].get<int64_t>(), 220) << policy << " " << r.dump();
      EXPECT_GT(r["busy_fraction"].get<double>(), 0.3) << policy << " " << r.dump();
    }
  }
}

TEST(replay_replicas, every_request_runs_on_the_one_replica_it_was_placed_on) {
  const auto t = mixed();
  for (int32_t n : {1, 2, 4}) {
    const auto r = replay(t, options("ladb", n));
    ASSERT_EQ(r.per_replica.size(), size_t(n));
    std::vector<int64_t> placed(static_cast<size_t>(n)), produced(static_cast<size_t>(n));
    for (const auto& q : r.requests) {
      ASSERT_GE(q.replica, 0);
      ASSERT_LT(q.replica, n);
      ++placed[size_t(q.replica)];
      produced[size_t(q.replica)] += q.produced;
      EXPECT_EQ(q.produced, q.output_tokens) << "request " << q.index << " finished";
    }
    int64_t total = 0;
    for (int32_t k = 0; k < n; ++k) {
      // A token of a request from a replica it was not placed on would have
      // stopped the replay (a logic_error): here the counts agree.
      EXPECT_EQ(r.per_replica[size_t(k)].placed, placed[size_t(k)]) << n << " replicas, " << k;
      EXPECT_EQ(r.per_replica[size_t(k)].output_tokens, produced[size_t(k)]) << n << ", " << k;
      EXPECT_GT(placed[size_t(k)], 0) << n << " replicas: replica " << k << " got none";
      total += placed[size_t(k)];
    }
    EXPECT_EQ(total, int64_t(t.requests.size())) << "each placed once";
    EXPECT_EQ(r.output_tokens, std::accumulate(produced.begin(), produced.end(), int64_t{0}));
  }
}

TEST(replay_replicas, the_same_input_places_every_request_the_same_way) {
  const auto t = mixed();
  for (int32_t n : {2, 4}) {
    const auto a = replay(t, options("srpt", n));
    const auto b = replay(t, options("srpt", n));
    for (size_t i = 0; i < a.requests.size(); ++i)
      ASSERT_EQ(a.requests[i].replica, b.requests[i].replica) << n << " replicas, request " << i;
    EXPECT_EQ(make_report(a).dump(), make_report(b).dump()) << n;
  }
}

TEST(replay_replicas, finished_and_refused_requests_leave_the_routers_load) {
  // max_tokens 1,000 everywhere: a request's load is its prompt plus 1,000.
  auto o = options("fcfs", 2);
  o.max_tokens = 1000;
  o.settings.scheduler.limits.max_model_len = 5000;
  // 0: 900 tokens (seconds), on replica 0. 1: 1,000-token prompt, 2 tokens,
  // on replica 1, done well before 0.5 s. 2 (at 0.5 s): replica 1 again
  // only if 1's load left it; else replica 0 is the lighter (1,100 < 2,000).
  auto r = replay(csv("0,100,900\n0.001,1000,2\n0.5,100,2\n"), o);
  EXPECT_EQ(r.requests[0].replica, 0);
  EXPECT_EQ(r.requests[1].replica, 1);
  ASSERT_GT(r.requests[0].e2e_s, 0.5) << "request 0 still runs when request 2 arrives";
  EXPECT_LT(r.requests[1].e2e_s, 0.49);
  EXPECT_EQ(r.requests[2].replica, 1) << "the finished request's load left replica 1";
  // Refused: 1 is longer than the context (on replica 1, refused at once);
  // 2 goes to replica 1 only if 1's 7,000 tokens left it.
  r = replay(csv("0,100,900\n0.001,6000,2\n0.002,100,2\n"), o);
  EXPECT_EQ(r.requests[1].refused, "too_long");
  EXPECT_EQ(r.requests[1].replica, 1);
  EXPECT_EQ(r.per_replica[1].refused, 1);
  EXPECT_EQ(r.requests[2].replica, 1) << "the refused request's load left replica 1";
}

TEST(replay_replicas, one_replica_is_the_default_and_counts_are_bounded) {
  const auto r = replay(mixed(), options("fcfs", 1));
  EXPECT_EQ(replay_options{}.replicas, 1);
  EXPECT_EQ(r.replicas, 1);
  ASSERT_EQ(r.per_replica.size(), 1u);
  EXPECT_EQ(r.per_replica[0].placed, 300);
  EXPECT_EQ(r.per_replica[0].steps, r.steps);
  const auto j = make_report(r);
  EXPECT_EQ(j["replicas"], 1);
  EXPECT_DOUBLE_EQ(j["per_replica"][0]["busy_fraction"].get<double>(),
                   j["busy_fraction"].get<double>());
  for (int32_t bad : {0, -1, max_replicas + 1})
    EXPECT_THROW(replay(mixed(), options("fcfs", bad)), std::invalid_argument) << bad;
  EXPECT_NO_THROW(replay(csv("0,10,1\n"), options("fcfs", max_replicas)));
}

} // namespace
} // namespace metronome::sim
