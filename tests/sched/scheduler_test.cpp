// The scheduler as a pure state machine, vLLM style: make requests, call
// schedule(), feed hand-made outputs into update_from_output(), check the
// plans and the queues.

#include <algorithm>
#include <functional>
#include <numeric>

#include <gtest/gtest.h>

#include "sched/kv_page_pool.hpp"
#include "sched/scheduler.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;

sched_request make_request(uint64_t id, int32_t prompt_len, int32_t max_tokens,
                           std::vector<int32_t> stop_ids = {}) {
  sched_request r;
  r.id = id;
  r.prompt.resize(size_t(prompt_len));
  // Prompts of different requests share no token (no prefix cache hits
  // unless a test makes them).
  std::iota(r.prompt.begin(), r.prompt.end(), int32_t(1000 * id + 100));
  r.params.max_tokens = max_tokens;
  r.stop_ids = std::move(stop_ids);
  return r;
}

/// The engine's default limits, with the context resolved as spawn_engine
/// would for a model of 4,096 positions.
scheduler_config default_config() {
  scheduler_config c;
  c.limits.max_model_len = 4096;
  return c;
}

class scheduler_test : public ::testing::Test {
protected:
  scheduler_config cfg = default_config();
  std::unique_ptr<scheduler> s;
  sched_time now{0};

  void make(int32_t pages = 64, int32_t page_size = 4) {
    s = std::make_unique<scheduler>(cfg, std::make_unique<fcfs_policy>());
    s->set_capacity(pages, page_size);
  }

  void add(sched_request r) {
    ASSERT_EQ(s->add(std::move(r), now), admit_result::ok);
  }

  std::optional<step_draft> next() {
    auto d = s->schedule(now);
    if (d) // every chunk got exactly the pages its tokens need, and they are its own
      for (const auto& c : d->plan.chunks) {
        const auto* table = s->pages().table(c.id);
        if (!c.new_pages.empty()) {
          EXPECT_NE(table, nullptr);
          if (table)
            EXPECT_TRUE(std::equal(c.new_pages.rbegin(), c.new_pages.rend(), table->rbegin()));
        }
      }
    return d;
  }

  /// Runs a draft: every sampling chunk gets `token` (or token_for(id)).
  step_update run(const step_draft& d, std::function<int32_t(uint64_t)> token_for = {}) {
    step_output out;
    out.step = d.plan.step;
    out.num_seqs = int32_t(d.plan.chunks.size());
    for (size_t i = 0; i < d.plan.chunks.size(); ++i)
      if (d.samples[i])
        out.tokens.push_back({d.plan.chunks[i].id, token_for ? token_for(d.plan.chunks[i].id) : 7, 0});
    return s->update_from_output(out, now);
  }

  void check_pages() {
    EXPECT_EQ(s->free_pages() + s->used_pages(), s->num_pages());
    EXPECT_EQ(s->pages().unmatched_frees(), 0);
  }

  static int32_t tokens_of(const step_plan& p, uint64_t id) {
    for (const auto& c : p.chunks)
      if (c.id == id)
        return c.num_tokens;
    return 0;
  }
};

TEST_F(scheduler_test, prefill_then_pipelined_decodes_until_length) {
  make();
  add(make_request(1, 10, 3));
  auto p0 = next();
  ASSERT_TRUE(p0);
  ASSERT_EQ(p0->plan.added.size(), 1u);
  EXPECT_EQ(tokens_of(p0->plan, 1), 10);
  EXPECT_EQ(p0->plan.chunks[0].new_pages.size(), 3u); // 10 tokens, pages of 4
  // The next plan is made before step 0's output: it decodes the sample in flight.
  auto p1 = next();
  ASSERT_TRUE(p1);
  EXPECT_TRUE(p1->plan.added.empty());
  EXPECT_EQ(tokens_of(p1->plan, 1), 1);
  EXPECT_FALSE(next()) << "two plans in flight is the pipeline depth";
  auto u0 = run(*p0);
  ASSERT_EQ(u0.tokens.size(), 1u);
  EXPECT_EQ(u0.tokens[0].finish_reason, finish_kind::none);
  EXPECT_TRUE(u0.tokens[0].first_scheduled.has_value());
  auto p2 = next();
  ASSERT_TRUE(p2);
  EXPECT_FALSE(next()) << "the third token is in flight: no decode beyond max_tokens";
  run(*p1);
  auto u2 = run(*p2);
  ASSERT_EQ(u2.tokens.size(), 1u);
  EXPECT_EQ(u2.tokens[0].finish_reason, finish_kind::length);
  EXPECT_EQ(u2.finished, std::vector<uint64_t>{1});
  EXPECT_EQ(s->num_running(), 0);
  check_pages();
  EXPECT_EQ(s->used_pages(), 0);
}

