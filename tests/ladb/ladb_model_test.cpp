// LADB reorders admissions and splits steps between prompts and decodes;
// neither may change a single token. The scheduler with ladb drives the real
// CPU runner (tiny Mistral, seeded and greedy sampling, chunked prefill,
// preemption) and every request must get exactly its tokens when run alone.

#include <deque>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "actors/kv_page_pool.hpp"
#include "actors/ladb_policy.hpp"
#include "actors/scheduler.hpp"
#include "model/model_runner.hpp"
#include "model/model_weights.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

struct item {
  std::vector<int32_t> prompt;
  sampling_params params;
  uint64_t seed;
  int arrival_step;
};

std::map<uint64_t, std::vector<int32_t>> serve(std::shared_ptr<const model_folder> model,
                                               const std::vector<item>& items,
                                               const std::string& policy, scheduler_config cfg,
                                               int32_t pages, int32_t page_size,
                                               int64_t* preemptions = nullptr) {
  auto ctx = policy_context::make();
  scheduler s(cfg, make_admission_policy(policy, *ctx));
  s.set_capacity(pages, page_size);
  kv_page_pool pool(pages);
  auto runner = make_cpu_runner(model, pages, page_size);
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
  }
  EXPECT_EQ(done, items.size());
  EXPECT_EQ(pool.used_pages(), 0);
  if (preemptions)
    *preemptions = s.preemptions();
  return out;
}

TEST(ladb_with_model, reordering_and_shared_steps_never_change_tokens) {
  auto model = model_folder::open(test::tiny_model("tiny-mistral"));
  std::mt19937 rng(11);
  std::vector<item> items;
  for (int i = 0; i < 24; ++i) {
    item w;
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
    alone[i] = serve(model, {one}, "fcfs", scheduler_config{}, 64, 16)[0];
  }
  scheduler_config tight;
  tight.max_batch_size = 8;
  tight.max_num_batched_tokens = 32;
  for (const char* policy : {"ladb", "srpt", "ladb-literal"}) {
    int64_t preemptions = 0;
    auto together = serve(model, items, policy, tight, 16, 8, &preemptions);
    EXPECT_EQ(together, alone) << policy;
    EXPECT_GT(preemptions, 0) << policy << ": the workload should force preemptions";
  }
}

} // namespace
} // namespace metronome
