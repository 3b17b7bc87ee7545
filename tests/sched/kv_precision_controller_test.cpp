// Tier 1: the fp8_e5m2 overflow supervision as plain C++ in virtual time
// (sched/kv_precision_controller.hpp): the re-materialisation budget, its
// sliding window, the cool-down's start and end; and the scheduler's side
// of it (sched/scheduler.hpp): parking an overflowing request, dropping or
// releasing what it held, re-admitting it in full precision with pages of
// its own precision.

#include <numeric>

#include <gtest/gtest.h>

#include "sched/kv_precision_controller.hpp"
#include "sched/scheduler.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;

sched_time at(std::chrono::milliseconds ms) {
  return std::chrono::duration_cast<sched_time>(ms);
}

kv_overflow_options options(int32_t budget = 3) {
  kv_overflow_options o;
  o.max_rematerializations = budget;
  o.window = 60s;
  o.cooldown = 300s;
  return o;
}

// -- the controller ----------------------------------------------------------------------

TEST(kv_precision_controller, rematerializes_within_the_budget_then_starts_a_cooldown) {
  kv_precision_controller c(options());
  for (int i = 0; i < 3; ++i) {
    auto d = c.on_overflow(uint64_t(i + 1), at(1000ms * i));
    EXPECT_EQ(d.action, kv_overflow_action::rematerialize) << i;
    EXPECT_FALSE(d.cooldown_started);
    EXPECT_EQ(d.in_window, i + 1);
  }
  EXPECT_FALSE(c.cooling_down());
  auto d = c.on_overflow(4, at(3000ms));
  EXPECT_EQ(d.action, kv_overflow_action::keep);
  EXPECT_TRUE(d.cooldown_started);
  ASSERT_TRUE(d.cooldown_until);
  EXPECT_EQ(*d.cooldown_until, at(303000ms));
  EXPECT_TRUE(c.cooling_down());
  EXPECT_EQ(c.next_check(), at(303000ms));
}

TEST(kv_precision_controller, the_window_slides) {
  kv_precision_controller c(options());
  c.on_overflow(1, at(0ms));
  c.on_overflow(2, at(20000ms));
  c.on_overflow(3, at(40000ms));
  // Just before the first one leaves the window: still three.
  EXPECT_EQ(c.in_window(at(59999ms)), 3);
  // 60 s after it, it no longer counts: a fourth is re-materialised.
  auto d = c.on_overflow(4, at(60000ms));
  EXPECT_EQ(d.action, kv_overflow_action::rematerialize);
  EXPECT_EQ(d.in_window, 3);
  EXPECT_FALSE(c.cooling_down());
  // Now 20, 40 and 60 s are in the window: the next overflow at 79.999 s
  // finds three and starts the cool-down.
  d = c.on_overflow(5, at(79999ms));
  EXPECT_EQ(d.action, kv_overflow_action::keep);
  EXPECT_TRUE(d.cooldown_started);
}

TEST(kv_precision_controller, the_cooldown_ends_on_the_clock_and_not_before) {
  kv_precision_controller c(options(0)); // every overflow starts a cool-down
  auto d = c.on_overflow(1, at(5000ms));
  ASSERT_TRUE(d.cooldown_started);
  EXPECT_FALSE(c.on_tick(at(304999ms)));
  EXPECT_TRUE(c.cooling_down());
  EXPECT_TRUE(c.on_tick(at(305000ms)));
  EXPECT_FALSE(c.cooling_down());
  EXPECT_EQ(c.next_check(), std::nullopt);
  EXPECT_FALSE(c.on_tick(at(400000ms))) << "ends once";
}

TEST(kv_precision_controller, an_overflow_during_a_cooldown_is_kept_and_changes_nothing) {
  kv_precision_controller c(options(1));
  c.on_overflow(1, at(0ms));
  auto d = c.on_overflow(2, at(1000ms));
  ASSERT_TRUE(d.cooldown_started);
  d = c.on_overflow(3, at(100000ms)); // the window has passed: the cool-down has not
  EXPECT_EQ(d.action, kv_overflow_action::keep);
  EXPECT_FALSE(d.cooldown_started);
  EXPECT_EQ(d.cooldown_until, at(301000ms));
  EXPECT_EQ(c.next_check(), at(301000ms));
}

TEST(kv_precision_controller, an_overflow_after_the_cooldown_ends_it_first) {
  kv_precision_controller c(options(0));
  c.on_overflow(1, at(0ms));
  // No tick came: the next overflow finds the cool-down over, reports its
  // end, and (budget 0) starts a new one.
  auto d = c.on_overflow(2, at(300000ms));
  EXPECT_TRUE(d.cooldown_ended);
  EXPECT_TRUE(d.cooldown_started);
  EXPECT_EQ(d.cooldown_until, at(600000ms));
}

