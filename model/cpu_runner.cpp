#include <algorithm>
#include <chrono>
#include <tuple>
#include <unordered_set>

#include "model/cpu_engine.hpp"
#include "model/model_runner.hpp"

namespace metronome {

// -- sequence_table -----------------------------------------------------------------

void sequence_table::apply(const step_plan& plan, int32_t page_size, int32_t num_pages) {
  // Validate everything first so a bad plan changes nothing.
  std::unordered_set<uint64_t> released(plan.released.begin(), plan.released.end());
  std::unordered_set<uint64_t> added;
  for (const auto& n : plan.added) {
    if ((seqs_.contains(n.id) && !released.contains(n.id)) || !added.insert(n.id).second)
      throw plan_error("sequence " + std::to_string(n.id) + " added twice");
    if (n.prompt.empty())
      throw plan_error("sequence " + std::to_string(n.id) + " has an empty prompt");
    if (n.num_output < 0 || size_t(n.num_output) >= n.prompt.size())
      throw plan_error("sequence " + std::to_string(n.id) + ": num_output out of range");
    if (n.num_cached < 0 || size_t(n.num_cached) >= n.prompt.size()
        || int64_t(n.cached_pages.size()) * page_size != n.num_cached)
      throw plan_error("sequence " + std::to_string(n.id)
                       + ": num_cached must be its cached pages' tokens, below its prompt's");
    for (auto p : n.cached_pages)
      if (p < 0 || p >= num_pages)
        throw plan_error("sequence " + std::to_string(n.id) + ": cached page id out of range");
  }
  std::unordered_set<uint64_t> scheduled;
  for (const auto& c : plan.chunks) {
    if (!scheduled.insert(c.id).second)
      throw plan_error("sequence " + std::to_string(c.id) + " scheduled twice in one step");
    int64_t known = 0, computed = 0, pages = 0;
    if (added.contains(c.id)) {
      for (const auto& n : plan.added)
        if (n.id == c.id) {
          known = int64_t(n.prompt.size());
          computed = n.num_cached;
          pages = int64_t(n.cached_pages.size());
        }
    } else if (auto i = seqs_.find(c.id); i != seqs_.end() && !released.contains(c.id)) {
      known = int64_t(i->second.tokens.size());
      computed = i->second.num_computed;
      pages = int64_t(i->second.pages.size());
    } else {
      throw plan_error("sequence " + std::to_string(c.id) + " is not known to the runner");
    }
    if (c.num_tokens <= 0 || computed + c.num_tokens > known)
      throw plan_error("sequence " + std::to_string(c.id) + ": " + std::to_string(c.num_tokens)
                       + " tokens scheduled but only " + std::to_string(known - computed)
                       + " are uncomputed");
    for (auto p : c.new_pages)
      if (p < 0 || p >= num_pages)
        throw plan_error("sequence " + std::to_string(c.id) + ": page id out of range");
    if ((pages + int64_t(c.new_pages.size())) * page_size < computed + c.num_tokens)
      throw plan_error("sequence " + std::to_string(c.id) + ": page table too short");
  }
  for (auto id : plan.released)
    seqs_.erase(id);
  for (const auto& n : plan.added) {
    runner_sequence s;
    s.tokens = n.prompt;
    s.prompt_len = int32_t(n.prompt.size());
    const auto prompt = std::span<const int32_t>(n.prompt);
    const auto split = prompt.size() - size_t(n.num_output);
    s.sampler = std::make_unique<sequence_sampler>(n.params, prompt.first(split), n.seed,
                                                   prompt.subspan(split));
    s.num_computed = n.num_cached;
    s.pages = n.cached_pages;
    s.precision = n.precision;
    seqs_.emplace(n.id, std::move(s));
  }
  for (const auto& c : plan.chunks) {
    auto& s = seqs_.at(c.id);
    s.pages.insert(s.pages.end(), c.new_pages.begin(), c.new_pages.end());
  }
}

runner_sequence& sequence_table::at(uint64_t id) {
  return seqs_.at(id);
}

// -- cpu_runner ----------------------------------------------------------------------

namespace {

class cpu_runner final : public model_runner {
public:
  cpu_runner(std::shared_ptr<const model_folder> model, int32_t num_pages, int32_t page_size,
             kv_cache_dtype_kind kv_dtype)
    : engine_(std::move(model), num_pages, page_size) {
    engine_.set_kv_dtype(kv_dtype);
  }

