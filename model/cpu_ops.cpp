#include "model/cpu_ops.hpp"

#include "model/dtype.hpp"
#include "model/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace metronome::ref {

void linear(const tensor_view& w, const tensor_view* bias, const float* x, int64_t rows,
            float* y) {
  const int64_t R = w.shape[0], C = w.shape[1];
  const size_t row_bytes = size_t(C) * dtype_size(w.type);
  std::vector<float> b;
  if (bias) {
    b.resize(size_t(R));
    to_f32(bias->type, bias->data, b.data(), size_t(R));
  }
  parallel_for(0, R, 16, [&](int64_t lo, int64_t hi) {
    std::vector<float> row(static_cast<size_t>(C));
    for (int64_t r = lo; r < hi; ++r) {
      to_f32(w.type, w.data + size_t(r) * row_bytes, row.data(), size_t(C));
      const float* wr = row.data();
      for (int64_t t = 0; t < rows; ++t) {
        const float* xt = x + t * C;
        float acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t c = 0; c < C; ++c)
          acc += wr[c] * xt[c];
        y[t * R + r] = bias ? acc + b[size_t(r)] : acc;
      }
    }
  });
}

void rms_norm(const float* x, const float* weight, double eps, int64_t rows, int64_t n,
              float* out) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* xt = x + t * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i)
      ss += double(xt[i]) * xt[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / double(n) + eps));
    float* ot = out + t * n;
    for (int64_t i = 0; i < n; ++i)
      ot[i] = weight[i] * (xt[i] * inv);
  }
}

void rms_norm(const float* x, const tensor_view& weight, double eps, int64_t rows, int64_t n,
              float* out) {
  std::vector<float> w(static_cast<size_t>(n));
  to_f32(weight.type, weight.data, w.data(), size_t(n));
  rms_norm(x, w.data(), eps, rows, n, out);
}

void rope(float* x, int32_t heads, int32_t head_dim, int64_t pos, const float* inv_freq) {
  const int32_t half = head_dim / 2;
  for (int32_t i = 0; i < half; ++i) {
    // As Hugging Face: the angle in float32, its cosine and sine from it.
    const float angle = float(pos) * inv_freq[i];
    const float c = std::cos(angle), s = std::sin(angle);
    for (int32_t h = 0; h < heads; ++h) {
      float* v = x + h * head_dim;
      const float a = v[i], b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

void round_rows_to_e4m3(float* x, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * n;
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i)
      amax = std::max(amax, std::fabs(row[i]));
    const float scale = amax * (1.0f / 448.0f);
    // gpu/kernel_util.cuh's e4m3_inverse_scale: a row below 2^-100 is zeros.
    const float inv = amax >= 0x1p-100f ? 448.0f / amax : 0.0f;
    for (int64_t i = 0; i < n; ++i)
      row[i] = e4m3_to_f32(f32_to_e4m3(row[i] * inv)) * scale;
  }
}

void round_to_e5m2(float* x, int64_t n, float scale, kv_overflow_count& count) {
  const float inv = 1.0f / scale; // exact: scale is a power of two
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    if (!std::isfinite(v))
      ++count.non_finite;
    else if (std::fabs(v * inv) > e5m2_max)
      ++count.saturated;
    x[i] = e5m2_to_f32(f32_to_e5m2(v * inv)) * scale;
  }
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  parallel_for(0, n, 65536, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  });
}

void embed(const tensor_view& table, std::span<const int32_t> ids, float* out) {
  const int64_t hidden = table.shape[1];
  const size_t row_bytes = size_t(hidden) * dtype_size(table.type);
  for (size_t t = 0; t < ids.size(); ++t)
    to_f32(table.type, table.data + size_t(ids[t]) * row_bytes, out + int64_t(t) * hidden,
           size_t(hidden));
}

} // namespace metronome::ref
