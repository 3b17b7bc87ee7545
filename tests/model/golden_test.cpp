// The CPU engine against Hugging Face transformers (float32), on the three
// tiny presets: tools/golden/<preset>.json holds, for three prompts of
// different lengths, the reference logits of the prefill and of 16 greedy
// decode steps (made by tools/golden/hf_reference.py on the GPU machine).
// Here the three prompts run as ONE batch through the engine; every step must
// give the reference's greedy id and logits within 1e-4 of the largest
// absolute logit.

#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/model_runner.hpp"
#include "model/sampling.hpp"
#include "tests/model/golden_support.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

using nlohmann::json;
using test::load_golden;

class golden : public ::testing::TestWithParam<std::string> {};

TEST_P(golden, make_model_writes_the_same_bytes_as_on_the_reference_machine) {
  auto ref = load_golden(GetParam());
  auto dir = test::tiny_model(GetParam(), ref["seed"].get<uint64_t>());
  auto r = test::run_command("sha256sum " + test::shell_quote((dir / "model.safetensors").string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.substr(0, 64), ref["weights_sha256"].get<std::string>());
}

TEST_P(golden, batched_prefill_and_greedy_decode_match_transformers) {
  auto ref = load_golden(GetParam());
  auto model = model_folder::open(test::tiny_model(GetParam(), ref["seed"].get<uint64_t>()));
  test::expect_engine_matches_golden(model, ref, GetParam());
}

TEST_P(golden, runner_generates_the_reference_greedy_ids) {
  auto ref = load_golden(GetParam());
  auto model = model_folder::open(test::tiny_model(GetParam(), ref["seed"].get<uint64_t>()));
  test::expect_runner_greedy_ids(model, ref, GetParam());
}

// logprobs: the CPU runner's reports against transformers' generate() on the
// same prompts, greedy (tools/golden/<preset>-logprobs.json).
TEST_P(golden, runner_reports_the_logprobs_of_transformers) {
  const auto ref = test::load_reference_logprobs(GetParam());
  auto model = model_folder::open(test::tiny_model(GetParam(), 7));
  auto runner = make_cpu_runner(model, {.page_size = 8, .kv_cache_tokens = 64 * 8});
  const int32_t steps = int32_t(ref.runs.at(0).steps.size());
  step_plan plan;
  int32_t next_page = 0;
  for (size_t i = 0; i < ref.runs.size(); ++i) {
    sampling_params p;
    p.temperature = 0;
    p.max_tokens = steps;
    p.logprobs = ref.top;
    const auto& prompt = ref.runs[i].prompt;
    scheduled_chunk chunk{i, int32_t(prompt.size()), {}};
    for (int32_t k = 0; k < (int32_t(prompt.size()) + steps + 7) / 8; ++k)
      chunk.new_pages.push_back(next_page++);
    plan.added.push_back({i, prompt, p, 0});
    plan.chunks.push_back(chunk);
  }
  std::vector<bool> diverged(ref.runs.size(), false);
  for (int32_t s = 0; s < steps; ++s) {
    plan.step = uint64_t(s);
    auto out = runner->execute(plan);
    ASSERT_EQ(out.tokens.size(), ref.runs.size());
    for (const auto& t : out.tokens) {
      if (diverged[t.id])
        continue;
      const auto& want = ref.runs[t.id].steps[size_t(s)];
      test::expect_logprobs_near(want, t.logprobs, size_t(ref.top), 2e-4,
                                 GetParam() + " prompt " + std::to_string(t.id) + " step "
                                   + std::to_string(s));
      if (t.token != want.token) {
        // Only a near-tie of the reference may part the sequences.
        EXPECT_LE(want.logprob - t.logprobs.at(0).logprob, 2e-4) << "prompt " << t.id;
        diverged[t.id] = true;
      }
    }
    plan = step_plan{};
    for (size_t i = 0; i < ref.runs.size(); ++i)
      plan.chunks.push_back({i, 1, {}});
  }
}

INSTANTIATE_TEST_SUITE_P(presets, golden,
                         ::testing::Values("tiny-llama3", "tiny-qwen2", "tiny-mistral"),
                         [](const auto& info) {
                           auto s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

} // namespace
} // namespace metronome
