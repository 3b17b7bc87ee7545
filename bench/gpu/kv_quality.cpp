// kv_quality: what the fp8 KV cache costs a model whose attention was
// learned, measured through the CUDA runner's own kernels.
//
// Design note. Each held-out window of L tokens is scored teacher-forced: for
// each k (at a stride) a sequence whose prompt is ids[:k] is prefilled and its
// last logits, which predict ids[k], are read back. The prefill writes the
// window's keys and values into the cache and its attention reads them back
// from there, rounded as the cache stores them, just as decoding reads them.
// Two runners, one per cache dtype, get the same plans in lockstep, so each
// position's two distributions are compared directly (KL divergence, top-1
// agreement) without keeping them. Transformers' teacher-forced results on
// the same windows (tools/device/train_small_llama.py writes them with the
// windows) are the reference for both: the bf16 cache should sit on it, and
// the fp8 cache's distance from it is the cost. Without that file, --text
// cuts windows from any text with the model's own tokenizer, and the two
// caches are compared with each other only (for a real model on its own
// GPU, where no transformers run is at hand).
//
//   kv_quality --model DIR (--windows windows.json | --text FILE [--window N] [--count M])
//              [--stride N] [--out out.json]

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu/cuda_runner.hpp"
#include "model/model_weights.hpp"
#include "model/tokenizer/tokenizer.hpp"

namespace metronome {
namespace {

/// Log-probabilities of one row of logits, in double.
std::vector<double> log_softmax(const float* row, size_t n) {
  const double mx = *std::max_element(row, row + n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i)
    sum += std::exp(double(row[i]) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i)
    out[i] = double(row[i]) - lse;
  return out;
}

size_t argmax(const std::vector<double>& v) {
  return size_t(std::max_element(v.begin(), v.end()) - v.begin());
}

/// One scored position.
struct position {
  int32_t k = 0;         // tokens of context (the prompt ids[:k])
  double nll[2] = {};    // -log p(ids[k]) with each cache
  bool top1_hf[2] = {};  // argmax equals transformers' argmax
  bool top1_true[2] = {};
  double hf_nll = 0;
  double kl = 0;         // KL(bf16 cache || fp8 cache)
  bool agree = false;    // same argmax with both caches
};

/// Most tokens in one step: the prefixes of a step add up to at most this.
constexpr int32_t max_step_tokens = 32768;

struct options {
  std::string model, windows, text, out;
  int32_t stride = 1;
  int32_t window = 1024, count = 16; // --text only
};

/// The windows to score, and transformers' scores of them where known
/// (hf_nll[w][k - 1], hf_argmax[w][k - 1]: after the first k tokens).
struct windows_file {
  std::vector<std::vector<int32_t>> windows;
  std::vector<std::vector<double>> hf_nll;
  std::vector<std::vector<int64_t>> hf_argmax;
  nlohmann::json model = nlohmann::json::object(), train = nlohmann::json::object();

