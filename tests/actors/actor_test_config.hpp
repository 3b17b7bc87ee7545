#pragma once
// The CAF configuration of tests that run engine actors on real threads.

#include <filesystem>
#include <vector>

#include "caf/all.hpp"

#include "actors/messages.hpp"
#include "model/model_runner.hpp"
#include "model/model_weights.hpp"
#include "tests/model/test_support.hpp"

namespace metronome::test {

struct actor_test_config : caf::actor_system_config {
  actor_test_config() {
    register_message_types(*this);
    set("scheduler.max-threads", 2);
  }
};

/// The tiny llama3-style model the engine tests serve (test::served_model).
inline std::filesystem::path chat_model() {
  return served_model("tiny-llama3", "llama3");
}

/// The greedy continuation of `prompt` (`n` tokens) by chat_model()'s CPU
/// runner alone, with no engine around it: what an engine must reproduce.
/// The prompt's prefill gets KV pages `pages` (of 16 tokens; 8 in all).
inline std::vector<int32_t> greedy_alone(const std::vector<int32_t>& prompt, int n,
                                         std::vector<int32_t> pages) {
  auto runner = make_cpu_runner(model_folder::open(chat_model()),
                                {.page_size = 16, .kv_cache_tokens = 8 * 16});
  step_plan plan;
  sampling_params greedy;
  greedy.temperature = 0;
  plan.added.push_back({1, prompt, greedy, 0});
  plan.chunks.push_back({1, int32_t(prompt.size()), std::move(pages)});
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(runner->execute(plan).tokens.at(0).token);
    plan = {};
    plan.chunks.push_back({1, 1, {}});
  }
  return out;
}

} // namespace metronome::test
