#include "model/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "model/random.hpp"

namespace metronome {

std::string sampling_params::validate() const {
  if (!(temperature >= 0.0f) || temperature > 2.0f)
    return "temperature: must lie in [0, 2]";
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return "top_p: must lie in (0, 1]";
  if (top_k < -1)
    return "top_k: must be -1, 0 (both: disabled) or positive";
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    return "min_p: must lie in [0, 1]";
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    return "frequency_penalty: must lie in [-2, 2]";
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    return "presence_penalty: must lie in [-2, 2]";
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 2.0f))
    return "repetition_penalty: must lie in (0, 2]";
  if (max_tokens < 1)
    return "max_tokens: must be at least 1";
  for (auto id : stop_token_ids)
    if (id < 0)
      return "stop_token_ids: ids must be non-negative";
  if (logprobs < -1 || logprobs > max_logprobs)
    return "logprobs: must lie in [0, " + std::to_string(max_logprobs) + "]";
  return {};
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[size_t(best)])
      best = int32_t(i);
  return best;
}

double log_sum_exp(std::span<const float> logits) {
  if (logits.empty())
    return -INFINITY;
  const float m = *std::max_element(logits.begin(), logits.end());
  if (!std::isfinite(m))
    return double(m);
  double sum = 0;
  for (float l : logits)
    sum += std::exp(double(l - m));
  return double(m) + std::log(sum);
}

std::vector<token_logprob> top_logprobs(std::span<const float> logits, int32_t n) {
  return top_logprobs(logits, n, log_sum_exp(logits));
}

std::vector<token_logprob> top_logprobs(std::span<const float> logits, int32_t n, double lse) {
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = int32_t(i);
  const size_t k = std::min(ids.size(), size_t(std::max(n, 0)));
  auto before = [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + long(k), ids.end(), before);
  std::vector<token_logprob> out;
  out.reserve(k);
  for (size_t i = 0; i < k; ++i)
    out.push_back({ids[i], float(double(logits[size_t(ids[i])]) - lse)});
  return out;
}

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

sequence_sampler::sequence_sampler(const sampling_params& params,
                                   std::span<const int32_t> prompt, uint64_t seed,
                                   std::span<const int32_t> prior_output)
  : params_(params), seed_(seed), steps_(int32_t(prior_output.size())) {
  for (auto id : prior_output)
    ++output_counts_[id];
  if (params_.repetition_penalty != 1.0f) {
    prompt_tokens_.assign(prompt.begin(), prompt.end());
    std::sort(prompt_tokens_.begin(), prompt_tokens_.end());
    prompt_tokens_.erase(std::unique(prompt_tokens_.begin(), prompt_tokens_.end()),
                         prompt_tokens_.end());
  }
}

void sequence_sampler::apply_penalties(std::span<float> logits) const {
  const int32_t vocab = int32_t(logits.size());
  if (params_.repetition_penalty != 1.0f) {
    auto penalise = [&](int32_t id) {
      if (id < 0 || id >= vocab)
        return;
      float& l = logits[size_t(id)];
      l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    };
    // A token in both prompt and output is penalised once.
    for (auto id : prompt_tokens_)
      penalise(id);
    for (const auto& [id, _] : output_counts_)
      if (!std::binary_search(prompt_tokens_.begin(), prompt_tokens_.end(), id))
        penalise(id);
  }
  if (params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f)
    for (const auto& [id, count] : output_counts_)
      if (id >= 0 && id < vocab)
        logits[size_t(id)] -= params_.frequency_penalty * float(count) + params_.presence_penalty;
}

std::pair<int32_t, float> sequence_sampler::sample(std::span<float> logits,
                                                  std::vector<token_logprob>* model_logprobs) {
  // The model's log-probabilities come from the logits before anything
  // below changes them; the sampled token's needs its raw logit afterwards.
  const bool report = model_logprobs && params_.logprobs >= 0;
  double lse = 0;
  if (report) {
    lse = log_sum_exp(logits);
    raw_.assign(logits.begin(), logits.end());
    *model_logprobs = top_logprobs(logits, params_.logprobs, lse);
  }
  apply_penalties(logits);
  const uint64_t step = uint64_t(steps_++);
  int32_t token = 0;
  float logprob = 0;
  if (params_.temperature < 1e-5f) {
    token = argmax(logits);
    double sum = 0;
    const float m = logits[size_t(token)];
    for (float l : logits)
      sum += std::exp(double(l - m));
    logprob = float(-std::log(sum));
  } else {
    const float inv_t = 1.0f / params_.temperature;
    for (float& l : logits)
      l *= inv_t;
    const int32_t vocab = int32_t(logits.size());
    const bool filtered = (params_.top_k > 0 && params_.top_k < vocab) || params_.top_p < 1.0f
                          || params_.min_p > 0.0f;
    const float u = random_unit(seed_, step);
    if (!filtered) {
      // Inverse CDF in index order over the whole vocabulary.
      const float m = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (float l : logits)
        sum += std::exp(double(l - m));
      double target = double(u) * sum, acc = 0;
      token = vocab - 1;
      for (int32_t i = 0; i < vocab; ++i) {
        acc += std::exp(double(logits[size_t(i)] - m));
        if (acc > target) {
          token = i;
          break;
        }
      }
      logprob = float(double(logits[size_t(token)] - m) - std::log(sum));
    } else {
      // Candidates by descending logit, ties by index.
      auto& c = scratch_;
      c.clear();
      for (int32_t i = 0; i < vocab; ++i)
        c.emplace_back(logits[size_t(i)], i);
      auto before = [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
      };
      size_t keep = c.size();
      if (params_.top_k > 0 && size_t(params_.top_k) < keep) {
        keep = size_t(params_.top_k);
        std::nth_element(c.begin(), c.begin() + long(keep) - 1, c.end(), before);
        c.resize(keep);
      }
      std::sort(c.begin(), c.end(), before);
      const float m = c.front().first;
      std::vector<double> p(c.size());
      double sum = 0;
      for (size_t i = 0; i < c.size(); ++i)
        sum += p[i] = std::exp(double(c[i].first - m));
      if (params_.top_p < 1.0f) {
        double acc = 0;
        size_t n = 0;
        while (n < p.size()) {
          acc += p[n++];
          if (acc >= double(params_.top_p) * sum)
            break;
        }
        keep = n;
      } else {
        keep = p.size();
      }
      if (params_.min_p > 0.0f) {
        const double floor = double(params_.min_p) * p[0];
        size_t n = 1;
        while (n < keep && p[n] >= floor)
          ++n;
        keep = n;
      }
      double kept = 0;
      for (size_t i = 0; i < keep; ++i)
        kept += p[i];
      double target = double(u) * kept, acc = 0;
      size_t pick = keep - 1;
      for (size_t i = 0; i < keep; ++i) {
        acc += p[i];
        if (acc > target) {
          pick = i;
          break;
        }
      }
      token = c[pick].second;
      logprob = float(std::log(p[pick] / kept));
    }
  }
  ++output_counts_[token];
  if (report)
    model_logprobs->insert(model_logprobs->begin(),
                           token_logprob{token, float(double(raw_[size_t(token)]) - lse)});
  return {token, logprob};
}

} // namespace metronome
