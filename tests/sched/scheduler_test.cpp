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

class scheduler_test : public ::testing::Test {
protected:
  scheduler_config cfg;
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
  EXPECT_EQ(u0.tokens[0].finish_reason, "");
  EXPECT_TRUE(u0.tokens[0].first_scheduled.has_value());
  auto p2 = next();
  ASSERT_TRUE(p2);
  EXPECT_FALSE(next()) << "the third token is in flight: no decode beyond max_tokens";
  run(*p1);
  auto u2 = run(*p2);
  ASSERT_EQ(u2.tokens.size(), 1u);
  EXPECT_EQ(u2.tokens[0].finish_reason, "length");
  EXPECT_EQ(u2.finished, std::vector<uint64_t>{1});
  EXPECT_EQ(s->num_running(), 0);
  check_pages();
  EXPECT_EQ(s->used_pages(), 0);
}

TEST_F(scheduler_test, a_stop_token_finishes_and_a_sample_in_flight_is_dropped) {
  make();
  add(make_request(1, 4, 100, {2}));
  auto p0 = next();
  auto p1 = next();
  auto u0 = run(*p0, [](uint64_t) { return 2; });
  ASSERT_EQ(u0.tokens.size(), 1u);
  EXPECT_EQ(u0.tokens[0].finish_reason, "stop");
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
  cfg.max_num_batched_tokens = 16;
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

TEST_F(scheduler_test, max_batch_size_caps_running_requests) {
  cfg.max_batch_size = 2;
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
  EXPECT_TRUE(s->abort(1, "cancelled", now));
  EXPECT_NE(s->pages().table(1), nullptr) << "plan 0 still uses its pages";
  EXPECT_FALSE(s->abort(1, "cancelled", now));
  auto u = run(*p0);
  EXPECT_TRUE(u.tokens.empty());
  EXPECT_EQ(s->pages().table(1), nullptr);
  EXPECT_EQ(s->used_pages(), 0);
  check_pages();
  // Aborting a waiting request frees nothing (it holds no pages).
  add(make_request(2, 6, 5));
  EXPECT_TRUE(s->abort(2, "cancelled", now));
  EXPECT_EQ(s->pages().unmatched_frees(), 0);
  EXPECT_EQ(s->num_waiting(), 0);
}

TEST_F(scheduler_test, admission_refuses_what_cannot_be_served) {
  cfg.max_model_len = 64;
  cfg.max_queued = 2;
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
  cfg.max_model_len = 14;
  make(8, 4);
  add(make_request(9, 10, 100));
  EXPECT_EQ(s->find(9)->max_output, 4);
}

TEST_F(scheduler_test, executor_failure_fails_running_and_keeps_waiting) {
  cfg.max_batch_size = 1;
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

} // namespace
} // namespace metronome
