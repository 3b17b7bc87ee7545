#include "tests/gpu/runner_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "model/cpu_engine.hpp"
#include "model/make_model.hpp"
#include "tests/model/test_support.hpp"

namespace metronome::test {

std::vector<float> cpu_logits(const std::shared_ptr<const model_folder>& model,
                              const std::vector<int32_t>& tokens, bool kv_fp8) {
  const int32_t page = 16;
  const int32_t pages = int32_t((tokens.size() + page - 1) / page);
  cpu_engine engine(model, pages, page);
  engine.set_kv_fp8(kv_fp8);
  std::vector<int32_t> table(static_cast<size_t>(pages));
  for (int32_t i = 0; i < pages; ++i)
    table[size_t(i)] = i;
  forward_input in{tokens, 0, table};
  std::vector<float> logits(static_cast<size_t>(model->config.vocab_size));
  engine.forward(std::span<const forward_input>(&in, 1), logits);
  return logits;
}

double shortfall(const std::vector<float>& logits, int32_t token) {
  float best = -INFINITY, scale = 0;
  for (float l : logits) {
    best = std::max(best, l);
    scale = std::max(scale, std::abs(l));
  }
  return double(best - logits[size_t(token)]) / double(scale);
}

int32_t expect_greedy_matches_cpu(const std::shared_ptr<const model_folder>& model,
                                  const std::vector<int32_t>& prompt,
                                  const std::vector<int32_t>& ids, const std::string& what,
                                  bool kv_fp8) {
  std::vector<int32_t> seq = prompt;
  int32_t exact = 0;
  for (size_t s = 0; s < ids.size(); ++s) {
    auto logits = cpu_logits(model, seq, kv_fp8);
    const double gap = shortfall(logits, ids[s]);
    exact += gap == 0.0;
    EXPECT_LE(gap, kv_fp8 ? fp8_tie_tolerance : tie_tolerance) << what << ": step " << s << " chose " << ids[s]
                                  << ", not a near-tie of the CPU's argmax";
    seq.push_back(ids[s]);
  }
  return exact;
}

void expect_same_or_near_tie(const std::shared_ptr<const model_folder>& model,
                             const std::vector<int32_t>& prompt, const std::vector<int32_t>& a,
                             const std::vector<int32_t>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t d = 0;
  while (d < a.size() && a[d] == b[d])
    ++d;
  if (d == a.size())
    return;
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), a.begin(), a.begin() + int64_t(d));
  auto logits = cpu_logits(model, seq);
  EXPECT_LE(std::abs(shortfall(logits, a[d]) - shortfall(logits, b[d])), tie_tolerance)
    << what << ": first difference at step " << d << " (" << a[d] << " vs " << b[d]
    << ") is not a near-tie";
  std::printf("[ note     ] %s: identical for %zu of %zu steps, then a near-tie\n", what.c_str(),
              d, a.size());
}

sampling_params greedy() {
  sampling_params p;
  p.temperature = 0;
  return p;
}

std::vector<std::vector<int32_t>> generate(model_runner& r, const std::vector<std::vector<int32_t>>& prompts,
                                           int32_t steps, int32_t chunk, bool staggered,
                                           sampling_params p, uint64_t seed,
                                           const std::function<void()>& between) {
  driver d(r, chunk);
  std::vector<std::vector<int32_t>> out(prompts.size());
  size_t joined = 0;
  for (int32_t step = 0; step < 4 * steps + 64; ++step) {
    while (joined < prompts.size() && (!staggered || int32_t(joined) * 2 <= step)) {
      d.add(joined, prompts[joined], p, seed + joined);
      ++joined;
    }
    auto got = d.step();
    if (between)
      between();
    bool all_done = joined == prompts.size();
    for (auto [id, t] : got) {
      out[id].push_back(t);
      if (int32_t(out[id].size()) == steps)
        d.finish(id);
    }
    for (const auto& o : out)
      all_done = all_done && int32_t(o.size()) >= steps;
    if (all_done)
      break;
  }
  d.release_all();
  return out;
}

std::vector<std::vector<int32_t>> generate_on_shared_prefix(
  model_runner& r, const std::vector<int32_t>& system,
  const std::vector<std::vector<int32_t>>& tails, int32_t steps) {
  const int32_t pages = int32_t(system.size()) / r.page_size();
  driver d(r, 1 << 20);
  const uint64_t owner = 1000;
  d.add(owner, system, greedy(), 0);
  d.step();
  d.finish(owner);
  std::vector<std::vector<int32_t>> out(tails.size());
  for (size_t i = 0; i < tails.size(); ++i) {
    std::vector<int32_t> p(system.begin(), system.begin() + pages * r.page_size());
    p.insert(p.end(), tails[i].begin(), tails[i].end());
    d.add_shared(i, p, greedy(), 0, owner, pages);
  }
  for (int32_t step = 0; step < 2 * steps + 8; ++step) {
    for (auto [id, t] : d.step()) {
      if (id == owner)
        continue;
      out[id].push_back(t);
      if (int32_t(out[id].size()) == steps)
        d.finish(id);
    }
    bool all = true;
    for (const auto& o : out)
      all = all && int32_t(o.size()) >= steps;
    if (all)
      break;
  }
  d.release_all();
  return out;
}

std::vector<std::vector<int32_t>> test_prompts(int32_t vocab) {
  std::mt19937_64 rng(12345);
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t len : {1, 7, 16, 17, 40}) {
    std::vector<int32_t> p;
    for (int32_t i = 0; i < len; ++i)
      p.push_back(int32_t(rng() % uint64_t(vocab)));
    prompts.push_back(p);
  }
  return prompts;
}

std::vector<std::vector<int32_t>> twenty_prompts(int32_t vocab) {
  const auto base = test_prompts(vocab);
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < 20; ++i) {
    auto p = base[size_t(i) % base.size()];
    p.push_back((i * 7919 + 13) % vocab);
    prompts.push_back(p);
  }
  return prompts;
}

std::shared_ptr<const model_folder> tiny_llama3_with(const std::string& name, uint64_t seed,
                                                     const std::function<void(model_config&)>& edit) {
  make_model_options mo;
  mo.config = *preset_config("tiny-llama3");
  edit(mo.config);
  mo.seed = seed;
  mo.out_dir = test::scratch_dir(name);
  make_model(mo);
  return model_folder::open(mo.out_dir);
}

} // namespace metronome::test