// -- the scheduler's side ----------------------------------------------------------------

class kv_overflow_scheduler_test : public ::testing::Test {
protected:
  std::unique_ptr<scheduler> s;
  sched_time now{0};

  void make(bool supervised = true) {
    scheduler_config c;
    c.limits.max_model_len = 4096;
    c.cache_salt = 42;
    s = std::make_unique<scheduler>(c, std::make_unique<fcfs_policy>());
    s->set_capacity(64, 4);
    s->set_overflow_supervision(supervised);
  }

  void add(uint64_t id, int32_t prompt_len, int32_t max_tokens, int32_t first = 100) {
    sched_request r;
    r.id = id;
    r.prompt.resize(size_t(prompt_len));
    std::iota(r.prompt.begin(), r.prompt.end(), first);
    r.params.max_tokens = max_tokens;
    ASSERT_EQ(s->add(std::move(r), now), admit_result::ok);
  }

  /// The output of `d`: token `token` for every sampling chunk, and an
  /// overflow for `overflowing`.
  step_output output(const step_draft& d, int32_t token, std::vector<uint64_t> overflowing = {}) {
    step_output out;
    out.step = d.plan.step;
    out.num_seqs = int32_t(d.plan.chunks.size());
    for (size_t i = 0; i < d.plan.chunks.size(); ++i)
      if (d.samples[i])
        out.tokens.push_back({d.plan.chunks[i].id, token, 0});
    for (auto id : overflowing)
      out.kv_overflows.push_back({id, 3, 0});
    return out;
  }
};

TEST_F(kv_overflow_scheduler_test, an_overflowing_request_is_parked_with_its_tokens_held) {
  make();
  add(1, 8, 10);
  auto d1 = s->schedule(now); // prefill, sample
  auto d2 = s->schedule(now); // decode of that sample, pipelined
  ASSERT_TRUE(d1 && d2);
  auto u = s->update_from_output(output(*d1, 7, {1}), now);
  ASSERT_EQ(u.overflows.size(), 1u);
  EXPECT_EQ(u.overflows[0].id, 1u);
  EXPECT_TRUE(u.tokens.empty()) << "its token was computed on the overflowed values";
  u = s->update_from_output(output(*d2, 8), now);
  EXPECT_TRUE(u.tokens.empty());
  EXPECT_EQ(s->schedule(now), std::nullopt) << "parked: not scheduled";
  EXPECT_EQ(s->parked(), std::vector<uint64_t>{1});
  // Kept: the held tokens come out in order, and it runs on.
  auto kept = s->keep_overflowed(1, now);
  ASSERT_TRUE(kept);
  ASSERT_EQ(kept->tokens.size(), 2u);
  EXPECT_EQ(kept->tokens[0].token, 7);
  EXPECT_EQ(kept->tokens[1].token, 8);
  EXPECT_EQ(kept->tokens[1].fallback, kv_fallback::saturated);
  EXPECT_TRUE(s->parked().empty());
  auto d3 = s->schedule(now);
  ASSERT_TRUE(d3);
  // Later overflows of a kept request are counted, not reported again.
  u = s->update_from_output(output(*d3, 9, {1}), now);
  EXPECT_TRUE(u.overflows.empty());
  ASSERT_EQ(u.tokens.size(), 1u);
  EXPECT_FALSE(s->keep_overflowed(1, now)) << "not parked";
}

TEST_F(kv_overflow_scheduler_test, rematerializing_drops_what_followed_the_overflow) {
  make();
  add(1, 8, 10);
  auto d1 = s->schedule(now);
  auto u = s->update_from_output(output(*d1, 7), now); // a good token
  ASSERT_EQ(u.tokens.size(), 1u);
  auto d2 = s->schedule(now); // decode of 7
  auto d3 = s->schedule(now); // decode of its sample, pipelined
  ASSERT_TRUE(d2 && d3);
  u = s->update_from_output(output(*d2, 8, {1}), now);
  ASSERT_EQ(u.overflows.size(), 1u);
  const int32_t used = s->used_pages();
  EXPECT_GT(used, 0);
  ASSERT_TRUE(s->rematerialize(1, now));
  EXPECT_EQ(s->used_pages(), 0) << "preempted by recompute: its pages are free";
  EXPECT_EQ(s->schedule(now), std::nullopt) << "waits for the sample still in flight";
  u = s->update_from_output(output(*d3, 9), now);
  EXPECT_TRUE(u.tokens.empty()) << "made after the overflow: dropped";
  auto d4 = s->schedule(now);
  ASSERT_TRUE(d4);
  ASSERT_EQ(d4->plan.added.size(), 1u);
  const auto& seq = d4->plan.added[0];
  EXPECT_EQ(seq.precision, kv_precision::full);
  EXPECT_EQ(seq.num_output, 1) << "prompt plus the token before the overflow";
  EXPECT_EQ(seq.prompt.back(), 7);
  EXPECT_EQ(d4->plan.released, std::vector<uint64_t>{1}) << "the runner forgets the old one";
  u = s->update_from_output(output(*d4, 5, {1}), now);
  EXPECT_TRUE(u.overflows.empty()) << "full precision: nothing to report";
  ASSERT_EQ(u.tokens.size(), 1u);
  EXPECT_EQ(u.tokens[0].fallback, kv_fallback::rematerialized);
  EXPECT_EQ(s->rematerializations(), 1);
  EXPECT_FALSE(s->rematerialize(1, now)) << "not parked any more";
}

