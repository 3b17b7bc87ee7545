// LADB reorders admissions and splits steps between prompts and decodes;
// neither may change a single token. The scheduler with ladb drives the real
// CPU runner (tiny Mistral, seeded and greedy sampling, chunked prefill,
// preemption) and every request must get exactly its tokens when run alone.

#include <deque>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "sched/ladb_policy.hpp"
#include "sched/scheduler.hpp"
#include "model/model_runner.hpp"
#include "model/model_weights.hpp"
#include "tests/sched/runner_harness.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

using test::workload_item;

std::map<uint64_t, std::vector<int32_t>> serve(std::shared_ptr<const model_folder> model,
                                               const std::vector<workload_item>& items,
                                               policy_kind policy, scheduler_config cfg,
                                               int32_t pages, int32_t page_size,
                                               int64_t* preemptions = nullptr) {
  auto ctx = policy_context::make();
  return test::serve_through_runner(model, items, make_admission_policy(policy, *ctx), cfg, pages,
                                    page_size, preemptions);
}

TEST(ladb_with_model, reordering_and_shared_steps_never_change_tokens) {
  auto model = model_folder::open(test::tiny_model("tiny-mistral"));
  std::mt19937 rng(11);
  std::vector<workload_item> items;
  for (int i = 0; i < 24; ++i) {
    workload_item w;
    w.prompt.resize(size_t(rng() % 60 + 1));
    for (auto& t : w.prompt)
      t = int32_t(rng() % 32000);
    w.params.max_tokens = int32_t(rng() % 24 + 1);
    w.params.temperature = i % 3 == 0 ? 0.0f : 0.9f;
    w.params.ignore_eos = true;
    w.seed = uint64_t(500 + i);
    w.arrival_step = int(rng() % 20);
    items.push_back(w);
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& a, const auto& b) { return a.arrival_step < b.arrival_step; });
  std::map<uint64_t, std::vector<int32_t>> alone;
  for (size_t i = 0; i < items.size(); ++i) {
    auto one = items[i];
    one.arrival_step = 0;
    alone[i] = serve(model, {one}, policy_kind::fcfs, scheduler_config{}, 64, 16)[0];
  }
  scheduler_config tight;
  tight.limits.max_batch_size = 8;
  tight.limits.max_num_batched_tokens = 32;
  for (auto policy : {policy_kind::ladb, policy_kind::srpt, policy_kind::ladb_literal}) {
    int64_t preemptions = 0;
    auto together = serve(model, items, policy, tight, 16, 8, &preemptions);
    EXPECT_EQ(together, alone) << to_string(policy);
    EXPECT_GT(preemptions, 0) << to_string(policy) << ": the workload should force preemptions";
  }
}

} // namespace
} // namespace metronome
