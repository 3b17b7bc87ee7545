// LADB, adapted and literal, through the real scheduler: admission order by
// remaining work, cohorts, the starvation guard, stall-free steps (the
// step time limit and its long-step budget), the literal hold window and timeout fallback,
// re-classification and feedback to the predictor.

#include <gtest/gtest.h>

#include "tests/sched/policy_harness.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;
using test::make_request;

std::shared_ptr<policy_context> context(ladb_options l = {}, predictor_options p = {}) {
  return policy_context::make(p, l, {});
}

class ladb_test : public ::testing::Test, public test::policy_harness {
protected:
  std::shared_ptr<policy_context> ctx = context();

  void use(policy_kind p) {
    make(make_admission_policy(p, *ctx));
  }
};

TEST_F(ladb_test, admits_the_least_remaining_work_first) {
  cfg.limits.max_num_batched_tokens = 4096;
  use(policy_kind::ladb);
  add(make_request(1, 1500, 16));
  add(make_request(2, 40, 16));
  add(make_request(3, 600, 16));
  auto d = next();
  ASSERT_TRUE(d);
  EXPECT_EQ(admitted(*d), (std::vector<uint64_t>{2, 3, 1}));
  // fcfs on the same arrivals: arrival order.
  ctx = context();
  use(policy_kind::fcfs);
  add(make_request(1, 1500, 16));
  add(make_request(2, 40, 16));
  add(make_request(3, 600, 16));
  EXPECT_EQ(admitted(*next()), (std::vector<uint64_t>{1, 2, 3}));
}

TEST_F(ladb_test, work_within_variance_tolerance_keeps_arrival_order) {
  cfg.limits.max_num_batched_tokens = 8192;
  use(policy_kind::ladb);
  add(make_request(1, 1050, 16)); // work 1050 + 16 x 16: same cohort as 2
  now += 1ms;
  add(make_request(2, 1000, 16));
  now += 1ms;
  add(make_request(3, 900, 16)); // more than 20% less work than 1: a cohort ahead
  EXPECT_EQ(admitted(*next()), (std::vector<uint64_t>{3, 1, 2}));
}

TEST_F(ladb_test, starvation_guard_bounds_slowdown_not_waiting) {
  ladb_options o;
  o.starvation_wait = 1s;
  o.starvation_tokens_per_s = 1000;
  ctx = context(o);
  auto p = make_admission_policy(policy_kind::ladb, *ctx);
  auto lng = make_request(1, 3000, 16, 0s); // work 3000 + 256
  auto sht = make_request(2, 100, 16, 2800ms);
  p->on_arrival(lng, 0s);
  p->on_arrival(sht, 2800ms);
  std::vector<sched_request*> waiting = {&lng, &sht};
  // At 2.9 s the long one waited 2.9 s: 2900 tokens' worth < 3256: short first.
  auto order = p->admission_order(waiting, 8, 2900ms);
  EXPECT_EQ(order.front()->id, 2u);
  EXPECT_EQ(ctx->state.stats->promotions, 0);
  // At 3.3 s it waited 3.3 s >= 3256 / 1000: it goes to the front.
  order = p->admission_order(waiting, 8, 3300ms);
  EXPECT_EQ(order.front()->id, 1u);
  EXPECT_EQ(ctx->state.stats->promotions, 1);
  p->admission_order(waiting, 8, 3400ms);
  EXPECT_EQ(ctx->state.stats->promotions, 1) << "counted once per request";
}

TEST_F(ladb_test, step_time_limit_follows_the_decodes_and_saves_long_steps) {
  ladb_options o;
  o.step_time_factor = 1.5;
  o.long_step_share = 0.25;
  o.max_long_steps = 1;
  auto c = context(o);
  auto p = make_admission_policy(policy_kind::ladb, *c);
  step_load load{2048, 8, 0, 1, 10.0, 2.0};
  EXPECT_EQ(p->step_time_limit_ms(load, 0s), 15.0) << "the prompt fits: no long step used";
  load.prefill_ms = 30;
  EXPECT_EQ(p->step_time_limit_ms(load, 0s), 15.0) << "credit 0.5: limited";
  EXPECT_EQ(p->step_time_limit_ms(load, 0s), 15.0) << "credit 0.75";
  EXPECT_FALSE(p->step_time_limit_ms(load, 0s)) << "credit 1: one long step";
  EXPECT_EQ(c->state.stats->long_steps, 1);
  EXPECT_EQ(p->step_time_limit_ms(load, 0s), 15.0) << "spent";

  o.max_step_ms = 12;
  o.long_step_share = 0;
  p = make_admission_policy(policy_kind::ladb, *context(o));
  EXPECT_EQ(p->step_time_limit_ms(load, 0s), 12.0);
  load.decode_ms = 20;
  EXPECT_EQ(p->step_time_limit_ms(load, 0s), 20.0) << "never below the decodes' own time";
  o.max_step_ms = 0;
  o.step_time_factor = 0;
  EXPECT_FALSE(make_admission_policy(policy_kind::ladb, *context(o))->step_time_limit_ms(load, 0s));
  EXPECT_FALSE(fcfs_policy().step_time_limit_ms(load, 0s));
  EXPECT_FALSE(make_admission_policy(policy_kind::srpt, *context(o))->step_time_limit_ms(load, 0s));
}

