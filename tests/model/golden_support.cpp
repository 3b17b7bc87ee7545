#include "tests/model/golden_support.hpp"

#include <cmath>
#include <fstream>

#include <gtest/gtest.h>

#include "model/cpu_engine.hpp"
#include "model/model_runner.hpp"
#include "model/sampling.hpp"
#include "tests/test_env.hpp"

namespace metronome::test {

using nlohmann::json;

json load_golden(const std::filesystem::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot open " << path;
  return json::parse(in);
}

json load_golden(const std::string& preset) {
  return load_golden(std::filesystem::path(env("SOURCE_DIR")) / "tools" / "golden"
                     / (preset + ".json"));
}

double golden_relative_error(std::span<const float> ours, const json& ref, const json& probe_ids) {
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

std::vector<float> expect_engine_matches_golden(std::shared_ptr<const model_folder> model,
                                                const json& ref, const std::string& label) {
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
  std::vector<float> logits(n * size_t(vocab)), all;
  const size_t steps = ref["steps_per_prompt"].get<size_t>();
  for (size_t step = 0; step < steps; ++step) {
    std::vector<forward_input> batch;
    for (size_t i = 0; i < n; ++i)
      batch.push_back({std::span<const int32_t>(tokens[i]).subspan(size_t(start[i])), start[i],
                       pages[i]});
    engine.forward(batch, logits);
    all.insert(all.end(), logits.begin(), logits.end());
    for (size_t i = 0; i < n; ++i) {
      std::span<const float> row(logits.data() + i * size_t(vocab), size_t(vocab));
      const auto& expected = runs[i]["steps"][step];
      EXPECT_EQ(argmax(row), expected["argmax"].get<int32_t>())
        << label << " prompt " << i << " step " << step;
      EXPECT_LE(golden_relative_error(row, expected, ref["probe_ids"]), golden_tolerance)
        << label << " prompt " << i << " step " << step;
      // Continue with the reference's token so one miss cannot cascade.
      start[i] = int32_t(tokens[i].size());
      tokens[i].push_back(expected["argmax"].get<int32_t>());
    }
  }
  return all;
}

void expect_runner_greedy_ids(std::shared_ptr<const model_folder> model, const json& ref,
                              const std::string& label) {
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
    EXPECT_EQ(got[i], runs[i]["greedy_ids"].get<std::vector<int32_t>>())
      << label << " prompt " << i;
}

} // namespace metronome::test
