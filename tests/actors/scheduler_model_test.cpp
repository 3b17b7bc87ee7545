// The scheduler driving the real CPU runner: whatever the arrivals, batch
// sizes, chunking, pipelining and preemptions, every request's tokens equal
// what the same request produces alone (greedy and seeded sampling).

#include <deque>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "actors/kv_page_pool.hpp"
#include "actors/scheduler.hpp"
#include "model/model_runner.hpp"
#include "model/model_weights.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

struct workload_item {
  std::vector<int32_t> prompt;
  sampling_params params;
  uint64_t seed;
  int arrival_step;
};

/// Runs the workload through a scheduler and a CPU runner; returns outputs.
std::map<uint64_t, std::vector<int32_t>>
serve(std::shared_ptr<const model_folder> model, const std::vector<workload_item>& items,
      scheduler_config cfg, int32_t num_pages, int32_t page_size, int64_t* preemptions = nullptr) {
  scheduler s(cfg, std::make_unique<fcfs_policy>());
  s.set_capacity(num_pages, page_size);
  kv_page_pool pool(num_pages);
  auto runner = make_cpu_runner(model, num_pages, page_size);
  std::map<uint64_t, std::vector<int32_t>> out;
  std::deque<step_draft> inflight;
  size_t next_item = 0;
  size_t done = 0;
  for (int step = 0; done < items.size(); ++step) {
    const sched_time now{step};
    while (next_item < items.size() && items[next_item].arrival_step <= step) {
      sched_request r;
      r.id = next_item;
      r.prompt = items[next_item].prompt;
      r.params = items[next_item].params;
      r.seed = items[next_item].seed;
      EXPECT_EQ(s.add(std::move(r), now), admit_result::ok);
      ++next_item;
    }
    while (auto d = s.schedule(now)) {
      assign_pages(*d, pool);
      if (!d->plan.chunks.empty())
        inflight.push_back(std::move(*d));
    }
    if (inflight.empty())
      continue;
    auto result = runner->execute(inflight.front().plan);
    inflight.pop_front();
    auto u = s.update_from_output(result, now);
    for (const auto& t : u.tokens)
      out[t.id].push_back(t.token);
    for (auto id : u.to_free)
      EXPECT_TRUE(pool.release(id));
    done += u.finished.size();
    EXPECT_LT(step, 100000) << "no progress";
  }
  EXPECT_EQ(pool.used_pages(), 0);
  EXPECT_EQ(pool.unmatched_frees(), 0);
  if (preemptions)
    *preemptions = s.preemptions();
  return out;
}

TEST(scheduler_with_model, batching_chunking_and_preemption_never_change_tokens) {
  // Mistral's sliding window makes resumed sequences attend differently
  // from fresh ones if anything about positions were off.
  auto model = model_folder::open(test::tiny_model("tiny-mistral"));
  std::mt19937 rng(5);
  std::vector<workload_item> items;
  for (int i = 0; i < 24; ++i) {
    workload_item w;
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
    alone[i] = serve(model, {one}, scheduler_config{}, 64, 16)[0];
    EXPECT_EQ(int32_t(alone[i].size()), items[i].params.max_tokens);
  }

  // Together: small token budget (chunked prefill), few pages (preemption).
  scheduler_config tight;
  tight.max_batch_size = 8;
  tight.max_num_batched_tokens = 24;
  int64_t preemptions = 0;
  auto together = serve(model, items, tight, 12, 8, &preemptions);
  EXPECT_GT(preemptions, 0) << "the workload should force preemptions";
  EXPECT_EQ(together, alone);
}

} // namespace
} // namespace metronome
