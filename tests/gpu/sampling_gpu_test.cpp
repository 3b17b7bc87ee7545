// GPU sampling against sequence_sampler (model/sampling.cpp) on the same
// logits: greedy, temperature, top-k, top-p, min-p, their combinations,
// penalties, ties, seeded streams. Token ids must be identical and
// log-probabilities within 1e-4; so must the model's log-probabilities that
// rows asking for logprobs report (the sampled token's, then the top n).

#include <algorithm>
#include <map>

#include "model/sampling.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace metronome {
namespace {

using test::dev_array;

struct row_case {
  sampling_params params;
  uint64_t seed = 0;
  std::vector<int32_t> prompt;
  std::vector<int32_t> outputs; // tokens sampled before this step
};

std::vector<sampling_params> settings() {
  auto p = [](float t, int32_t k, float top_p, float min_p) {
    sampling_params s;
    s.temperature = t;
    s.top_k = k;
    s.top_p = top_p;
    s.min_p = min_p;
    return s;
  };
  std::vector<sampling_params> out = {
    p(0, 0, 1, 0),     p(1, 0, 1, 0),      p(0.7f, 50, 1, 0),  p(1, 0, 0.9f, 0),
    p(0.8f, 0, 1, 0.05f), p(1.2f, 100, 0.8f, 0.02f), p(1, 1, 1, 0), p(1, 0, 0.01f, 0),
    p(0.5f, 7, 0.5f, 0), p(2, 0, 1, 0.3f),
  };
  auto pen = p(0, 0, 1, 0);
  pen.repetition_penalty = 1.5f;
  pen.frequency_penalty = 0.7f;
  pen.presence_penalty = 0.4f;
  out.push_back(pen);
  auto pen2 = p(0.9f, 0, 0.95f, 0);
  pen2.repetition_penalty = 0.8f;
  pen2.frequency_penalty = -0.5f;
  out.push_back(pen2);
  auto pen3 = p(1, 40, 1, 0);
  pen3.presence_penalty = 1.5f;
  out.push_back(pen3);
  return out;
}

/// The CPU sampler after `outputs` were sampled (forced by one-hot logits).
std::pair<int32_t, float> cpu_sample(const row_case& r, std::vector<float> logits,
                                     std::vector<token_logprob>* model_logprobs = nullptr) {
  sequence_sampler s(r.params, r.prompt, r.seed);
  std::vector<float> spike(logits.size());
  for (auto t : r.outputs) {
    std::fill(spike.begin(), spike.end(), 0.0f);
    spike[size_t(t)] = 1000.0f;
    auto [got, _] = s.sample(spike);
    EXPECT_EQ(got, t) << "forcing an output token failed";
  }
  return s.sample(logits, model_logprobs);
}

/// The penalty entries the runner sends for this row.
void add_entries(const row_case& r, int32_t row, std::vector<gpu::penalty_entry>& out) {
  const auto& p = r.params;
  if (p.repetition_penalty == 1.0f && p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f)
    return;
  std::map<int32_t, int32_t> counts;
  for (auto t : r.outputs)
    ++counts[t];
  std::vector<int32_t> prompt = r.prompt;
  std::sort(prompt.begin(), prompt.end());
  prompt.erase(std::unique(prompt.begin(), prompt.end()), prompt.end());
  const bool rep = p.repetition_penalty != 1.0f;
  if (rep)
    for (auto t : prompt)
      out.push_back({row, t, counts.contains(t) ? counts[t] : 0, 1});
  for (auto [t, c] : counts)
    if (!rep || !std::binary_search(prompt.begin(), prompt.end(), t))
      out.push_back({row, t, c, rep ? 1 : 0});
}

void run_trial(std::mt19937_64& rng, int32_t vocab, bool ties) {
  const auto sets = settings();
  const int32_t rows = int32_t(sets.size());
  std::vector<row_case> cases(static_cast<size_t>(rows));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(size_t(rows) * vocab);
  const float scale = std::uniform_real_distribution<float>(0.5f, 6.0f)(rng);
  for (auto& l : logits) {
    l = normal(rng) * scale;
    if (ties)
      l = std::round(l * 2.0f) / 2.0f; // many equal logits, -0.0 and +0.0 among them
  }
  std::uniform_int_distribution<int32_t> tok(0, std::min(vocab - 1, 300));
  for (int32_t r = 0; r < rows; ++r) {
    auto& c = cases[size_t(r)];
    c.params = sets[size_t(r)];
    // Every third row reports nothing; the others 0 to max_logprobs alternatives.
    c.params.logprobs = r % 3 == 2 ? -1 : int32_t(rng() % (max_logprobs + 1));
    c.seed = rng();
    const int32_t n_prompt = int32_t(rng() % 20) + 1, n_out = int32_t(rng() % 12);
    for (int32_t i = 0; i < n_prompt; ++i)
      c.prompt.push_back(tok(rng));
    for (int32_t i = 0; i < n_out; ++i)
      c.outputs.push_back(tok(rng));
  }
  // Device inputs.
  std::vector<float> temperature, top_p, min_p, rep, freq, pres;
  std::vector<int32_t> top_k, step, lp_count;
  std::vector<uint64_t> seed;
  std::vector<gpu::penalty_entry> entries;
  for (int32_t r = 0; r < rows; ++r) {
    const auto& c = cases[size_t(r)];
    temperature.push_back(c.params.temperature);
    top_p.push_back(c.params.top_p);
    min_p.push_back(c.params.min_p);
    top_k.push_back(c.params.top_k);
    rep.push_back(c.params.repetition_penalty);
    freq.push_back(c.params.frequency_penalty);
    pres.push_back(c.params.presence_penalty);
    seed.push_back(c.seed);
    step.push_back(int32_t(c.outputs.size()));
    lp_count.push_back(c.params.logprobs);
    add_entries(c, r, entries);
  }
  dev_array<float> d_logits(logits), d_t(temperature), d_p(top_p), d_m(min_p), d_rep(rep),
    d_freq(freq), d_pres(pres);
  dev_array<int32_t> d_k(top_k), d_step(step), d_count(std::vector<int32_t>{int32_t(entries.size())});
  dev_array<uint64_t> d_seed(seed);
  dev_array<gpu::penalty_entry> d_entries(entries.empty() ? std::vector<gpu::penalty_entry>(1)
                                                          : entries);
  dev_array<int32_t> d_tokens(static_cast<size_t>(rows));
  dev_array<float> d_logprobs(static_cast<size_t>(rows));
  gpu::device_buffer ws(gpu::sample_workspace_bytes(rows));
  gpu::sample_rows sr{d_t.get(), d_p.get(), d_m.get(), d_k.get(), d_seed.get(), d_step.get()};
  constexpr int32_t stride = 1 + max_logprobs;
  dev_array<int32_t> d_lp_count(lp_count);
  dev_array<float> d_raw(logits.size());
  dev_array<double> d_lse(static_cast<size_t>(rows));
  // Poisoned: an entry the kernels should write and did not shows.
  dev_array<int32_t> d_lp_tokens(std::vector<int32_t>(size_t(rows) * stride, -7));
  dev_array<float> d_lp_values(std::vector<float>(size_t(rows) * stride, 1e30f));
  gpu::logprob_rows lp{d_lp_count.get(), d_raw.get(), d_lse.get(), d_lp_tokens.get(),
                       d_lp_values.get()};
  gpu::launch_model_logprobs(d_logits.get(), rows, vocab, lp, nullptr);
  gpu::launch_penalties(d_logits.get(), vocab, d_entries.get(), d_count.get(),
                        int32_t(entries.size()), d_rep.get(), d_freq.get(), d_pres.get(), nullptr);
  gpu::launch_sample(d_logits.get(), rows, vocab, sr, d_tokens.get(), d_logprobs.get(), ws.get(),
                     nullptr, &lp);
  test::sync_check();
  const auto got = d_tokens.download();
  const auto got_lp = d_logprobs.download();
  const auto got_model_tokens = d_lp_tokens.download();
  const auto got_model_values = d_lp_values.download();
  for (int32_t r = 0; r < rows; ++r) {
    std::vector<float> row(logits.begin() + int64_t(r) * vocab,
                           logits.begin() + int64_t(r + 1) * vocab);
    std::vector<token_logprob> want_model;
    auto [want, want_lp] = cpu_sample(cases[size_t(r)], row, &want_model);
    const auto& p = cases[size_t(r)].params;
    const size_t at = size_t(r) * stride;
    if (p.logprobs < 0) {
      EXPECT_TRUE(want_model.empty());
      EXPECT_EQ(got_model_tokens[at], -7) << "row " << r << " asked for no logprobs";
    } else {
      ASSERT_EQ(want_model.size(), size_t(p.logprobs) + 1);
      for (size_t k = 0; k < want_model.size(); ++k) {
        EXPECT_EQ(got_model_tokens[at + k], want_model[k].token)
          << "row " << r << " entry " << k << " of " << p.logprobs << " vocab " << vocab
          << " ties " << ties;
        EXPECT_NEAR(got_model_values[at + k], want_model[k].logprob,
                    1e-4 + 1e-5 * std::abs(want_model[k].logprob))
          << "row " << r << " entry " << k;
      }
      if (want_model.size() < size_t(stride))
        EXPECT_EQ(got_model_tokens[at + want_model.size()], -7) << "row " << r;
    }
    EXPECT_EQ(got[size_t(r)], want)
      << "row " << r << " vocab " << vocab << " ties " << ties << " t " << p.temperature
      << " k " << p.top_k << " p " << p.top_p << " min_p " << p.min_p << " rep "
      << p.repetition_penalty;
    EXPECT_NEAR(got_lp[size_t(r)], want_lp, 1e-4 + 1e-5 * std::abs(want_lp)) << "row " << r;
  }
}

TEST(gpu_sampling, matches_the_cpu_sampler_on_the_same_logits) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("sampling");
  const int trials = test::quick_mode() ? 1 : 6;
  for (int i = 0; i < trials; ++i) {
    run_trial(rng, 1000, false);
    run_trial(rng, 32000, i % 2 == 1);
    run_trial(rng, 128256, false);
    // The scalar path of stats_kernel (vocab not a multiple of 4) and parts
    // longer than one batch of 16 x 256 (more than 131,072 logits).
    run_trial(rng, 32001, i % 2 == 0);
    run_trial(rng, 151936, false);
  }
}

TEST(gpu_sampling, ties_are_broken_by_index_as_on_the_cpu) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("sampling_ties");
  for (int i = 0; i < (test::quick_mode() ? 1 : 4); ++i)
    run_trial(rng, 5000, true);
}

} // namespace
} // namespace metronome