  step_output execute(const step_plan& plan) override {
    const auto start = std::chrono::steady_clock::now();
    table_.apply(plan, page_size(), num_pages());
    step_output out;
    out.step = plan.step;
    std::vector<forward_input> inputs;
    // One count per chunk: the engine adds what each sequence's writes
    // could not store (fp8_e5m2 only; the other dtypes leave them 0).
    std::vector<kv_overflow_count> overflow(plan.chunks.size());
    for (const auto& c : plan.chunks) {
      auto& s = table_.at(c.id);
      forward_input in;
      in.tokens = std::span<const int32_t>(s.tokens).subspan(size_t(s.num_computed),
                                                             size_t(c.num_tokens));
      in.start_pos = s.num_computed;
      in.pages = s.pages;
      in.full_precision = s.precision == kv_precision::full;
      in.kv_overflow = &overflow[inputs.size()];
      inputs.push_back(in);
      out.num_tokens += c.num_tokens;
    }
    out.num_seqs = int32_t(plan.chunks.size());
    const size_t vocab = size_t(config().vocab_size);
    logits_.resize(inputs.size() * vocab);
    if (!inputs.empty())
      engine_.forward(inputs, logits_);
    for (size_t i = 0; i < plan.chunks.size(); ++i)
      if (overflow[i].total() > 0)
        out.kv_overflows.push_back(
          {plan.chunks[i].id, overflow[i].saturated, overflow[i].non_finite});
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      auto& s = table_.at(plan.chunks[i].id);
      s.num_computed += plan.chunks[i].num_tokens;
      if (s.num_computed < int32_t(s.tokens.size()))
        continue; // a prompt chunk with more prompt to come
      sampled_token t{plan.chunks[i].id, 0, 0, {}};
      std::tie(t.token, t.logprob) =
        s.sampler->sample(std::span<float>(logits_).subspan(i * vocab, vocab), &t.logprobs);
      s.tokens.push_back(t.token);
      out.tokens.push_back(std::move(t));
    }
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
  }

  const model_config& config() const override {
    return engine_.config();
  }

  int32_t num_pages() const override {
    return engine_.kv_cache().num_pages();
  }

  int32_t page_size() const override {
    return engine_.kv_cache().page_size();
  }

  std::string device() const override {
    return "cpu";
  }

  /// The KV cache (fp32); the weights are the model's mapped files.
  std::vector<memory_plan_entry> memory_plan() const override {
    return {{"kv_pool", int64_t(engine_.kv_cache().bytes())}};
  }

private:
  cpu_engine engine_;
  sequence_table table_;
  std::vector<float> logits_;
};

} // namespace

int32_t cpu_kv_pages(const model_config& config, const engine_limits& limits) {
  const int64_t page_size = std::max(limits.page_size, 1);
  int64_t tokens = limits.kv_cache_tokens;
  if (tokens <= 0) {
    const int64_t bytes_per_token = int64_t(config.num_layers) * 2 * config.num_kv_heads
                                    * config.head_dim * int64_t(sizeof(float));
    const int64_t max_len
      = limits.max_model_len > 0 ? limits.max_model_len : config.max_position_embeddings;
    tokens = std::min<int64_t>(int64_t(limits.max_batch_size) * max_len,
                               (int64_t(1) << 30) / std::max<int64_t>(bytes_per_token, 1));
  }
  return int32_t((tokens + page_size - 1) / page_size);
}

std::unique_ptr<model_runner> make_cpu_runner(std::shared_ptr<const model_folder> model,
                                              const engine_limits& limits,
                                              kv_cache_dtype_kind kv_dtype) {
  const int32_t pages = cpu_kv_pages(model->config, limits);
  return std::make_unique<cpu_runner>(std::move(model), pages, limits.page_size, kv_dtype);
}

} // namespace metronome
