#pragma once
// What an engine step costs in time, as the scheduler predicts it: a linear
// model of the step's work, and an estimator that keeps that model true to
// the engine it drives by learning from the steps it sees. Plain C++, no
// actors; the scheduler (live and in sim/) owns one.
//
// Design note. The model (fitted on the device by tools/fit_cost_model.py):
//
//   step_ms = base + per_decode_seq * decode_seqs + per_kv_token * decode_kv_tokens
//           + per_prefill_token * prefill_tokens
//           + per_prefill_attention_pair * prefill_attention_pairs
//           + per_mixed_kv_token * decode_kv_tokens   (only with prefill_tokens > 0)
//           + per_prompt_step                          (only with prefill_tokens > 0)
//
// The last term is what carrying any prompt chunk costs a step, whatever its
// length: the chunk's attention and KV-write launches, and projections on
// the general GEMM path in place of the decode path's fused kernels. On the
// H200 it fits to 0 since the mixed graphs run without programmatic
// dependent launch (it was 0.084 ms with it); other engines may need it.
//
// The live engine runs any model on any device, so a fitted prior is only a
// shape: the estimator scales its decode part (base, sequences, KV) and its
// prompt part (tokens, attention pairs, the mixed term) by two factors
// learned from measured steps. A step without prompt tokens measures the
// decode factor; a step with them measures the prompt factor from what the
// decode part does not explain. Exponential averages with a floor and a
// ceiling keep one odd step (a page fault, a slow host thread) from moving
// either far.

#include <cstdint>

namespace metronome {

/// What one engine step computes, as the cost model sees it.
struct step_shape {
  int32_t decode_seqs = 0;
  int64_t decode_kv_tokens = 0;
  int32_t prefill_seqs = 0;
  int64_t prefill_tokens = 0;
  double prefill_attention_pairs = 0;

  /// Adds a chunk of `n` tokens of a sequence with `context` tokens already
  /// computed; `decode` when the chunk is one token of a decoding sequence.
  void add_chunk(int64_t context, int64_t n, bool decode);
};

/// Coefficients of the step-time model, in milliseconds (see the note).
/// The defaults are the Llama-3-8B shape in bf16 on an H200
/// (sim/cost_models/h200-llama3-8b.json, rounded).
struct step_cost {
  double base_ms = 4.37;
  double per_decode_seq_ms = 0.0082;
  double per_kv_token_ms = 3.0e-5;
  double per_prefill_token_ms = 0.0203;
  double per_prefill_attention_pair_ms = 2.5e-6;
  double per_mixed_kv_token_ms = 9.4e-6;
  double per_prompt_step_ms = 0.0;

  /// The decode part: base, sequences and the KV they read.
  double decode_ms(const step_shape& s) const;
  /// The prompt part: tokens, attention pairs, the mixed term and the
  /// prompt step's fixed cost.
  double prefill_ms(const step_shape& s) const;
  /// decode_ms + prefill_ms.
  double step_ms(const step_shape& s) const {
    return decode_ms(s) + prefill_ms(s);
  }
};

/// Learns how the engine's steps compare with a prior step_cost. Called on
/// the scheduler's thread only (or the replay loop).
class step_time_estimator {
public:
  explicit step_time_estimator(step_cost prior = {}) : prior_(prior) {}

  /// Predicted milliseconds of a step of shape `s`.
  double predict_ms(const step_shape& s) const {
    return decode_scale_ * prior_.decode_ms(s) + prefill_scale_ * prior_.prefill_ms(s);
  }
  double predict_decode_ms(const step_shape& s) const {
    return decode_scale_ * prior_.decode_ms(s);
  }

  /// The most prompt tokens (0..max_tokens) a chunk starting at `context`
  /// may add to a step of shape `s` so that it is predicted to take at most
  /// `limit_ms`.
  int32_t prefill_tokens_within(const step_shape& s, int64_t context, int32_t max_tokens,
                                double limit_ms) const;

  /// A step of shape `s` took `ms`.
  void observe(const step_shape& s, double ms);

  /// Resets the learned factors and replaces the prior.
  void reset(step_cost prior);

  double decode_scale() const {
    return decode_scale_;
  }
  double prefill_scale() const {
    return prefill_scale_;
  }
  int64_t observed() const {
    return observed_;
  }
  const step_cost& prior() const {
    return prior_;
  }

private:
  step_cost prior_;
  double decode_scale_ = 1.0;
  double prefill_scale_ = 1.0;
  int64_t observed_ = 0;
};

} // namespace metronome