TEST_F(scheduler_test, each_output_reports_its_step_as_planned_and_as_measured) {
  make();
  add(make_request(1, 10, 3));
  auto p0 = next();
  auto p1 = next();
  ASSERT_TRUE(p0 && p1);
  step_output out;
  out.step = p0->plan.step;
  out.num_seqs = 1;
  out.tokens.push_back({1, 7, 0});
  out.seconds = 0.012;
  out.device_seconds = 0.011;
  auto u = s->update_from_output(out, now);
  ASSERT_TRUE(u.step);
  EXPECT_EQ(u.step->step, p0->plan.step);
  EXPECT_EQ(u.step->shape.prefill_tokens, 10);
  EXPECT_EQ(u.step->shape.decode_seqs, 0);
  EXPECT_DOUBLE_EQ(u.step->predicted_ms, p0->predicted_ms);
  EXPECT_DOUBLE_EQ(u.step->prior_ms, s->step_times().prior().step_ms(p0->shape));
  EXPECT_DOUBLE_EQ(u.step->wall_ms, 12.0);
  EXPECT_DOUBLE_EQ(u.step->device_ms, 11.0);
  // The next output is the decode planned second, with its own shape.
  auto u1 = run(*p1);
  ASSERT_TRUE(u1.step);
  EXPECT_EQ(u1.step->shape.decode_seqs, 1);
  EXPECT_EQ(u1.step->shape.prefill_tokens, 0);
  // An output with no plan in flight reports no step.
  EXPECT_FALSE(s->update_from_output(step_output{}, now).step);
}

TEST_F(scheduler_test, a_stop_token_finishes_and_a_sample_in_flight_is_dropped) {
  make();
  add(make_request(1, 4, 100, {2}));
  auto p0 = next();
  auto p1 = next();
  auto u0 = run(*p0, [](uint64_t) { return 2; });
  ASSERT_EQ(u0.tokens.size(), 1u);
  EXPECT_EQ(u0.tokens[0].finish_reason, finish_kind::stop);
  EXPECT_NE(s->pages().table(1), nullptr) << "plan 1 still uses its pages";
  auto u1 = run(*p1);
  EXPECT_TRUE(u1.tokens.empty());
  EXPECT_EQ(s->pages().table(1), nullptr);
  EXPECT_EQ(s->used_pages(), 0);
  check_pages();
  // The runner forgets it with the next plan.
  add(make_request(2, 4, 1));
  auto p2 = next();
  EXPECT_EQ(p2->plan.released, std::vector<uint64_t>{1});
}

TEST_F(scheduler_test, long_prompts_are_chunked_and_decodes_go_first) {
  cfg.limits.max_num_batched_tokens = 16;
  cfg.pipeline_depth = 1;
  make(64, 4);
  add(make_request(1, 5, 50));
  run(*next());                  // 1 prefilled, has a token
  add(make_request(2, 40, 5));
  auto p = next();
  EXPECT_EQ(tokens_of(p->plan, 1), 1);   // decode first
  EXPECT_EQ(tokens_of(p->plan, 2), 15);  // then the rest of the budget
  EXPECT_FALSE(p->samples[1]);
  run(*p);
  p = next();
  EXPECT_EQ(tokens_of(p->plan, 2), 15);
  run(*p);
  p = next();
  EXPECT_EQ(tokens_of(p->plan, 2), 10);
  EXPECT_TRUE(p->samples[1]);
  run(*p);
  check_pages();
}