TEST_F(ladb_test, prompt_chunks_are_cut_to_the_step_time_limit) {
  // Two requests decode, a long prompt arrives: ladb cuts its chunk so the
  // step is predicted to take at most 1.5x the decodes alone; fcfs gives it
  // the rest of the token budget.
  ladb_options o;
  o.long_step_share = 0;
  o.step_time_factor = 1.5;
  cfg.limits.max_num_batched_tokens = 1024;
  cfg.pipeline_depth = 1;
  for (auto p : {policy_kind::ladb, policy_kind::fcfs}) {
    ctx = context(o);
    use(p);
    add(make_request(1, 10, 100));
    add(make_request(2, 12, 100));
    run(*next()); // both prefilled, each has a token
    add(make_request(3, 4000, 16));
    auto d = next();
    ASSERT_TRUE(d);
    EXPECT_EQ(tokens_of(d->plan, 1), 1);
    EXPECT_EQ(tokens_of(d->plan, 2), 1);
    const int32_t n = tokens_of(d->plan, 3);
    if (p == policy_kind::fcfs) {
      EXPECT_EQ(n, 1022);
      EXPECT_FALSE(d->limit_ms);
      continue;
    }
    ASSERT_TRUE(d->limit_ms);
    step_shape decodes;
    decodes.add_chunk(10, 1, true);
    decodes.add_chunk(12, 1, true);
    const auto& est = s->step_times();
    EXPECT_DOUBLE_EQ(*d->limit_ms, 1.5 * est.predict_decode_ms(decodes));
    EXPECT_LE(d->predicted_ms, *d->limit_ms);
    step_shape more = decodes;
    more.add_chunk(0, n + 1, false);
    EXPECT_GT(est.predict_ms(more), *d->limit_ms) << "the largest chunk that fits";
    EXPECT_GT(n, cfg.min_prefill_chunk);
    EXPECT_LT(n, 1022);
  }
}

TEST_F(ladb_test, no_limit_while_nothing_decodes_and_prompts_always_progress) {
  ladb_options o;
  o.long_step_share = 0;
  o.max_step_ms = 0.001; // nothing fits
  cfg.limits.max_num_batched_tokens = 1024;
  cfg.pipeline_depth = 1;
  ctx = context(o);
  use(policy_kind::ladb);
  add(make_request(1, 3000, 16));
  auto d = next();
  ASSERT_TRUE(d);
  EXPECT_EQ(tokens_of(d->plan, 1), 1024) << "nobody decodes: nobody to stall";
  EXPECT_FALSE(d->limit_ms);

  ctx = context(o);
  use(policy_kind::ladb);
  add(make_request(2, 10, 100));
  run(*next()); // 2 decodes from now on
  add(make_request(1, 3000, 16));
  d = next();
  ASSERT_TRUE(d);
  ASSERT_TRUE(d->limit_ms);
  EXPECT_EQ(tokens_of(d->plan, 2), 1);
  EXPECT_EQ(tokens_of(d->plan, 1), cfg.min_prefill_chunk) << "the floor: prompts progress";
}

TEST_F(ladb_test, adapted_never_holds_a_request) {
  use(policy_kind::ladb);
  add(make_request(1, 20, 8));
  auto d = next();
  ASSERT_TRUE(d);
  EXPECT_EQ(admitted(*d), std::vector<uint64_t>{1});
  EXPECT_FALSE(s->policy().next_deadline(now));
}

TEST_F(ladb_test, literal_holds_a_cohort_until_it_fills_or_its_window_ends) {
  ladb_options o;
  o.min_batch_size = 3;
  o.min_hold = o.max_hold = 100ms;
  ctx = context(o);
  use(policy_kind::ladb_literal);
  add(make_request(1, 20, 8)); // predicted 8 (capped): one cohort
  EXPECT_FALSE(next()) << "held: its cohort has 1 of 3";
  EXPECT_EQ(s->policy().next_deadline(now), 100ms);
  now = 10ms;
  add(make_request(2, 30, 8));
  EXPECT_FALSE(next());
  now = 20ms;
  add(make_request(3, 500, 100)); // predicted 100: another cohort
  EXPECT_FALSE(next());
  now = 30ms;
  add(make_request(4, 25, 8));
  auto d = next(); // the first cohort is full
  ASSERT_TRUE(d);
  EXPECT_EQ(admitted(*d), (std::vector<uint64_t>{1, 2, 4}));
  EXPECT_EQ(ctx->state.stats->timeout_dispatches, 0);
  // Request 3 goes when its window ends, 100 ms after it arrived.
  EXPECT_EQ(s->policy().next_deadline(now), 120ms);
}