TEST_F(kv_overflow_scheduler_test, without_supervision_overflows_are_only_counted) {
  make(false);
  add(1, 8, 3);
  auto d1 = s->schedule(now);
  auto u = s->update_from_output(output(*d1, 7, {1}), now);
  EXPECT_TRUE(u.overflows.empty());
  EXPECT_EQ(u.tokens.size(), 1u);
  EXPECT_EQ(s->kv_overflow_values(), 3);
}

TEST_F(kv_overflow_scheduler_test, a_cooldown_admits_in_full_precision_with_its_own_prefix_pages) {
  make();
  // A request in fp8 leaves its prompt's pages cached.
  add(1, 13, 1);
  auto d1 = s->schedule(now);
  s->update_from_output(output(*d1, 7), now);
  ASSERT_EQ(s->schedule(now), std::nullopt);
  ASSERT_GT(s->pages().cached_pages(), 0);
  // The same prompt during a cool-down: full precision, and the fp8 pages
  // are not reused for it.
  s->set_admission_precision(kv_precision::full);
  add(2, 13, 1);
  auto d2 = s->schedule(now);
  ASSERT_TRUE(d2);
  ASSERT_EQ(d2->plan.added.size(), 1u);
  EXPECT_EQ(d2->plan.added[0].precision, kv_precision::full);
  EXPECT_EQ(d2->plan.added[0].num_cached, 0);
  auto u = s->update_from_output(output(*d2, 7), now);
  ASSERT_EQ(u.tokens.size(), 1u);
  EXPECT_EQ(u.tokens[0].fallback, kv_fallback::cooldown);
  // A third, also in the cool-down, does reuse the second's pages.
  add(3, 13, 1);
  auto d3 = s->schedule(now);
  ASSERT_TRUE(d3);
  EXPECT_EQ(d3->plan.added[0].num_cached, 12);
  s->update_from_output(output(*d3, 7), now);
  // After the cool-down, the first's fp8 pages serve a fourth.
  s->set_admission_precision(kv_precision::configured);
  add(4, 13, 1);
  auto d4 = s->schedule(now);
  ASSERT_TRUE(d4);
  EXPECT_EQ(d4->plan.added[0].precision, kv_precision::configured);
  EXPECT_EQ(d4->plan.added[0].num_cached, 12);
}

TEST_F(kv_overflow_scheduler_test, pages_written_before_an_overflow_are_not_reused) {
  make();
  add(1, 13, 5);
  auto d1 = s->schedule(now);
  auto u = s->update_from_output(output(*d1, 7, {1}), now);
  ASSERT_EQ(u.overflows.size(), 1u);
  ASSERT_TRUE(s->keep_overflowed(1, now));
  // Another fp8 request with the same prompt computes (and counts) its own.
  add(2, 13, 1);
  std::optional<step_draft> d;
  while ((d = s->schedule(now)) && d->plan.added.empty())
    s->update_from_output(output(*d, 7), now);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->plan.added[0].num_cached, 0);
}

TEST_F(kv_overflow_scheduler_test, a_parked_request_that_is_cancelled_frees_its_pages) {
  make();
  add(1, 8, 10);
  auto d1 = s->schedule(now);
  s->update_from_output(output(*d1, 7, {1}), now);
  ASSERT_EQ(s->parked().size(), 1u);
  EXPECT_TRUE(s->abort(1, finish_kind::cancelled, now));
  EXPECT_EQ(s->used_pages(), 0);
  EXPECT_TRUE(s->parked().empty());
  EXPECT_FALSE(s->rematerialize(1, now));
}

} // namespace
} // namespace metronome