TEST_F(scheduler_test, prefill_chunk_tokens_caps_each_prompts_share_of_a_step) {
  cfg.limits.max_num_batched_tokens = 64;
  cfg.limits.prefill_chunk_tokens = 10;
  cfg.pipeline_depth = 1;
  make(64, 4);
  add(make_request(1, 25, 3));
  add(make_request(2, 7, 3));
  // Each prompt gets at most 10 tokens a step, whatever the budget leaves:
  // 1 takes 10 + 10 + 5, and 2 (7 tokens) fits whole beside it.
  auto p = next();
  EXPECT_EQ(tokens_of(p->plan, 1), 10);
  EXPECT_EQ(tokens_of(p->plan, 2), 7);
  run(*p);
  p = next();
  EXPECT_EQ(tokens_of(p->plan, 1), 10);
  EXPECT_EQ(tokens_of(p->plan, 2), 1); // a decode: the cap is for prompts only
  run(*p);
  p = next();
  EXPECT_EQ(tokens_of(p->plan, 1), 5);
  EXPECT_TRUE(p->samples[0]);
  run(*p);
  check_pages();
}

TEST_F(scheduler_test, max_batch_size_caps_running_requests) {
  cfg.limits.max_batch_size = 2;
  cfg.pipeline_depth = 1;
  make();
  for (uint64_t i = 1; i <= 4; ++i)
    add(make_request(i, 3, 2));
  auto p = next();
  EXPECT_EQ(p->plan.chunks.size(), 2u);
  EXPECT_EQ(s->num_waiting(), 2);
  run(*p);
  p = next();
  EXPECT_EQ(p->plan.chunks.size(), 2u);
  run(*p); // both finish (2 tokens)
  p = next();
  ASSERT_TRUE(p);
  EXPECT_EQ(tokens_of(p->plan, 3), 3);
  EXPECT_EQ(tokens_of(p->plan, 4), 3);
  EXPECT_EQ(p->plan.released, (std::vector<uint64_t>{1, 2}));
}

TEST_F(scheduler_test, preempts_the_latest_admitted_when_pages_run_out_and_resumes_it) {
  cfg.pipeline_depth = 1;
  cfg.prefix_caching = false; // recomputed whole (with the cache: prefix_cache_test)
  make(4, 4); // 16 token slots
  add(make_request(1, 4, 8));
  add(make_request(2, 4, 8));
  auto p = next();
  EXPECT_EQ(p->plan.chunks.size(), 2u);
  run(*p, [](uint64_t id) { return int32_t(id * 10); });
  // Each now has 5 tokens: both need a second page (2 free).
  p = next();
  EXPECT_EQ(p->plan.chunks.size(), 2u);
  run(*p, [](uint64_t id) { return int32_t(id * 10 + 1); });
  for (int i = 0; i < 3; ++i)
    run(*next(), [](uint64_t id) { return int32_t(id * 10 + 2); });
  // 9 tokens each: computing the 9th needs a third page and none is free.
  p = next();
  ASSERT_TRUE(p);
  EXPECT_EQ(s->preemptions(), 1);
  EXPECT_EQ(s->pages().table(2), nullptr) << "preempted: its pages are free";
  EXPECT_EQ(p->plan.released, std::vector<uint64_t>{2});
  EXPECT_EQ(tokens_of(p->plan, 1), 1);
  EXPECT_EQ(tokens_of(p->plan, 2), 0);
  check_pages();
  // Request 1 runs to its end; request 2 comes back with prompt + output.
  while (s->find(1)) {
    run(*p);
    p = next();
    ASSERT_TRUE(p || !s->find(1));
  }
  ASSERT_TRUE(p);
  ASSERT_EQ(p->plan.added.size(), 1u);
  const auto& resumed = p->plan.added[0];
  EXPECT_EQ(resumed.id, 2u);
  EXPECT_EQ(resumed.num_output, 5);
  EXPECT_EQ(resumed.prompt.size(), 9u);
  EXPECT_EQ(resumed.prompt[4], 20);
  EXPECT_EQ(tokens_of(p->plan, 2), 9);
  check_pages();
}

TEST_F(scheduler_test, abort_frees_pages_once_no_plan_uses_them) {
  make();
  add(make_request(1, 6, 50));
  auto p0 = next();
  EXPECT_TRUE(s->abort(1, finish_kind::cancelled, now));
  EXPECT_NE(s->pages().table(1), nullptr) << "plan 0 still uses its pages";
  EXPECT_FALSE(s->abort(1, finish_kind::cancelled, now));
  auto u = run(*p0);
  EXPECT_TRUE(u.tokens.empty());
  EXPECT_EQ(s->pages().table(1), nullptr);
  EXPECT_EQ(s->used_pages(), 0);
  check_pages();
  // Aborting a waiting request frees nothing (it holds no pages).
  add(make_request(2, 6, 5));
  EXPECT_TRUE(s->abort(2, finish_kind::cancelled, now));
  EXPECT_EQ(s->pages().unmatched_frees(), 0);
  EXPECT_EQ(s->num_waiting(), 0);
}

