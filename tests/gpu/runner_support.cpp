#include "tests/gpu/runner_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "model/cpu_engine.hpp"
#include "model/make_model.hpp"
#include "gpu/kernels.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/model/test_support.hpp"

namespace metronome::test {

std::vector<float> cpu_logits(const std::shared_ptr<const model_folder>& model,
                              const std::vector<int32_t>& tokens, kv_cache_dtype_kind kv) {
  const int32_t page = 16;
  const int32_t pages = int32_t((tokens.size() + page - 1) / page);
  cpu_engine engine(model, pages, page);
  engine.set_kv_dtype(kv);
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
                                  kv_cache_dtype_kind kv) {
  std::vector<int32_t> seq = prompt;
  int32_t exact = 0;
  for (size_t s = 0; s < ids.size(); ++s) {
    auto logits = cpu_logits(model, seq, kv);
    const double gap = shortfall(logits, ids[s]);
    exact += gap == 0.0;
    const double tolerance = kv == kv_cache_dtype_kind::fp8_e5m2 ? e5m2_tie_tolerance
                             : kv == kv_cache_dtype_kind::fp8    ? fp8_tie_tolerance
                                                                 : tie_tolerance;
    EXPECT_LE(gap, tolerance) << what << ": step " << s << " chose " << ids[s]
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

std::shared_ptr<const model_folder> head_dim_128_model() {
  return tiny_llama3_with("tiny-llama3-head-dim-128", 29, [](model_config& c) {
    c.hidden_size = 256;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.head_dim = 128;
  });
}

void expect_every_decode_path_follows_the_cpu_engine(
  const std::shared_ptr<const model_folder>& model, const std::string& label,
  kv_cache_dtype_kind kv_dtype) {
  // 20 sequences decoding together: the skinny GEMM runs with several token
  // tiles (eager: 20 rows; captured: the graph of 24, padding rows included).
  const auto prompts = twenty_prompts(model->config.vocab_size);
  // cuBLAS twice: the o and down projections added into the residual by
  // cuBLAS's epilogue (gemm_splits 1), and as split-K partials reduced by the
  // fused residual + norm kernel (3, forced whatever the timing says).
  const gpu::kernel_generations saved = gpu::active_kernels();
  struct restore {
    gpu::kernel_generations k;
    ~restore() {
      gpu::active_kernels() = k;
    }
  } restore_on_exit{saved};
  for (const std::string path : {"gemv", "skinny", "cublas", "cublas-split"}) {
    auto o = test::small_runner_options();
    o.limits.max_batch_size = 24;
    o.limits.kv_cache_tokens = 8192;
    o.limits.max_num_batched_tokens = 512;
    o.small_batch_path = path == "cublas-split" ? "cublas" : path;
    o.kv_cache_dtype = kv_dtype;
    gpu::active_kernels().gemm_splits =
      path == "cublas" ? 1 : path == "cublas-split" ? 3 : saved.gemm_splits;
    auto gpu = make_cuda_runner(model, o);
    const std::string choice = describe_cuda_runner(*gpu);
    if (path == "gemv" || path == "skinny") {
      EXPECT_NE(choice.find(path), std::string::npos) << choice;
    }
    for (bool graphs : {true, false}) {
      ASSERT_TRUE(set_cuda_graphs(*gpu, graphs));
      auto got = generate(*gpu, prompts, 12, 1 << 20, false);
      int32_t exact = 0, steps = 0;
      for (size_t i = 0; i < prompts.size(); ++i) {
        exact += expect_greedy_matches_cpu(
          model, prompts[i], got[i],
          label + " path " + path + (graphs ? "" : " eager") + " prompt " + std::to_string(i),
          kv_dtype);
        steps += int32_t(got[i].size());
      }
      // Near-ties are rare: most steps pick the CPU's own argmax.
      EXPECT_GE(exact, steps * 8 / 10) << label << " path " << path;
      // Prefix caching: sequences starting on another's pages (two full
      // pages of a 40-token system prompt), decoding beside each other.
      std::vector<int32_t> system;
      for (int32_t i = 0; i < 40; ++i)
        system.push_back((i * 104729 + 7) % model->config.vocab_size);
      std::vector<std::vector<int32_t>> tails;
      for (int32_t i = 0; i < 5; ++i)
        tails.push_back(std::vector<int32_t>(size_t(1 + 3 * i), (i * 31 + 5) % model->config.vocab_size));
      auto shared = generate_on_shared_prefix(*gpu, system, tails, 10);
      for (size_t i = 0; i < tails.size(); ++i) {
        std::vector<int32_t> p(system.begin(), system.begin() + 2 * gpu->page_size());
        p.insert(p.end(), tails[i].begin(), tails[i].end());
        expect_greedy_matches_cpu(model, p, shared[i],
                                  label + " path " + path + (graphs ? "" : " eager")
                                    + " shared prefix, prompt " + std::to_string(i),
                                  kv_dtype);
      }
    }
  }
}

} // namespace metronome::test
