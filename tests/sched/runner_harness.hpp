#pragma once
// Drives the plain scheduler and the real CPU runner together, as the engine
// does but synchronously, one step per millisecond of virtual time: the
// harness of the "batching never changes tokens" tests of every policy.

#include <deque>
#include <map>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "sched/kv_page_pool.hpp"
#include "sched/scheduler.hpp"
#include "model/model_runner.hpp"
#include "model/model_weights.hpp"

namespace metronome::test {

/// One request of a workload.
struct workload_item {
  std::vector<int32_t> prompt;
  sampling_params params;
  uint64_t seed = 0;
  /// The step (millisecond) it arrives at; items sorted by it.
  int arrival_step = 0;
};

/// Runs `items` through a scheduler with `policy` and a CPU runner with
/// `num_pages` pages; returns each request's tokens by index. Checks that
/// every request finishes and every page comes back exactly once.
inline std::map<uint64_t, std::vector<int32_t>>
serve_through_runner(std::shared_ptr<const model_folder> model,
                     const std::vector<workload_item>& items,
                     std::unique_ptr<admission_policy> policy, scheduler_config cfg,
                     int32_t num_pages, int32_t page_size, int64_t* preemptions = nullptr,
                     int64_t* prefix_hits = nullptr) {
  // max_model_len 0: the model's context, as spawn_engine resolves it.
  if (cfg.limits.max_model_len <= 0)
    cfg.limits.max_model_len = model->config.max_position_embeddings;
  scheduler s(cfg, std::move(policy));
  s.set_capacity(num_pages, page_size);
  auto runner = make_cpu_runner(model, {.page_size = page_size,
                                        .kv_cache_tokens = int64_t(num_pages) * page_size});
  std::map<uint64_t, std::vector<int32_t>> out;
  std::deque<step_draft> inflight;
  size_t next = 0, done = 0;
  for (int step = 0; done < items.size() && step < 100000; ++step) {
    const sched_time now{std::chrono::milliseconds(step)};
    while (next < items.size() && items[next].arrival_step <= step) {
      sched_request r;
      r.id = next;
      r.prompt = items[next].prompt;
      r.params = items[next].params;
      r.seed = items[next].seed;
      EXPECT_EQ(s.add(std::move(r), now), admit_result::ok);
      ++next;
    }
    while (auto d = s.schedule(now))
      inflight.push_back(std::move(*d));
    if (inflight.empty())
      continue;
    auto result = runner->execute(inflight.front().plan);
    inflight.pop_front();
    auto u = s.update_from_output(result, now);
    for (const auto& t : u.tokens)
      out[t.id].push_back(t.token);
    done += u.finished.size();
  }
  EXPECT_EQ(done, items.size()) << "not every request finished";
  EXPECT_EQ(s.used_pages(), 0);
  EXPECT_EQ(s.pages().sequences(), 0);
  EXPECT_EQ(s.pages().unmatched_frees(), 0);
  if (preemptions)
    *preemptions = s.preemptions();
  if (prefix_hits)
    *prefix_hits = s.prefix_hits();
  return out;
}

} // namespace metronome::test
