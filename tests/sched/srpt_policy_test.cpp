// srpt: shortest predicted remaining work first, promotion to the front
// once a request's wait bounds its slowdown, and the literal (decode steps
// only) reading.

#include <gtest/gtest.h>

#include "tests/sched/policy_harness.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;
using test::make_request;

std::vector<uint64_t> ids(const std::vector<sched_request*>& xs) {
  std::vector<uint64_t> out;
  for (auto* x : xs)
    out.push_back(x->id);
  return out;
}

TEST(srpt, shortest_remaining_work_first_then_promotion_by_slowdown) {
  auto ctx = policy_context::make();
  auto p = make_admission_policy(policy_kind::srpt, *ctx);
  auto a = make_request(1, 2000, 16, 0ms);
  auto b = make_request(2, 50, 16, 100ms);
  auto c = make_request(3, 800, 16, 110ms);
  p->on_arrival(a, 0ms);
  p->on_arrival(b, 100ms);
  p->on_arrival(c, 110ms);
  std::vector<sched_request*> waiting = {&a, &b, &c};
  EXPECT_EQ(ids(p->admission_order(waiting, 8, 120ms)), (std::vector<uint64_t>{2, 3, 1}));
  // A burst: everyone waited past promote_after, but waiting alone does not
  // promote (that would be fcfs exactly when order matters).
  EXPECT_EQ(ids(p->admission_order(waiting, 8, 300ms)), (std::vector<uint64_t>{2, 3, 1}));
  // Work 800 + 16 x 16 tokens at 50 tokens/s: 3 is promoted after 21.1 s,
  // 1 (2256) after 45.1 s; promoted requests go first, oldest first.
  EXPECT_EQ(ids(p->admission_order(waiting, 8, 21'000ms)), (std::vector<uint64_t>{2, 3, 1}));
  EXPECT_EQ(ids(p->admission_order(waiting, 8, 21'200ms)), (std::vector<uint64_t>{2, 3, 1}));
  EXPECT_EQ(ids(p->admission_order(waiting, 8, 45'000ms)), (std::vector<uint64_t>{2, 3, 1}));
  EXPECT_EQ(ids(p->admission_order(waiting, 8, 45'200ms)), (std::vector<uint64_t>{1, 2, 3}));

  // Without the slowdown bound, promote_after alone decides (the original).
  srpt_options o;
  o.starvation_tokens_per_s = 0;
  auto fixed = make_admission_policy(policy_kind::srpt, *policy_context::make({}, {}, o));
  fixed->on_arrival(a, 0ms);
  EXPECT_EQ(ids(fixed->admission_order(waiting, 8, 120ms)), (std::vector<uint64_t>{2, 3, 1}));
  EXPECT_EQ(ids(fixed->admission_order(waiting, 8, 150ms)), (std::vector<uint64_t>{1, 2, 3}));
}

TEST(srpt, literal_orders_by_predicted_decode_steps_alone) {
  auto ctx = policy_context::make();
  auto work = make_admission_policy(policy_kind::srpt, *ctx);
  auto steps = make_admission_policy(policy_kind::srpt_literal, *ctx);
  // Cold start: 1000-token prompt with max_tokens 8 is predicted 8 steps;
  // a 10-token prompt with max_tokens 100 is predicted 13.
  auto big = make_request(1, 1000, 8);
  auto small = make_request(2, 10, 100);
  work->on_arrival(big, 0ms);
  work->on_arrival(small, 0ms);
  std::vector<sched_request*> waiting = {&big, &small};
  EXPECT_EQ(ids(steps->admission_order(waiting, 8, 1ms)), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(ids(work->admission_order(waiting, 8, 1ms)), (std::vector<uint64_t>{2, 1}));
  EXPECT_EQ(steps->name(), "srpt-literal");
}

TEST(srpt, predictions_survive_preemption_and_are_not_redone) {
  auto ctx = policy_context::make();
  auto p = make_admission_policy(policy_kind::srpt, *ctx);
  auto r = make_request(1, 10, 100);
  p->on_arrival(r, 0ms);
  EXPECT_DOUBLE_EQ(r.predicted_steps, 13.0);
  r.output.assign(5, 7);
  p->on_arrival(r, 1s); // re-announced (policy switch)
  EXPECT_DOUBLE_EQ(r.predicted_steps, 13.0);
  auto* lap = dynamic_cast<latency_aware_policy*>(p.get());
  ASSERT_TRUE(lap);
  EXPECT_DOUBLE_EQ(lap->remaining_steps(r), 8.0);
}

} // namespace
} // namespace metronome
