// Token-aware grouping (sched/token_groups.hpp): the bands at their edges,
// and the three decisions the scheduler makes by group (admission,
// preemption, decodes short of budget), each with its counter. Every
// scenario is also run without groups, where the scheduler must decide
// otherwise, so a grouping that does nothing fails.

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include <gtest/gtest.h>

#include "sched/scheduler.hpp"
#include "sched/token_groups.hpp"

namespace metronome {
namespace {

// -- the bands ---------------------------------------------------------------------

TEST(token_groups, the_bands_end_at_their_bounds_inclusive) {
  const token_groups g({32, 128});
  EXPECT_TRUE(g.enabled());
  EXPECT_EQ(g.count(), 3);
  EXPECT_EQ(g.group_of(0), 0);
  EXPECT_EQ(g.group_of(32), 0);
  EXPECT_EQ(g.group_of(33), 1);
  EXPECT_EQ(g.group_of(128), 1);
  EXPECT_EQ(g.group_of(129), 2);
  EXPECT_EQ(g.group_of(100'000), 2);
  EXPECT_EQ(g.to_string(), "32,128");
}

TEST(token_groups, off_puts_every_request_in_group_zero) {
  const token_groups g;
  EXPECT_FALSE(g.enabled());
  EXPECT_EQ(g.count(), 1);
  for (int32_t n : {0, 33, 129, 1 << 20})
    EXPECT_EQ(g.group_of(n), 0);
  EXPECT_EQ(g.to_string(), "");
}

TEST(token_groups, bad_bounds_are_refused_with_the_reason) {
  auto reason = [](std::vector<int32_t> b) {
    try {
      token_groups g(std::move(b));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(reason({128, 32}).find("bounds must increase, got 32 after 128"), std::string::npos);
  EXPECT_NE(reason({32, 32}).find("bounds must increase"), std::string::npos);
  EXPECT_NE(reason({0, 32}).find("bound 0 is outside"), std::string::npos);
  EXPECT_NE(reason({(1 << 20) + 1}).find("is outside"), std::string::npos);
  EXPECT_NE(reason({1, 2, 3, 4, 5, 6, 7, 8, 9}).find("at most 8 bounds"), std::string::npos);
  EXPECT_EQ(reason({1}), "accepted");
}

// -- the scheduler's decisions ------------------------------------------------------

/// Admits in id order (a policy order the groups can be seen to change).
class id_order_policy final : public admission_policy {
public:
  std::string_view name() const override {
    return "id-order";
  }
  void on_arrival(sched_request&, sched_time) override {
    // nop
  }
  std::vector<sched_request*> admission_order(std::span<sched_request* const> waiting, int32_t,
                                              sched_time) override {
    std::vector<sched_request*> out(waiting.begin(), waiting.end());
    std::sort(out.begin(), out.end(), [](auto* a, auto* b) { return a->id < b->id; });
    return out;
  }
};

/// A request with `prompt` tokens that has generated `generated` already
/// (as one resumed after a preemption carries its output).
sched_request make_request(uint64_t id, int32_t prompt, int32_t generated, int32_t max_tokens) {
  sched_request r;
  r.id = id;
  r.prompt.resize(size_t(prompt));
  std::iota(r.prompt.begin(), r.prompt.end(), int32_t(1000 * id + 100));
  r.output.assign(size_t(generated), 7);
  r.params.max_tokens = max_tokens;
  return r;
}

class grouping_test : public ::testing::TestWithParam<bool> {
protected:
  scheduler_config cfg;
  std::unique_ptr<scheduler> s;
  sched_time now{0};

  grouping_test() {
    cfg.limits.max_model_len = 4096;
    cfg.pipeline_depth = 1;
    cfg.prefix_caching = false;
  }

  bool grouped() const {
    return GetParam();
  }

  void make(std::vector<int32_t> bounds, int32_t pages, int32_t page_size) {
    if (grouped())
      cfg.groups = token_groups(std::move(bounds));
    s = std::make_unique<scheduler>(cfg, std::make_unique<id_order_policy>());
    s->set_capacity(pages, page_size);
  }

  void add(sched_request r) {
    ASSERT_EQ(s->add(std::move(r), now), admit_result::ok);
  }

  /// Runs plan `d`: every sampling chunk gets token 7; `overflow` (if not
  /// 0) reports a KV overflow for that request.
  step_update run(const step_draft& d, uint64_t overflow = 0) {
    step_output out;
    out.step = d.plan.step;
    out.num_seqs = int32_t(d.plan.chunks.size());
    for (size_t i = 0; i < d.plan.chunks.size(); ++i)
      if (d.samples[i])
        out.tokens.push_back({d.plan.chunks[i].id, 7, 0});
    if (overflow)
      out.kv_overflows.push_back({overflow, 1, 0});
    return s->update_from_output(out, now);
  }

  static std::vector<uint64_t> added(const step_draft& d) {
    std::vector<uint64_t> ids;
    for (const auto& a : d.plan.added)
      ids.push_back(a.id);
    return ids;
  }

  static bool in_plan(const step_draft& d, uint64_t id) {
    return std::any_of(d.plan.chunks.begin(), d.plan.chunks.end(),
                       [&](const auto& c) { return c.id == id; });
  }
};

TEST_P(grouping_test, admission_takes_lower_groups_first_at_the_band_edges) {
  // Two slots for four waiting requests, the policy's order 1, 2, 3, 4:
  // 1 generated 33 tokens (group 1), 2 generated 32 (group 0), 3 generated
  // 129 (group 2), 4 generated 128 (group 1).
  cfg.limits.max_batch_size = 2;
  make({32, 128}, 256, 16);
  add(make_request(1, 8, 33, 500));
  add(make_request(2, 8, 32, 500));
  add(make_request(3, 8, 129, 500));
  add(make_request(4, 8, 128, 500));
  auto d = s->schedule(now);
  ASSERT_TRUE(d);
  if (grouped()) {
    EXPECT_EQ(added(*d), (std::vector<uint64_t>{2, 1})) << "group 0, then group 1 in policy order";
    EXPECT_EQ(s->group_stats().admissions, 1) << "2 went ahead of 1; 1 kept its place";
  } else {
    EXPECT_EQ(added(*d), (std::vector<uint64_t>{1, 2}));
    EXPECT_EQ(s->group_stats().admissions, 0);
  }
  // The next two slots: 4 (128, group 1) before 3 (129, group 2).
  while (s->find(1) || s->find(2)) {
    run(*d);
    s->abort(1, finish_kind::cancelled, now);
    s->abort(2, finish_kind::cancelled, now);
    d = s->schedule(now);
    ASSERT_TRUE(d);
  }
  if (grouped()) {
    EXPECT_EQ(added(*d), (std::vector<uint64_t>{4, 3}));
    EXPECT_EQ(s->group_stats().admissions, 2);
  } else {
    EXPECT_EQ(added(*d), (std::vector<uint64_t>{3, 4}));
    EXPECT_EQ(s->group_stats().admissions, 0);
  }
  EXPECT_EQ(s->group_stats().preemptions, 0);
  EXPECT_EQ(s->group_stats().decodes, 0);
}

TEST_P(grouping_test, pages_run_out_the_highest_group_is_preempted_first) {
  // Six pages of 4 tokens. X (3 prompt tokens) and A (2 prompt + 10
  // generated: group 2 of bounds 2, 4) are admitted first, B (3 prompt
  // tokens) a step later, which leaves no page free. The step after, X
  // needs a second page: without groups B (the latest admitted) makes room;
  // with groups A (the highest group) does.
  make({2, 4}, 6, 4);
  add(make_request(1, 3, 0, 8));   // X
  add(make_request(2, 2, 10, 16)); // A
  auto d = s->schedule(now);
  ASSERT_TRUE(d);
  ASSERT_EQ(added(*d), (std::vector<uint64_t>{1, 2}));
  run(*d);
  add(make_request(3, 3, 0, 8)); // B
  d = s->schedule(now);
  ASSERT_TRUE(d);
  ASSERT_EQ(added(*d), std::vector<uint64_t>{3});
  EXPECT_EQ(s->free_pages(), 0);
  run(*d);
  d = s->schedule(now);
  ASSERT_TRUE(d);
  EXPECT_TRUE(in_plan(*d, 1));
  EXPECT_EQ(s->preemptions(), 1);
  if (grouped()) {
    EXPECT_EQ(d->plan.released, std::vector<uint64_t>{2});
    EXPECT_TRUE(in_plan(*d, 3)) << "B keeps running";
    EXPECT_EQ(s->group_stats().preemptions, 1);
  } else {
    EXPECT_EQ(d->plan.released, std::vector<uint64_t>{3});
    EXPECT_TRUE(in_plan(*d, 2)) << "A keeps running";
    EXPECT_EQ(s->group_stats().preemptions, 0);
  }
  EXPECT_EQ(s->group_stats().admissions, 0);
}

TEST_P(grouping_test, decodes_short_of_budget_go_lowest_group_first) {
  // A step of 2 tokens. A (group 2 of bounds 2, 4) and B run; A is parked
  // for a KV overflow while C is admitted beside B; A is then kept, and
  // three decodes want a 2-token step: admission order serves A and B,
  // groups serve C (group 0) and B (group 1) and count A's wait.
  cfg.limits.max_num_batched_tokens = 2;
  cfg.limits.max_batch_size = 4;
  make({2, 4}, 64, 4);
  s->set_overflow_supervision(true);
  add(make_request(1, 1, 5, 100)); // A: 6 tokens to compute, 3 steps
  for (int i = 0; i < 3; ++i)
    run(*s->schedule(now));
  add(make_request(2, 1, 0, 100)); // B
  auto d = s->schedule(now);
  ASSERT_TRUE(d);
  ASSERT_EQ(added(*d), std::vector<uint64_t>{2});
  run(*d);
  d = s->schedule(now); // A and B decode; A's overflow parks it
  ASSERT_TRUE(d && in_plan(*d, 1) && in_plan(*d, 2));
  ASSERT_EQ(run(*d, 1).overflows.size(), 1u);
  add(make_request(3, 1, 0, 100)); // C
  d = s->schedule(now);
  ASSERT_TRUE(d);
  EXPECT_FALSE(in_plan(*d, 1)) << "parked";
  ASSERT_EQ(added(*d), std::vector<uint64_t>{3});
  run(*d);
  ASSERT_TRUE(s->keep_overflowed(1, now));
  // A generated 8 tokens (group 2), B 3 (group 1), C 1 (group 0).
  d = s->schedule(now);
  ASSERT_TRUE(d);
  ASSERT_EQ(d->plan.chunks.size(), 2u);
  if (grouped()) {
    EXPECT_TRUE(in_plan(*d, 3));
    EXPECT_TRUE(in_plan(*d, 2));
    EXPECT_FALSE(in_plan(*d, 1));
    EXPECT_EQ(s->group_stats().decodes, 1);
  } else {
    EXPECT_TRUE(in_plan(*d, 1));
    EXPECT_TRUE(in_plan(*d, 2));
    EXPECT_FALSE(in_plan(*d, 3));
    EXPECT_EQ(s->group_stats().decodes, 0);
  }
  EXPECT_EQ(s->group_stats().preemptions, 0);
}

INSTANTIATE_TEST_SUITE_P(with_and_without_groups, grouping_test, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "grouped" : "plain"; });

} // namespace
} // namespace metronome
