#pragma once
// Reference operators of a Llama-family decoder in fp32 arithmetic, written
// for clarity over speed. The CPU engine is built from them, and the GPU
// kernel tests compare against them. Parallel over output rows; each
// output element is computed by the same code whatever the batch, so results
// never depend on which other rows share a call.

#include <cstdint>
#include <span>

#include "model/safetensors.hpp"

namespace metronome {

/// Values the fp8_e5m2 KV cache could not store as they were (counted per
/// sequence: forward_input::kv_overflow).
struct kv_overflow_count {
  /// Finite values whose |value / scale| exceeded 57344: stored as
  /// +-57344 * scale.
  int64_t saturated = 0;
  /// NaN (stored as NaN) and +-infinity (stored as +-57344 * scale).
  int64_t non_finite = 0;

  int64_t total() const {
    return saturated + non_finite;
  }
};

} // namespace metronome

namespace metronome::ref {

/// y[t, r] = sum_c x[t, c] * w[r, c] (+ bias[r]) for t < rows; w is [R, C] of
/// any dtype, x is [rows, C], y is [rows, R].
void linear(const tensor_view& w, const tensor_view* bias, const float* x, int64_t rows,
            float* y);

/// out[t] = x[t] / rms(x[t]) * weight, rows of width n; out may alias x.
void rms_norm(const float* x, const tensor_view& weight, double eps, int64_t rows, int64_t n,
              float* out);

/// Same with an fp32 weight vector (for tests).
void rms_norm(const float* x, const float* weight, double eps, int64_t rows, int64_t n,
              float* out);

/// Rotates `heads` vectors of width head_dim in place for position `pos`, in
/// Hugging Face's half-split layout: pairs (i, i + head_dim / 2).
void rope(float* x, int32_t heads, int32_t head_dim, int64_t pos, const float* inv_freq);

/// Rounds `rows` rows of width n in place as the fp8 KV cache stores them:
/// each row's scale is its largest |value| / 448, each value becomes the
/// e4m3 of value / scale times the scale (model/dtype.hpp's f32_to_e4m3,
/// the GPU writers' arithmetic).
void round_rows_to_e4m3(float* x, int64_t rows, int64_t n);

/// Rounds n values in place as the fp8_e5m2 cache stores them with `scale`
/// (a power of two, e5m2_window_scale): each becomes e5m2(value / scale) *
/// scale (model/dtype.hpp's f32_to_e5m2: nearest even, saturating), and the
/// values that saturated or were not finite are added to `count`.
void round_to_e5m2(float* x, int64_t n, float scale, kv_overflow_count& count);

/// out = silu(gate) * up, elementwise over n values; out may alias gate.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

/// Copies rows of the embedding table (any dtype) for `ids` into out [n, hidden].
void embed(const tensor_view& table, std::span<const int32_t> ids, float* out);

/// Causal attention of one query vector over `n_keys` cached keys/values.
/// keys(j) and values(j) return head_dim floats of key position j.
template <class KeyFn, class ValueFn>
void attend(const float* q, int32_t head_dim, int64_t first, int64_t last, float scale,
            KeyFn keys, ValueFn values, float* scores, float* out) {
  float max_score = -3.4e38f;
  for (int64_t j = first; j <= last; ++j) {
    const float* k = keys(j);
    float s = 0;
    for (int32_t d = 0; d < head_dim; ++d)
      s += q[d] * k[d];
    s *= scale;
    scores[j - first] = s;
    max_score = s > max_score ? s : max_score;
  }
  double sum = 0;
  for (int64_t j = first; j <= last; ++j) {
    float e = __builtin_expf(scores[j - first] - max_score);
    scores[j - first] = e;
    sum += e;
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int32_t d = 0; d < head_dim; ++d)
    out[d] = 0;
  for (int64_t j = first; j <= last; ++j) {
    const float p = scores[j - first] * inv;
    const float* v = values(j);
    for (int32_t d = 0; d < head_dim; ++d)
      out[d] += p * v[d];
  }
}

} // namespace metronome::ref
