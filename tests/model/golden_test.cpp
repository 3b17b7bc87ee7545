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

#include "model/cpu_engine.hpp"
#include "model/model_runner.hpp"
#include "model/sampling.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

using nlohmann::json;

constexpr double tolerance = 1e-4;

json load_golden(const std::string& preset) {
  auto path = test::env("SOURCE_DIR") + "/tools/golden/" + preset + ".json";
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  return json::parse(in);
}

/// Largest |ours - ref| over the reference's top and probe entries, relative
/// to the reference's largest absolute logit.
double relative_error(std::span<const float> ours, const json& ref, const json& probe_ids) {
  double worst = 0;
  auto compare = [&](int64_t id, double expected) {
    worst = std::max(worst, std::abs(double(ours[size_t(id)]) - expected));
  };
  for (size_t i = 0; i < ref["top_ids"].size(); ++i)
    compare(ref["top_ids"][i].get<int64_t>(), ref["top_logits"][i].get<double>());
  for (size_t i = 0; i < probe_ids.size(); ++i)
    compare(probe_ids[i].get<int64_t>(), ref["probe_logits"][i].get<double>());
  double max_abs = 0;
  for (float v : ours)
    max_abs = std::max(max_abs, double(std::abs(v)));
  worst = std::max(worst, std::abs(max_abs - ref["max_abs"].get<double>()));
  return worst / ref["max_abs"].get<double>();
}

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
  const auto& runs = ref["runs"];
  const size_t n = runs.size();
  const int32_t vocab = model->config.vocab_size;
  const int32_t page_size = 16, pages_per_seq = 4;
  cpu_engine engine(model, int32_t(n) * pages_per_seq, page_size);

  // Sequences use interleaved, non-contiguous pages: seq i owns i, i + n, ...
  std::vector<std::vector<int32_t>> tokens(n), pages(n);
  for (size_t i = 0; i < n; ++i) {
    tokens[i] = runs[i]["prompt"].get<std::vector<int32_t>>();
    for (int32_t p = 0; p < pages_per_seq; ++p)
      pages[i].push_back(int32_t(i) + p * int32_t(n));
  }
  std::vector<int32_t> start(n, 0);
  std::vector<float> logits(n * size_t(vocab));
  const size_t steps = ref["steps_per_prompt"].get<size_t>();
  for (size_t step = 0; step < steps; ++step) {
    std::vector<forward_input> batch;
    for (size_t i = 0; i < n; ++i)
      batch.push_back({std::span<const int32_t>(tokens[i]).subspan(size_t(start[i])), start[i],
                       pages[i]});
    engine.forward(batch, logits);
    for (size_t i = 0; i < n; ++i) {
      std::span<const float> row(logits.data() + i * size_t(vocab), size_t(vocab));
      const auto& expected = runs[i]["steps"][step];
      EXPECT_EQ(argmax(row), expected["argmax"].get<int32_t>())
        << GetParam() << " prompt " << i << " step " << step;
      EXPECT_LE(relative_error(row, expected, ref["probe_ids"]), tolerance)
        << GetParam() << " prompt " << i << " step " << step;
      // Continue with the reference's token so one miss cannot cascade.
      start[i] = int32_t(tokens[i].size());
      tokens[i].push_back(expected["argmax"].get<int32_t>());
    }
  }
}

TEST_P(golden, runner_generates_the_reference_greedy_ids) {
  auto ref = load_golden(GetParam());
  auto model = model_folder::open(test::tiny_model(GetParam(), ref["seed"].get<uint64_t>()));
  auto runner = make_cpu_runner(model, {.page_size = 8, .kv_cache_tokens = 64 * 8});
  const auto& runs = ref["runs"];
  const int32_t steps = ref["steps_per_prompt"].get<int32_t>();
  step_plan plan;
  int32_t next_page = 0;
  std::vector<std::vector<int32_t>> got(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    sampling_params greedy;
    greedy.temperature = 0;
    greedy.max_tokens = steps;
    auto prompt = runs[i]["prompt"].get<std::vector<int32_t>>();
    scheduled_chunk chunk{i, int32_t(prompt.size()), {}};
    for (int32_t p = 0; p < (int32_t(prompt.size()) + steps + 7) / 8; ++p)
      chunk.new_pages.push_back(next_page++);
    plan.added.push_back({i, prompt, greedy, 0});
    plan.chunks.push_back(chunk);
  }
  for (int32_t s = 0; s < steps; ++s) {
    plan.step = uint64_t(s);
    auto out = runner->execute(plan);
    ASSERT_EQ(out.tokens.size(), runs.size());
    for (const auto& t : out.tokens)
      got[t.id].push_back(t.token);
    plan = step_plan{};
    for (size_t i = 0; i < runs.size(); ++i)
      plan.chunks.push_back({i, 1, {}});
  }
  for (size_t i = 0; i < runs.size(); ++i)
    EXPECT_EQ(got[i], runs[i]["greedy_ids"].get<std::vector<int32_t>>()) << "prompt " << i;
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
