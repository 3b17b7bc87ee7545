#pragma once
// Turning logits into the next token, with the semantics of the OpenAI API as
// vLLM implements them.
//
// Design note. Order of operations on one sequence's logits: (1) repetition
// penalty over prompt and output tokens, frequency and presence penalties
// over output tokens only; (2) temperature 0 means greedy: the first index of
// the maximum; otherwise divide by the temperature; (3) keep the top_k most
// likely tokens, then the smallest set whose probability reaches top_p, then
// drop tokens less likely than min_p times the most likely one; (4) draw by
// inverse CDF over the kept tokens in descending order with one uniform number
// per step from the sequence's seeded stream. Same seed, same logits: same
// token, whatever else is in the batch.
//
// Log-probabilities for the client (sampling_params::logprobs) are the
// model's own: the log-softmax of the logits as the model produced them,
// before penalties, temperature and filtering, as OpenAI reports them and as
// vLLM does by default ("raw_logprobs"). They are taken before step (1), so
// they never depend on the sampling settings; the logprob `sample` returns
// beside the token is the other one, under the final distribution.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace metronome {

/// Most alternatives a request may ask log-probabilities for (OpenAI's
/// top_logprobs limit; the GPU sampler's buffers are sized for it).
inline constexpr int32_t max_logprobs = 20;

/// A token and its log-probability under the model (see the design note).
struct token_logprob {
  int32_t token = 0;
  float logprob = 0;
};

/// Per-request sampling settings (OpenAI / vLLM names and defaults).
struct sampling_params {
  float temperature = 1.0f;
  float top_p = 1.0f;
  /// 0 or negative: all tokens.
  int32_t top_k = 0;
  float min_p = 0.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  /// Unset: a seed is drawn from the system's entropy when the request starts.
  std::optional<uint64_t> seed;
  /// Most tokens to generate.
  int32_t max_tokens = 16;
  /// Tokens that end generation (in addition to the model's EOS ids unless
  /// ignore_eos); the stop token is not part of the text.
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  /// Log-probabilities to report for each generated token: -1 none; 0 the
  /// sampled token's; n > 0 also the n most likely tokens (at most
  /// max_logprobs).
  int32_t logprobs = -1;

  /// Whether any penalty is on (the sampler then counts earlier tokens).
  bool penalised() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }

  /// Empty when valid, else "field: problem" for the first bad field.
  std::string validate() const;
};

/// What a sequence's sampling remembers between steps.
class sequence_sampler {
public:
  /// `prompt` feeds the repetition penalty; `seed` fixes the random stream.
  /// `prior_output` are tokens already generated (a resumed sequence): they
  /// count for the penalties and advance the stream.
  sequence_sampler(const sampling_params& params, std::span<const int32_t> prompt, uint64_t seed,
                   std::span<const int32_t> prior_output = {});

  /// Picks the next token from `logits` (modified in place) and records it.
  /// Returns the token and its log-probability under the final distribution.
  /// With params().logprobs >= 0 and `model_logprobs` given, fills it with
  /// the sampled token's model log-probability, then the params().logprobs
  /// most likely tokens' (most likely first, ties by index).
  std::pair<int32_t, float> sample(std::span<float> logits,
                                   std::vector<token_logprob>* model_logprobs = nullptr);

  /// Output tokens so far.
  int32_t steps() const {
    return steps_;
  }

  const sampling_params& params() const {
    return params_;
  }

private:
  void apply_penalties(std::span<float> logits) const;

  sampling_params params_;
  uint64_t seed_;
  int32_t steps_ = 0;
  std::unordered_map<int32_t, int32_t> output_counts_;
  std::vector<int32_t> prompt_tokens_; // distinct, sorted
  std::vector<std::pair<float, int32_t>> scratch_;
  std::vector<float> raw_; // the logits before any change, when reporting
};

/// Index of the first maximum.
int32_t argmax(std::span<const float> logits);

/// log(sum(exp(logits))), in double.
double log_sum_exp(std::span<const float> logits);

/// The `n` most likely of `logits` with their log-softmax values, most
/// likely first, ties by index.
std::vector<token_logprob> top_logprobs(std::span<const float> logits, int32_t n);
/// The same with log_sum_exp(logits) already known.
std::vector<token_logprob> top_logprobs(std::span<const float> logits, int32_t n, double lse);

/// A seed for a request that did not set one.
uint64_t fresh_seed();

} // namespace metronome
