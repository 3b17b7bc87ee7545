#include "sched/step_cost.hpp"

#include <algorithm>
#include <cmath>

namespace metronome {

namespace {

/// Weight of one step in the learned factors: about the last 30 steps.
constexpr double learn_rate = 1.0 / 32;
/// How far one step's ratio may pull a factor (a stall is not a trend).
constexpr double max_step_ratio = 4.0;
/// Bounds of the factors: a prior further off than this is no shape at all.
constexpr double min_scale = 1e-3, max_scale = 1e4;

double learn(double scale, double ratio) {
  ratio = std::clamp(ratio, scale / max_step_ratio, scale * max_step_ratio);
  return std::clamp(scale + learn_rate * (ratio - scale), min_scale, max_scale);
}

} // namespace

void step_shape::add_chunk(int64_t context, int64_t n, bool decode) {
  if (decode) {
    ++decode_seqs;
    decode_kv_tokens += context + n;
    return;
  }
  ++prefill_seqs;
  prefill_tokens += n;
  prefill_attention_pairs += double(n) * (double(context) + double(n + 1) / 2.0);
}

double step_cost::decode_ms(const step_shape& s) const {
  return base_ms + per_decode_seq_ms * s.decode_seqs + per_kv_token_ms * double(s.decode_kv_tokens);
}

double step_cost::prefill_ms(const step_shape& s) const {
  if (s.prefill_tokens <= 0)
    return 0.0;
  return per_prefill_token_ms * double(s.prefill_tokens)
         + per_prefill_attention_pair_ms * s.prefill_attention_pairs
         + per_mixed_kv_token_ms * double(s.decode_kv_tokens) + per_prompt_step_ms;
}

int32_t step_time_estimator::prefill_tokens_within(const step_shape& s, int64_t context,
                                                   int32_t max_tokens, double limit_ms) const {
  auto fits = [&](int32_t n) {
    step_shape t = s;
    t.add_chunk(context, n, false);
    return predict_ms(t) <= limit_ms;
  };
  if (max_tokens <= 0 || !fits(1))
    return 0;
  if (fits(max_tokens))
    return max_tokens;
  // The time grows with n (linear and quadratic terms >= 0): bisect.
  int32_t lo = 1, hi = max_tokens; // fits(lo), !fits(hi)
  while (hi - lo > 1) {
    const int32_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

void step_time_estimator::observe(const step_shape& s, double ms) {
  if (!(ms > 0) || !std::isfinite(ms))
    return;
  ++observed_;
  const double d = prior_.decode_ms(s);
  const double p = prior_.prefill_ms(s);
  if (p <= 0) {
    if (d > 0)
      decode_scale_ = learn(decode_scale_, ms / d);
    return;
  }
  // What the decode part does not explain is the prompt's; a step whose
  // prompt part is a sliver of it says little about the prompt factor.
  const double rest = ms - decode_scale_ * d;
  if (p >= 0.1 * decode_scale_ * d)
    prefill_scale_ = learn(prefill_scale_, std::max(rest, 0.0) / p);
}

void step_time_estimator::reset(step_cost prior) {
  prior_ = prior;
  decode_scale_ = prefill_scale_ = 1.0;
  observed_ = 0;
}

} // namespace metronome