TEST_F(ladb_test, literal_timeout_fallback_dispatches_at_once) {
  ladb_options o;
  o.min_batch_size = 4;
  o.min_hold = o.max_hold = 1s;
  o.timeout = 250ms;
  ctx = context(o);
  use(policy_kind::ladb_literal);
  add(make_request(1, 20, 8));
  EXPECT_FALSE(next());
  EXPECT_EQ(s->policy().next_deadline(now), 250ms) << "the timeout comes before the window";
  now = 249ms;
  EXPECT_FALSE(next());
  now = 250ms;
  auto d = next();
  ASSERT_TRUE(d);
  EXPECT_EQ(admitted(*d), std::vector<uint64_t>{1});
  EXPECT_EQ(ctx->state.stats->timeout_dispatches, 1);

  // fallback_policy: wait keeps it held until its window ends.
  o.immediate_dispatch = false;
  ctx = context(o);
  now = 0s;
  use(policy_kind::ladb_literal);
  add(make_request(1, 20, 8));
  now = 250ms;
  EXPECT_FALSE(next());
  EXPECT_EQ(s->policy().next_deadline(now), 1s);
  now = 1s;
  ASSERT_TRUE(next());
  EXPECT_EQ(ctx->state.stats->timeout_dispatches, 0);
}

TEST_F(ladb_test, a_request_that_outruns_its_prediction_is_reclassified_and_counted) {
  cfg.pipeline_depth = 1;
  use(policy_kind::ladb);
  add(make_request(1, 10, 100)); // cold start: 0.8 x 10 + 5 = 13 steps
  auto* r = s->find(1);
  ASSERT_TRUE(r);
  EXPECT_DOUBLE_EQ(r->predicted_steps, 13.0);
  EXPECT_EQ(r->max_decode_steps, 16); // ceil(13 x 1.2)
  for (int i = 0; i < 16; ++i)
    run(*next());
  EXPECT_FALSE(s->find(1)->reclassified) << "16 steps is within max_decode_steps";
  run(*next());
  r = s->find(1);
  EXPECT_TRUE(r->reclassified);
  EXPECT_EQ(r->max_decode_steps, 41); // ceil(2 x 17 x 1.2)
  EXPECT_DOUBLE_EQ(r->predicted_steps, 13.0) << "the original prediction is kept for feedback";
  EXPECT_EQ(ctx->state.stats->reclassified_requests, 1);
  EXPECT_EQ(ctx->state.stats->reclassifications, 1);
  for (int i = 0; i < 25; ++i)
    run(*next());
  EXPECT_EQ(s->find(1)->output.size(), 42u);
  EXPECT_EQ(ctx->state.stats->reclassified_requests, 1);
  EXPECT_EQ(ctx->state.stats->reclassifications, 2);
}

TEST_F(ladb_test, finished_requests_feed_the_shared_predictor_across_policy_switches) {
  cfg.pipeline_depth = 1;
  use(policy_kind::ladb);
  int emitted = 0;
  token_for = [&](uint64_t) { return ++emitted == 5 ? 2 : 7; }; // stop at the 5th token
  add(make_request(1, 10, 100));
  while (s->num_running() + s->num_waiting() > 0)
    run(*next());
  auto& model = *ctx->state.model;
  EXPECT_EQ(model.observations(), 1);
  auto out = model.drain_outcomes();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_DOUBLE_EQ(out[0].predicted, 13.0);
  EXPECT_EQ(out[0].actual, 5);
  // A cancelled request says nothing about lengths.
  add(make_request(2, 10, 100));
  run(*next());
  ASSERT_TRUE(s->abort(2, finish_kind::cancelled, now));
  EXPECT_EQ(model.observations(), 1);
  // srpt built from the same context learns into the same predictor.
  s->set_policy(make_admission_policy(policy_kind::srpt, *ctx), now);
  emitted = 0;
  add(make_request(3, 10, 100));
  while (s->num_running() + s->num_waiting() > 0)
    run(*next());
  EXPECT_EQ(model.observations(), 2);
}

} // namespace
} // namespace metronome
