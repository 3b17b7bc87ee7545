#pragma once
// The replay's model of engine step time, fitted to steps measured on the
// device (tools/fit_cost_model.py over bench/gpu's step-time grid):
//
//   step_ms = base + per_decode_seq * decode_seqs
//                  + per_kv_token * decode_kv_tokens
//                  + per_prefill_token * prefill_tokens
//                  + per_prefill_attention_pair * prefill_attention_pairs
//                  + per_mixed_kv_token * decode_kv_tokens   (if prefill_tokens > 0)
//                  + per_prompt_step                          (if prefill_tokens > 0)
//
// base is reading the weights once; decode KV tokens are the context each
// decoding sequence's attention reads; prefill attention pairs are the
// (query, key) pairs of the causal attention of prompt chunks, which make long
// prompts cost more than linearly; the mixed term is what decodes cost beyond
// a pure decode step when they share the step with a prompt chunk, and the
// prompt step term what any chunk costs a step beyond its tokens.

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "sched/step_cost.hpp"

namespace metronome::sim {

/// What one engine step computes (the scheduler's own shape).
using step_shape = metronome::step_shape;

struct cost_model {
  std::string name = "unnamed";
  /// Derived from first principles, not from measurements.
  bool provisional = true;
  std::string note;
  /// The coefficients (the scheduler's own model, sched/step_cost.hpp).
  step_cost step;
  /// KV capacity of the device in tokens (for the replay's page pool).
  int64_t kv_cache_tokens = 860000;
  /// Longest prompt + output.
  int32_t max_model_len = 131072;

  /// Milliseconds of one step of this shape.
  double step_ms(const step_shape& s) const {
    return step.step_ms(s);
  }

  /// Reads a cost model file; throws std::runtime_error naming the file and
  /// the field.
  static cost_model load(const std::filesystem::path& file);

  /// Parses a cost model document; `source` names it in errors.
  static cost_model from_json(const nlohmann::json& doc, const std::string& source);

  nlohmann::json to_json() const;
};

/// A request's latency on an otherwise idle engine: its prompt in chunks of
/// at most `budget` tokens back to back, then one decode step per further
/// output token (what the replay does for a lone request).
struct unloaded_latency {
  double ttft_s = 0;
  double e2e_s = 0;
};

unloaded_latency unloaded(const cost_model& m, int32_t prompt_tokens, int32_t output_tokens,
                          int32_t budget);

} // namespace metronome::sim
