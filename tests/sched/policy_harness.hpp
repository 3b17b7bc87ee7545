#pragma once
// A scheduler with a policy as a pure state machine (no runner): add
// requests, make plans, feed back one token per sampling chunk. Shared by the
// policy tests.

#include <functional>
#include <memory>
#include <numeric>

#include <gtest/gtest.h>

#include "sched/ladb_policy.hpp"
#include "sched/scheduler.hpp"

namespace metronome::test {

inline sched_request make_request(uint64_t id, int32_t prompt_len, int32_t max_tokens,
                                  sched_time arrival = sched_time{0}) {
  sched_request r;
  r.id = id;
  r.prompt.resize(size_t(prompt_len));
  std::iota(r.prompt.begin(), r.prompt.end(), 100);
  r.params.max_tokens = max_tokens;
  r.stop_ids = {2};
  r.arrival = arrival;
  return r;
}

class policy_harness {
public:
  /// The engine's default limits, the context resolved as spawn_engine
  /// would for a model of 4,096 positions.
  scheduler_config cfg = [] {
    scheduler_config c;
    c.limits.max_model_len = 4096;
    return c;
  }();
  std::unique_ptr<scheduler> s;
  sched_time now{0};
  /// Token to emit for a request (default 7, never a stop token).
  std::function<int32_t(uint64_t)> token_for;

  void make(std::unique_ptr<admission_policy> p, int32_t pages = 4096, int32_t page_size = 16) {
    s = std::make_unique<scheduler>(cfg, std::move(p));
    s->set_capacity(pages, page_size);
  }

  void add(sched_request r) {
    r.arrival = now;
    ASSERT_EQ(s->add(std::move(r), now), admit_result::ok);
  }

  std::optional<step_draft> next() {
    return s->schedule(now);
  }

  step_update run(const step_draft& d) {
    step_output out;
    out.step = d.plan.step;
    out.num_seqs = int32_t(d.plan.chunks.size());
    for (size_t i = 0; i < d.plan.chunks.size(); ++i)
      if (d.samples[i]) {
        const auto id = d.plan.chunks[i].id;
        out.tokens.push_back({id, token_for ? token_for(id) : 7, 0});
      }
    return s->update_from_output(out, now);
  }

  /// Ids newly admitted by a plan, in admission order.
  static std::vector<uint64_t> admitted(const step_draft& d) {
    std::vector<uint64_t> ids;
    for (const auto& a : d.plan.added)
      ids.push_back(a.id);
    return ids;
  }

  static int32_t tokens_of(const step_plan& p, uint64_t id) {
    for (const auto& c : p.chunks)
      if (c.id == id)
        return c.num_tokens;
    return 0;
  }

  /// Prompt tokens of a plan: chunks that are not single-token decodes of
  /// running requests (first chunks of added requests count fully).
  static int32_t prompt_tokens(const step_draft& d) {
    int32_t n = 0;
    for (size_t i = 0; i < d.plan.chunks.size(); ++i)
      if (d.plan.chunks[i].num_tokens > 1)
        n += d.plan.chunks[i].num_tokens;
    return n;
  }
};

} // namespace metronome::test
