// The scheduler driving the real CPU runner: whatever the arrivals, batch
// sizes, chunking, pipelining and preemptions, every request's tokens equal
// what the same request produces alone (greedy and seeded sampling).

#include <map>
#include <random>

#include <gtest/gtest.h>

#include "tests/sched/runner_harness.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

TEST(scheduler_with_model, batching_chunking_and_preemption_never_change_tokens) {
  // Mistral's sliding window makes resumed sequences attend differently
  // from fresh ones if anything about positions were off.
  auto model = model_folder::open(test::tiny_model("tiny-mistral"));
  std::mt19937 rng(5);
  std::vector<test::workload_item> items;
  for (int i = 0; i < 24; ++i) {
    test::workload_item w;
    w.prompt.resize(size_t(rng() % 40 + 1));
    for (auto& t : w.prompt)
      t = int32_t(rng() % 32000);
    w.params.max_tokens = int32_t(rng() % 24 + 1);
    w.params.temperature = i % 3 == 0 ? 0.0f : 0.9f;
    w.params.top_p = i % 2 == 0 ? 1.0f : 0.8f;
    w.params.frequency_penalty = i % 4 == 0 ? 0.5f : 0.0f;
    w.params.ignore_eos = true;
    w.seed = uint64_t(1000 + i);
    w.arrival_step = int(rng() % 30);
    items.push_back(w);
  }
  std::sort(items.begin(), items.end(),
            [](const auto& a, const auto& b) { return a.arrival_step < b.arrival_step; });

  // Alone: one request at a time, plenty of memory, no chunking.
  std::map<uint64_t, std::vector<int32_t>> alone;
  for (size_t i = 0; i < items.size(); ++i) {
    auto one = items[i];
    one.arrival_step = 0;
    alone[i] = test::serve_through_runner(model, {one}, std::make_unique<fcfs_policy>(),
                                      scheduler_config{}, 64, 16)[0];
    EXPECT_EQ(int32_t(alone[i].size()), items[i].params.max_tokens);
  }

  // Together: small token budget (chunked prefill), few pages (preemption).
  scheduler_config tight;
  tight.limits.max_batch_size = 8;
  tight.limits.max_num_batched_tokens = 24;
  int64_t preemptions = 0;
  auto together = test::serve_through_runner(model, items, std::make_unique<fcfs_policy>(),
                                             tight, 12, 8, &preemptions);
  EXPECT_GT(preemptions, 0) << "the workload should force preemptions";
  EXPECT_EQ(together, alone);
}

} // namespace
} // namespace metronome