  bool has_reference() const {
    return !hf_nll.empty();
  }
};

windows_file read_windows(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw std::runtime_error(path + ": cannot open");
  const auto j = nlohmann::json::parse(in);
  windows_file f;
  f.windows = j.at("windows").get<std::vector<std::vector<int32_t>>>();
  f.hf_nll = j.at("hf_nll").get<std::vector<std::vector<double>>>();
  f.hf_argmax = j.at("hf_argmax").get<std::vector<std::vector<int64_t>>>();
  f.model = j.value("model", f.model);
  f.train = j.value("train", f.train);
  for (size_t w = 0; w < f.windows.size(); ++w)
    if (w >= f.hf_nll.size() || w >= f.hf_argmax.size()
        || f.hf_nll[w].size() + 1 < f.windows[w].size()
        || f.hf_argmax[w].size() + 1 < f.windows[w].size())
      throw std::runtime_error(path + ": hf_nll and hf_argmax need a value for each position "
                                      "of window " + std::to_string(w));
  return f;
}

/// `count` consecutive windows of `window` tokens from the start of `path`,
/// encoded by the model folder's tokenizer a block of lines at a time (no
/// special tokens added or parsed).
windows_file cut_windows(const std::string& path, const std::string& model_dir, int32_t window,
                         int32_t count) {
  std::ifstream in(path);
  if (!in)
    throw std::runtime_error(path + ": cannot open");
  const auto tok = tokenizer::load(model_dir);
  const size_t want = size_t(window) * size_t(count);
  std::vector<int32_t> ids;
  std::string line, block;
  int lines = 0;
  auto flush = [&] {
    const auto got = tok->encode(block, {.add_special_tokens = false, .parse_special = false});
    ids.insert(ids.end(), got.begin(), got.end());
    block.clear();
    lines = 0;
  };
  while (ids.size() < want && std::getline(in, line)) {
    block += line + "\n";
    if (++lines == 200)
      flush();
  }
  if (ids.size() < want)
    flush();
  windows_file f;
  for (size_t w = 0; (w + 1) * size_t(window) <= ids.size() && w < size_t(count); ++w)
    f.windows.emplace_back(ids.begin() + w * window, ids.begin() + (w + 1) * window);
  if (f.windows.empty())
    throw std::runtime_error(path + ": fewer than " + std::to_string(window) + " tokens");
  return f;
}

/// Pools positions whose context lies in [lo, hi); the comparisons with
/// transformers only where `reference`.
nlohmann::json summary(const std::vector<position>& ps, int32_t lo, int32_t hi, bool reference) {
  double nll[2] = {}, dhf[2] = {}, hf = 0, kl = 0, kl_max = 0;
  int64_t t1hf[2] = {}, t1[2] = {}, agree = 0, n = 0;
  std::vector<double> kls;
  for (const auto& p : ps) {
    if (p.k < lo || p.k >= hi)
      continue;
    ++n;
    for (int d = 0; d < 2; ++d) {
      nll[d] += p.nll[d];
      dhf[d] += std::abs(p.nll[d] - p.hf_nll);
      t1hf[d] += p.top1_hf[d];
      t1[d] += p.top1_true[d];
    }
    hf += p.hf_nll;
    kl += p.kl;
    kl_max = std::max(kl_max, p.kl);
    kls.push_back(p.kl);
    agree += p.agree;
  }
  nlohmann::json j;
  j["context"] = {lo, hi};
  j["positions"] = n;
  if (n == 0)
    return j;
  std::sort(kls.begin(), kls.end());
  const char* names[2] = {"bf16", "fp8"};
  for (int d = 0; d < 2; ++d) {
    auto& c = j[names[d]];
    c["perplexity"] = std::exp(nll[d] / double(n));
    c["top1_accuracy"] = double(t1[d]) / double(n);
    if (reference) {
      c["mean_abs_nll_diff_vs_hf"] = dhf[d] / double(n);
      c["top1_same_as_hf"] = double(t1hf[d]) / double(n);
    }
  }
  if (reference)
    j["hf_perplexity"] = std::exp(hf / double(n));
  j["kl_bf16_fp8_mean"] = kl / double(n);
  j["kl_bf16_fp8_p99"] = kls[std::min(kls.size() - 1, size_t(double(kls.size()) * 0.99))];
  j["kl_bf16_fp8_max"] = kl_max;
  j["top1_agreement_bf16_fp8"] = double(agree) / double(n);
  return j;
}

int run(const options& o) {
  const windows_file ref = o.text.empty() ? read_windows(o.windows)
                                          : cut_windows(o.text, o.model, o.window, o.count);
  const auto& windows = ref.windows;
  if (windows.empty())
    throw std::runtime_error("no windows to score");
  for (const auto& w : windows)
    if (w.size() > size_t(max_step_tokens) + 1) // the longest prefix is all but one token
      throw std::runtime_error("windows of more than " + std::to_string(max_step_tokens + 1)
                               + " tokens do not fit one step");
  std::fprintf(stderr, "kv_quality: %zu windows of %zu tokens%s\n", windows.size(),
               windows[0].size(), ref.has_reference() ? ", with transformers' scores" : "");
  if (const std::string problem = cuda_device_problem(0); !problem.empty())
    throw std::runtime_error("cuda:0: " + problem);
  auto model = model_folder::open(o.model);
  const size_t vocab = size_t(model->config.vocab_size);

  cuda_runner_options ro;
  ro.limits.max_batch_size = 64;
  ro.max_seqs = 64;
  ro.limits.max_num_batched_tokens = max_step_tokens;
  // A partial page a sequence, and slack.
  ro.limits.kv_cache_tokens = max_step_tokens + 64 * 16 + 1024;
  ro.cuda_graphs = false; // prompt steps only
  std::unique_ptr<model_runner> runners[2];
  ro.kv_cache_dtype = kv_cache_dtype_kind::bf16;
  runners[0] = make_cuda_runner(model, ro);
  ro.kv_cache_dtype = kv_cache_dtype_kind::fp8;
  runners[1] = make_cuda_runner(model, ro);
  const int32_t page = runners[0]->page_size();

  // Every (window, k) to score, packed into steps of at most 64 sequences
  // and max_num_batched_tokens tokens.
  struct item {
    size_t w;
    int32_t k;
  };
  std::vector<item> todo;
  for (size_t w = 0; w < windows.size(); ++w)
    for (int32_t k = o.stride; k < int32_t(windows[w].size()); k += o.stride)
      todo.push_back({w, k});
  std::vector<position> scored;
  std::vector<uint64_t> live;
  uint64_t next_id = 1, step = 0;
  sampling_params greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 1;
  for (size_t i = 0; i < todo.size();) {
    step_plan plan;
    plan.step = step++;
    plan.released = live;
    live.clear();
    std::vector<item> batch;
    int64_t tokens = 0;
    int32_t next_page = 0;
    while (i < todo.size() && batch.size() < 64 && tokens + todo[i].k <= max_step_tokens) {
      const auto& [w, k] = todo[i];
      new_sequence s;
      s.id = next_id++;
      s.prompt.assign(windows[w].begin(), windows[w].begin() + k);
      s.params = greedy;
      scheduled_chunk c{s.id, k, {}};
      for (int32_t p = 0; p < (k + page - 1) / page; ++p)
        c.new_pages.push_back(next_page++);
      live.push_back(s.id);
      plan.added.push_back(std::move(s));
      plan.chunks.push_back(std::move(c));
      batch.push_back(todo[i]);
      tokens += k;
      ++i;
    }
    std::vector<float> logits[2];
    for (int d = 0; d < 2; ++d) {
      const step_output out = runners[d]->execute(plan);
      if (out.tokens.size() != batch.size())
        throw std::runtime_error("a step sampled " + std::to_string(out.tokens.size())
                                 + " sequences, expected " + std::to_string(batch.size()));
      logits[d] = cuda_runner_logits(*runners[d], int32_t(batch.size()));
      // The rows are the chunks' order: each greedy token is its row's argmax.
      for (size_t r = 0; r < batch.size(); ++r) {
        const float* row = logits[d].data() + r * vocab;
        if (out.tokens[r].id != plan.chunks[r].id
            || row[out.tokens[r].token] != *std::max_element(row, row + vocab))
          throw std::runtime_error("logit rows are not in the chunks' order");
      }
    }
    for (size_t r = 0; r < batch.size(); ++r) {
      const auto& [w, k] = batch[r];
      const size_t truth = size_t(windows[w][size_t(k)]);
      position p;
      p.k = k;
      if (ref.has_reference())
        p.hf_nll = ref.hf_nll[w][size_t(k - 1)];
      std::vector<double> lp[2];
      for (int d = 0; d < 2; ++d) {
        lp[d] = log_softmax(logits[d].data() + r * vocab, vocab);
        p.nll[d] = -lp[d][truth];
        const size_t a = argmax(lp[d]);
        p.top1_hf[d] = ref.has_reference() && int64_t(a) == ref.hf_argmax[w][size_t(k - 1)];
        p.top1_true[d] = a == truth;
      }
      for (size_t v = 0; v < vocab; ++v)
        p.kl += std::exp(lp[0][v]) * (lp[0][v] - lp[1][v]);
      p.agree = argmax(lp[0]) == argmax(lp[1]);
      scored.push_back(p);
    }
  }

  nlohmann::json result;
  result["model"] = ref.model;
  result["train"] = ref.train;
  if (!o.text.empty())
    result["text"] = o.text;
  result["stride"] = o.stride;
  result["windows"] = windows.size();
  const int32_t len = windows.empty() ? 0 : int32_t(windows[0].size());
  result["all"] = summary(scored, 1, len, ref.has_reference());
  for (auto [lo, hi] : {std::pair{1, 128}, {128, 512}, {512, len}})
    result["by_context"].push_back(summary(scored, lo, hi, ref.has_reference()));
  std::printf("%s\n", result.dump(2).c_str());
  if (!o.out.empty())
    std::ofstream(o.out) << result.dump(2) << "\n";
  return 0;
}

} // namespace
} // namespace metronome

int main(int argc, char** argv) {
  metronome::options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--model")
      o.model = v;
    else if (a == "--windows")
      o.windows = v;
    else if (a == "--text")
      o.text = v;
    else if (a == "--window")
      o.window = std::max(2, std::atoi(v.c_str()));
    else if (a == "--count")
      o.count = std::max(1, std::atoi(v.c_str()));
    else if (a == "--out")
      o.out = v;
    else if (a == "--stride")
      o.stride = std::max(1, std::atoi(v.c_str()));
    else {
      std::fprintf(stderr, "kv_quality: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0 || o.model.empty() || o.windows.empty() == o.text.empty()) {
    std::fprintf(stderr, "usage: kv_quality --model DIR (--windows windows.json | --text FILE "
                         "[--window N] [--count M]) [--stride N] [--out out.json]\n");
    return 2;
  }
  try {
    return metronome::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv_quality: %s\n", e.what());
    return 1;
  }
}
