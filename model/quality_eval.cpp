#include "model/quality_eval.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "model/cpu_engine.hpp"
#include "model/model_error.hpp"
#include "model/model_weights.hpp"
#include "model/parallel.hpp"
#include "model/tokenizer/tokenizer.hpp"

namespace metronome {

namespace {

/// Tokens a page of the engines' caches holds.
constexpr int32_t page_tokens = 16;

/// log_softmax of `n` logits into `out`, in double.
void log_softmax(const float* logits, int64_t n, double* out) {
  double mx = logits[0];
  for (int64_t i = 1; i < n; ++i)
    mx = std::max(mx, double(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < n; ++i)
    out[i] = double(logits[i]) - lse;
}

/// The first index of the largest value.
int64_t argmax(const double* v, int64_t n) {
  return int64_t(std::max_element(v, v + n) - v);
}

/// One engine and what it has measured.
struct lane {
  std::shared_ptr<const model_folder> model;
  std::unique_ptr<cpu_engine> engine;
  quality_result result;
  std::vector<double> kls; // every position's KL, for the percentile
};

/// One window's sums for one lane, added to the lane's result in window
/// order once the window is done (so the totals do not depend on the batch).
struct window_sums {
  double nll = 0, kl = 0;
  int64_t positions = 0, agree = 0, correct = 0;
  kv_overflow_count overflow;
};

/// One position's figures for one lane.
struct position_stats {
  double nll = 0, kl = 0;
  bool agree = false, correct = false;
};

} // namespace

double quality_result::perplexity() const {
  return positions ? std::exp(nll / double(positions)) : std::nan("");
}

double quality_result::mean_kl() const {
  return positions ? kl / double(positions) : std::nan("");
}

double quality_result::agreement() const {
  return positions ? double(agree) / double(positions) : std::nan("");
}

double quality_result::accuracy() const {
  return positions ? double(correct) / double(positions) : std::nan("");
}

const std::vector<std::string>& quality_variant_names() {
  static const std::vector<std::string> names = {"baseline", "int4-awq", "int4-gptq", "kv-fp8",
                                                 "kv-fp8_e5m2"};
  return names;
}

std::optional<quality_variant> quality_variant_named(std::string_view name) {
  quality_variant v;
  v.name = std::string(name);
  if (name == "baseline")
    return v;
  if (name == "int4-awq" || name == "int4-gptq") {
    v.weights = weight_quantization::int4;
    v.int4_layout = name == "int4-awq" ? quant_method::awq : quant_method::gptq;
    return v;
  }
  if (name == "kv-fp8") {
    v.kv = kv_cache_dtype_kind::fp8;
    return v;
  }
  if (name == "kv-fp8_e5m2") {
    v.kv = kv_cache_dtype_kind::fp8_e5m2;
    return v;
  }
  return std::nullopt;
}

std::vector<quality_window> held_out_windows(const std::filesystem::path& held_out,
                                             const tokenizer& tok, int32_t window) {
  const std::string file = held_out.string();
  if (window < 2)
    throw std::invalid_argument("held_out_windows: a window of " + std::to_string(window)
                                + " tokens (at least 2: BOS and one to predict)");
  std::ifstream in(held_out);
  if (!in)
    throw model_error(file, "", "cannot read");
  // Ordered: the corpora are cut in the file's order, as Python reads it.
  nlohmann::ordered_json doc;
  try {
    doc = nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw model_error(file, "", std::string("malformed JSON: ") + e.what());
  }
  if (!doc.is_object() || !doc.contains("test") || !doc["test"].is_object())
    throw model_error(file, "test",
                      "missing, or not an object of corpus name -> list of paragraphs (the "
                      "held_out.json of tools/default_model_held_out.py)");
  const auto bos = tok.bos_id(), eos = tok.eos_id();
  const std::string tok_config = (tok.dir() / "tokenizer_config.json").string();
  if (!bos)
    throw model_error(tok_config, "bos_token", "missing: held-out windows start with BOS");
  if (!eos)
    throw model_error(tok_config, "eos_token", "missing: held-out paragraphs end with EOS");
  std::vector<quality_window> out;
  for (const auto& [name, paragraphs] : doc["test"].items()) {
    if (!paragraphs.is_array())
      throw model_error(file, "test." + name, "not a list of paragraphs");
    std::vector<int32_t> ids;
    for (size_t j = 0; j < paragraphs.size(); ++j) {
      if (!paragraphs[j].is_string())
        throw model_error(file, "test." + name + "[" + std::to_string(j) + "]",
                          "not a string");
      // As transformers' tokenizer(p, add_special_tokens=False).
      const auto p = tok.encode(paragraphs[j].get<std::string>(),
                                {.add_special_tokens = false, .parse_special = true});
      ids.insert(ids.end(), p.begin(), p.end());
      ids.push_back(*eos);
    }
    const size_t run = size_t(window) - 1;
    for (size_t s = 0; s < ids.size(); s += run) {
      quality_window w;
      w.source = name;
      w.ids.push_back(*bos);
      w.ids.insert(w.ids.end(), ids.begin() + long(s),
                   ids.begin() + long(std::min(ids.size(), s + run)));
      out.push_back(std::move(w));
    }
  }
  return out;
}

quality_report evaluate_quality(const std::filesystem::path& model_dir,
                                std::span<const quality_variant> variants,
                                std::span<const quality_window> windows,
                                const quality_options& options) {
  const auto start = std::chrono::steady_clock::now();
  if (windows.empty())
    throw std::invalid_argument("evaluate_quality: no windows to score");
  if (options.batch < 1)
    throw std::invalid_argument("evaluate_quality: batch " + std::to_string(options.batch)
                                + " (at least 1)");
  auto base = model_folder::open(model_dir);
  const model_config& cfg = base->config;
  const int64_t vocab = cfg.vocab_size;

  quality_report report;
  report.windows = int64_t(windows.size());
  int64_t total_positions = 0;
  for (size_t i = 0; i < windows.size(); ++i) {
    const auto& w = windows[i];
    const std::string where = "evaluate_quality: window " + std::to_string(i) + " ("
                              + w.source + ")";
    if (w.ids.size() < 2)
      throw std::invalid_argument(where + " has " + std::to_string(w.ids.size())
                                  + " ids (at least 2)");
    if (cfg.max_position_embeddings > 0 && int64_t(w.ids.size()) > cfg.max_position_embeddings)
      throw std::invalid_argument(where + " has " + std::to_string(w.ids.size())
                                  + " ids, more than the model's context of "
                                  + std::to_string(cfg.max_position_embeddings));
    for (auto id : w.ids)
      if (id < 0 || id >= vocab)
        throw std::invalid_argument(where + ": id " + std::to_string(id)
                                    + " outside the vocabulary (0.." + std::to_string(vocab - 1)
                                    + ")");
    report.max_window = std::max(report.max_window, int32_t(w.ids.size()));
    total_positions += int64_t(w.ids.size()) - 1;
  }

  const int32_t batch = int32_t(std::min<size_t>(size_t(options.batch), windows.size()));
  const int32_t pages_per_window = (report.max_window + page_tokens - 1) / page_tokens;
  const int32_t num_pages = batch * pages_per_window;

  // Lane 0 is the baseline; the variants follow in their order.
  std::vector<lane> lanes(variants.size() + 1);
  for (size_t l = 0; l < lanes.size(); ++l) {
    auto& ln = lanes[l];
    const quality_variant baseline{"baseline"};
    const quality_variant& v = l == 0 ? baseline : variants[l - 1];
    ln.model = v.weights == weight_quantization::none
                 ? base
                 : model_folder::open(model_dir, {v.weights, v.int4_layout});
    ln.engine = std::make_unique<cpu_engine>(ln.model, num_pages, page_tokens);
    ln.engine->set_kv_dtype(v.kv);
    ln.result.name = v.name;
    ln.result.weights = ln.model->weights_description();
    ln.result.kv = v.kv == kv_cache_dtype_kind::bf16 ? "fp32" : std::string(to_string(v.kv));
    ln.kls.reserve(size_t(total_positions));
  }
  const size_t nl = lanes.size();

  int64_t done = 0;
  std::vector<std::vector<int32_t>> pages(static_cast<size_t>(batch));
  for (int32_t i = 0; i < batch; ++i)
    for (int32_t p = 0; p < pages_per_window; ++p)
      pages[size_t(i)].push_back(i * pages_per_window + p);

  for (size_t first = 0; first < windows.size(); first += size_t(batch)) {
    const size_t n = std::min(size_t(batch), windows.size() - first);
    auto group = windows.subspan(first, n);
    size_t steps = 0;
    for (const auto& w : group)
      steps = std::max(steps, w.ids.size() - 1);
    // [lane][window of the group]
    std::vector<std::vector<window_sums>> sums(nl, std::vector<window_sums>(n));
    std::vector<std::vector<forward_input>> inputs(nl);
    std::vector<std::vector<float>> logits(nl);
    std::vector<size_t> active;
    std::vector<position_stats> stats;
    for (size_t t = 0; t < steps; ++t) {
      // Step t feeds each window's token t at position t (the first step is
      // BOS's prefill) and reads the distribution of token t + 1.
      active.clear();
      for (size_t i = 0; i < n; ++i)
        if (t + 1 < group[i].ids.size())
          active.push_back(i);
      for (size_t l = 0; l < nl; ++l) {
        inputs[l].clear();
        for (size_t i : active)
          inputs[l].push_back({std::span<const int32_t>(&group[i].ids[t], 1), int32_t(t),
                               pages[i], &sums[l][i].overflow});
        logits[l].resize(active.size() * size_t(vocab));
        lanes[l].engine->forward(inputs[l], logits[l]);
      }
      stats.assign(active.size() * nl, {});
      parallel_for(0, int64_t(active.size()), 1, [&](int64_t lo, int64_t hi) {
        std::vector<double> base_lp(static_cast<size_t>(vocab)), lp(static_cast<size_t>(vocab));
        for (int64_t r = lo; r < hi; ++r) {
          const int32_t next = group[active[size_t(r)]].ids[t + 1];
          log_softmax(logits[0].data() + r * vocab, vocab, base_lp.data());
          const int64_t base_top = argmax(base_lp.data(), vocab);
          for (size_t l = 0; l < nl; ++l) {
            const double* v = base_lp.data();
            if (l > 0) {
              log_softmax(logits[l].data() + r * vocab, vocab, lp.data());
              v = lp.data();
            }
            position_stats& s = stats[size_t(r) * nl + l];
            double kl = 0;
            if (l > 0)
              for (int64_t i = 0; i < vocab; ++i)
                kl += std::exp(base_lp[size_t(i)]) * (base_lp[size_t(i)] - v[i]);
            const int64_t top = argmax(v, vocab);
            s.nll = -v[next];
            s.kl = kl;
            s.agree = top == base_top;
            s.correct = top == next;
          }
        }
      });
      for (size_t r = 0; r < active.size(); ++r)
        for (size_t l = 0; l < nl; ++l) {
          const position_stats& s = stats[r * nl + l];
          window_sums& w = sums[l][active[r]];
          w.nll += s.nll;
          w.kl += s.kl;
          w.positions += 1;
          w.agree += s.agree;
          w.correct += s.correct;
          lanes[l].kls.push_back(s.kl);
        }
      done += int64_t(active.size());
      if (options.progress)
        options.progress(done, total_positions);
    }
    for (size_t l = 0; l < nl; ++l)
      for (size_t i = 0; i < n; ++i) {
        quality_result& q = lanes[l].result;
        const window_sums& w = sums[l][i];
        q.nll += w.nll;
        q.kl += w.kl;
        q.positions += w.positions;
        q.agree += w.agree;
        q.correct += w.correct;
        q.overflow.saturated += w.overflow.saturated;
        q.overflow.non_finite += w.overflow.non_finite;
        q.windows_overflowed += w.overflow.total() > 0;
      }
  }

  for (auto& ln : lanes) {
    auto& kls = ln.kls;
    if (std::any_of(kls.begin(), kls.end(), [](double k) { return std::isnan(k); })) {
      ln.result.kl_p99 = ln.result.kl_max = std::nan(""); // a variant gone to NaN
    } else if (!kls.empty()) {
      std::sort(kls.begin(), kls.end());
      // Nearest rank: the smallest value with at least 99% at or below it.
      const size_t rank = size_t(std::ceil(0.99 * double(kls.size())));
      ln.result.kl_p99 = kls[std::max<size_t>(rank, 1) - 1];
      ln.result.kl_max = kls.back();
    }
  }
  report.baseline = std::move(lanes[0].result);
  for (size_t l = 1; l < nl; ++l)
    report.variants.push_back(std::move(lanes[l].result));
  report.seconds =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

} // namespace metronome