TEST_F(scheduler_test, admission_refuses_what_cannot_be_served) {
  cfg.limits.max_model_len = 64;
  cfg.limits.max_queued_requests = 2;
  make(8, 4); // 32 tokens of cache
  EXPECT_EQ(s->add(make_request(1, 0, 5), now), admit_result::empty_prompt);
  EXPECT_EQ(s->add(make_request(1, 64, 5), now), admit_result::too_long);
  EXPECT_EQ(s->add(make_request(1, 30, 5), now), admit_result::too_large_for_cache);
  EXPECT_EQ(s->add(make_request(1, 10, 5), now), admit_result::ok);
  EXPECT_EQ(s->add(make_request(1, 10, 5), now), admit_result::duplicate);
  EXPECT_EQ(s->add(make_request(2, 10, 5), now), admit_result::ok);
  EXPECT_EQ(s->add(make_request(3, 10, 5), now), admit_result::queue_full);
  // max_tokens is capped by the context.
  EXPECT_EQ(s->find(1)->max_output, 5);
  cfg.limits.max_model_len = 14;
  make(8, 4);
  add(make_request(9, 10, 100));
  EXPECT_EQ(s->find(9)->max_output, 4);
}

TEST_F(scheduler_test, executor_failure_fails_running_and_keeps_waiting) {
  cfg.limits.max_batch_size = 1;
  make();
  add(make_request(1, 4, 10));
  add(make_request(2, 4, 10));
  next();
  auto failed = s->fail_runner();
  EXPECT_EQ(failed, std::vector<uint64_t>{1});
  EXPECT_EQ(s->num_waiting(), 1);
  EXPECT_FALSE(s->schedule(now)) << "no executor until set_capacity";
  s->set_capacity(64, 4);
  auto p = next();
  ASSERT_TRUE(p);
  EXPECT_EQ(p->plan.added.at(0).id, 2u);
  EXPECT_TRUE(p->plan.released.empty()) << "the new runner never knew request 1";
  check_pages();
}

// -- KV strategies and running alone --------------------------------------------

TEST(kv_buckets, classes_double_from_the_smallest_and_fit_the_pool) {
  kv_buckets b;
  b.reset(1000, 16, 64, 32, 4096); // 64/128/256/512 tokens: 4+8+16+32 pages a set
  ASSERT_EQ(b.classes(), 4);
  EXPECT_EQ(b.tokens(3), 512);
  EXPECT_EQ(b.pages(1), 8);
  EXPECT_EQ(b.count(0), 16) << "1000 pages back 16 sets, not 32";
  EXPECT_EQ(b.find(65), 1);
  for (int i = 0; i < 16; ++i)
    b.take(1);
  EXPECT_EQ(b.find(65), 2) << "class 1 taken: the next larger";
  EXPECT_EQ(b.find(513), -1) << "larger than any bucket";
  b.give(1);
  EXPECT_EQ(b.find(65), 1);
  b.reset(1000, 16, 64, 32, 200); // classes up to the context only
  EXPECT_EQ(b.classes(), 2);
  b.reset(10, 16, 64, 32, 4096); // one set does not fit: no buckets
  EXPECT_EQ(b.classes(), 0);
  b.reset(1000, 16, 64, 1, 4096);
  EXPECT_THROW(b.give(0), std::logic_error) << "a bucket given back that was never taken";
}

TEST_F(scheduler_test, a_bucket_holds_its_pages_for_life_and_is_never_preempted) {
  cfg.kv = kv_strategy::bucketed;
  cfg.kv_bucket_min_tokens = 8; // classes of 8 and 16 tokens (2 and 4 pages)
  cfg.limits.max_model_len = 16;
  cfg.pipeline_depth = 1;
  cfg.prefix_caching = false;
  make(12, 4); // two sets of buckets
  ASSERT_EQ(s->buckets().count(1), 2);
  add(make_request(1, 4, 12)); // 16 tokens: a 4-page bucket
  for (uint64_t id = 2; id <= 4; ++id) {
    auto r = make_request(id, 4, 12);
    r.kv_mode = kv_strategy::paged; // chose pages: these may be preempted
    add(std::move(r));
  }
  auto p = next();
  ASSERT_TRUE(p);
  EXPECT_EQ(s->find(1)->bucket, 1);
  EXPECT_EQ(s->bucket_admissions(), 1);
  EXPECT_EQ(s->reserved_unused_pages(), 3) << "4 reserved, 1 used";
  // The three paged requests need 12 pages of the 8 the bucket leaves.
  int guard = 0;
  while (s->find(1) && ++guard < 100) {
    for (auto id : p->plan.released)
      EXPECT_NE(id, 1u) << "the bucket's request was preempted";
    EXPECT_LE(s->used_pages() + s->reserved_unused_pages(), 12);
    run(*p);
    p = next();
    ASSERT_TRUE(p || !s->find(1));
  }
  EXPECT_GT(s->preemptions(), 0) << "the paged requests ran out of pages";
  EXPECT_FALSE(s->find(1)) << "the bucketed request finished";
  EXPECT_EQ(s->buckets().free(1), 2) << "its bucket came back";
}

TEST_F(scheduler_test, a_full_class_overflows_into_pages_and_hints_pick_the_bucket) {
  cfg.kv = kv_strategy::bucketed;
  cfg.kv_bucket_min_tokens = 8;
  cfg.kv_buckets_per_size = 1;
  cfg.limits.max_model_len = 32;
  make(64, 4);
  auto hinted = make_request(1, 4, 100);
  hinted.max_context = 8; // fits the 8-token class, and caps the output at 4
  add(std::move(hinted));
  add(make_request(2, 4, 4)); // 8 tokens: its class is taken, so 16
  add(make_request(3, 4, 4)); // 8: the 16 and 32 too... its own class is gone
  add(make_request(4, 4, 4));
  auto p = next();
  ASSERT_TRUE(p);
  EXPECT_EQ(s->find(1)->max_output, 4);
  EXPECT_EQ(s->find(1)->bucket, 0);
  EXPECT_EQ(s->find(2)->bucket, 1);
  EXPECT_EQ(s->find(3)->bucket, 2);
  EXPECT_EQ(s->find(4)->bucket, -1) << "no free bucket: overflow into pages";
  EXPECT_EQ(s->bucket_admissions(), 3);
  EXPECT_EQ(s->bucket_overflows(), 1);
  check_pages();
}

TEST_F(scheduler_test, kv_requests_the_server_cannot_honour_are_refused) {
  make();
  auto r = make_request(1, 10, 5);
  r.max_context = 10; // no room for one output token
  EXPECT_EQ(s->add(std::move(r), now), admit_result::bad_kv_request);
  r = make_request(2, 10, 5);
  r.kv_mode = kv_strategy::bucketed; // the server is paged
  EXPECT_EQ(s->add(std::move(r), now), admit_result::bad_kv_request);
  r = make_request(3, 10, 5);
  r.kv_mode = kv_strategy::paged;
  r.max_context = 11;
  EXPECT_EQ(s->add(std::move(r), now), admit_result::ok);
  EXPECT_EQ(s->find(3)->max_output, 1);
}

TEST_F(scheduler_test, a_no_batch_request_waits_for_the_running_and_then_runs_alone) {
  make();
  add(make_request(1, 4, 3));
  auto p = next();
  auto alone = make_request(2, 4, 3);
  alone.no_batch = true;
  add(std::move(alone));
  add(make_request(3, 4, 3)); // behind it: waits for it
  std::vector<std::vector<uint64_t>> steps;
  int guard = 0;
  while (p && ++guard < 100) {
    std::vector<uint64_t> ids;
    for (const auto& c : p->plan.chunks)
      ids.push_back(c.id);
    steps.push_back(ids);
    run(*p);
    p = next();
  }
  for (const auto& ids : steps)
    if (std::find(ids.begin(), ids.end(), 2u) != ids.end())
      EXPECT_EQ(ids, std::vector<uint64_t>{2}) << "request 2 shares no step";
  const auto first_of = [&](uint64_t id) {
    for (size_t i = 0; i < steps.size(); ++i)
      if (std::find(steps[i].begin(), steps[i].end(), id) != steps[i].end())
        return i;
    return steps.size();
  };
  EXPECT_LT(first_of(2), first_of(3)) << "no skipping ahead of it";
  EXPECT_LT(first_of(2), steps.size());
  EXPECT_LT(first_of(3), steps.size()) << "the one behind it ran after";
}

} // namespace
} // namespace metronome
