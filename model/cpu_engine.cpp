#include "model/cpu_engine.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "model/cpu_ops.hpp"
#include "model/parallel.hpp"

namespace metronome {

cpu_kv_cache::cpu_kv_cache(const model_config& cfg, int32_t num_pages, int32_t page_size)
  : layers_(cfg.num_layers),
    num_pages_(num_pages),
    page_size_(page_size),
    kv_heads_(cfg.num_kv_heads),
    slot_floats_(int64_t(cfg.num_kv_heads) * cfg.head_dim) {
  if (num_pages <= 0 || page_size <= 0)
    throw std::invalid_argument("cpu_kv_cache: num_pages and page_size must be positive");
  data_.assign(size_t(layers_) * size_t(num_pages_) * 2 * size_t(page_size_)
                 * size_t(slot_floats_),
               0.0f);
}

void cpu_kv_cache::enable_row_scales() {
  if (scales_.empty())
    scales_.assign(size_t(layers_) * size_t(num_pages_) * 2 * size_t(page_size_)
                     * size_t(kv_heads_),
                   1.0f);
}

cpu_engine::cpu_engine(std::shared_ptr<const model_folder> model, int32_t num_pages,
                       int32_t page_size)
  : model_(std::move(model)),
    weights_(working_weights(*model_, dequantized_, dequantized_views_)),
    kv_(model_->config, num_pages, page_size),
    inv_freq_(rope_inv_freq(model_->config)) {
  // nop
}

void cpu_engine::set_kv_dtype(kv_cache_dtype_kind dtype) {
  kv_dtype_ = dtype;
  if (dtype == kv_cache_dtype_kind::fp8_e5m2)
    kv_.enable_row_scales();
}

model_weights cpu_engine::working_weights(const model_folder& model,
                                          std::deque<std::vector<float>>& storage,
                                          std::deque<tensor_view>& views) {
  model_weights w = model.weights;
  if (!w.quantized)
    return w;
  const quantization_config& qc = model.config.quantization.value();
  for (auto& layer : w.layers) {
    for (int i = 0; i < num_projections; ++i) {
      const quantized_linear& ql = layer.quantized[size_t(i)];
      if (!ql.present())
        continue;
      auto& data = storage.emplace_back(size_t(ql.out_features * ql.in_features));
      dequantize(qc, ql, data.data());
      tensor_view& v = views.emplace_back();
      v.name = ql.qweight->name.substr(0, ql.qweight->name.size() - 7) + "weight (dequantized)";
      v.type = dtype::f32;
      v.shape = {ql.out_features, ql.in_features};
      v.data = reinterpret_cast<const std::byte*>(data.data());
      v.nbytes = data.size() * sizeof(float);
      v.file = ql.qweight->file;
      layer.weight(projection(i)) = &v;
    }
  }
  return w;
}

void cpu_engine::forward(std::span<const forward_input> batch, std::span<float> logits) {
  const auto& cfg = model_->config;
  const auto& w = weights_;
  const int64_t hidden = cfg.hidden_size, q_size = cfg.q_size(), kv_size = cfg.kv_size();
  const int64_t inter = cfg.intermediate_size, vocab = cfg.vocab_size;
  if (logits.size() < batch.size() * size_t(vocab))
    throw std::invalid_argument("cpu_engine::forward: logits buffer too small");

  // Flatten the batch: one row per token, with its position and sequence.
  std::vector<int32_t> ids;
  std::vector<int64_t> positions;
  std::vector<int64_t> last_row;
  for (const auto& in : batch) {
    if (in.tokens.empty())
      throw std::invalid_argument("cpu_engine::forward: empty input");
    const int64_t end = int64_t(in.start_pos) + int64_t(in.tokens.size());
    if (in.start_pos < 0 || int64_t(in.pages.size()) * kv_.page_size() < end)
      throw std::invalid_argument("cpu_engine::forward: page table covers "
                                  + std::to_string(in.pages.size() * size_t(kv_.page_size()))
                                  + " positions, need " + std::to_string(end));
    for (auto p : in.pages)
      if (p < 0 || p >= kv_.num_pages())
        throw std::invalid_argument("cpu_engine::forward: page id out of range");
    for (size_t t = 0; t < in.tokens.size(); ++t) {
      if (in.tokens[t] < 0 || in.tokens[t] >= cfg.vocab_size)
        throw std::invalid_argument("cpu_engine::forward: token id "
                                    + std::to_string(in.tokens[t]) + " outside the vocabulary");
      ids.push_back(in.tokens[t]);
      positions.push_back(in.start_pos + int64_t(t));
    }
    last_row.push_back(int64_t(ids.size()) - 1);
  }
  const int64_t rows = int64_t(ids.size());

  std::vector<float> x(size_t(rows * hidden)), xn(x.size()), attn_out(size_t(rows * q_size));
  std::vector<float> q(size_t(rows * q_size)), k(size_t(rows * kv_size)), v(k.size());
  std::vector<float> gate(size_t(rows * inter)), up(gate.size()), proj(x.size());
  ref::embed(*w.embed, ids, x.data());

  for (int32_t l = 0; l < cfg.num_layers; ++l) {
    const auto& lw = w.layers[size_t(l)];
    // Attention block.
    ref::rms_norm(x.data(), *lw.attn_norm, cfg.rms_norm_eps, rows, hidden, xn.data());
    ref::linear(*lw.q, lw.q_bias, xn.data(), rows, q.data());
    ref::linear(*lw.k, lw.k_bias, xn.data(), rows, k.data());
    ref::linear(*lw.v, lw.v_bias, xn.data(), rows, v.data());
    int64_t row = 0;
    for (const auto& in : batch) {
      for (size_t t = 0; t < in.tokens.size(); ++t, ++row) {
        const int64_t pos = positions[size_t(row)];
        ref::rope(q.data() + row * q_size, cfg.num_heads, cfg.head_dim, pos, inv_freq_.data());
        ref::rope(k.data() + row * kv_size, cfg.num_kv_heads, cfg.head_dim, pos,
                  inv_freq_.data());
        const int32_t page = in.pages[size_t(pos / kv_.page_size())];
        const int32_t slot = int32_t(pos % kv_.page_size());
        std::copy_n(k.data() + row * kv_size, kv_size, kv_.slot(l, page, 0, slot));
        std::copy_n(v.data() + row * kv_size, kv_size, kv_.slot(l, page, 1, slot));
        // A sequence in full precision (forward_input::full_precision)
        // keeps its rows unrounded.
        const auto written = in.full_precision ? kv_cache_dtype_kind::bf16 : kv_dtype_;
        if (written == kv_cache_dtype_kind::fp8) {
          ref::round_rows_to_e4m3(kv_.slot(l, page, 0, slot), cfg.num_kv_heads, cfg.head_dim);
          ref::round_rows_to_e4m3(kv_.slot(l, page, 1, slot), cfg.num_kv_heads, cfg.head_dim);
        } else if (written == kv_cache_dtype_kind::fp8_e5m2) {
          kv_overflow_count ignored;
          kv_overflow_count& count = in.kv_overflow ? *in.kv_overflow : ignored;
          round_e5m2_row(l, in, pos, 0, count);
          round_e5m2_row(l, in, pos, 1, count);
        }
      }
    }
    attention(l, batch, q.data(), attn_out.data());
    ref::linear(*lw.o, lw.o_bias, attn_out.data(), rows, proj.data());
    for (size_t i = 0; i < x.size(); ++i)
      x[i] += proj[i];
    // MLP block.
    ref::rms_norm(x.data(), *lw.mlp_norm, cfg.rms_norm_eps, rows, hidden, xn.data());
    ref::linear(*lw.gate, nullptr, xn.data(), rows, gate.data());
    ref::linear(*lw.up, nullptr, xn.data(), rows, up.data());
    ref::silu_mul(gate.data(), up.data(), rows * inter, gate.data());
    ref::linear(*lw.down, nullptr, gate.data(), rows, proj.data());
    for (size_t i = 0; i < x.size(); ++i)
      x[i] += proj[i];
  }

  // Final norm and LM head on the last token of each sequence only.
  const int64_t n = int64_t(batch.size());
  std::vector<float> last(size_t(n * hidden));
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(x.data() + last_row[size_t(i)] * hidden, hidden, last.data() + i * hidden);
  ref::rms_norm(last.data(), *w.final_norm, cfg.rms_norm_eps, n, hidden, last.data());
  ref::linear(*w.lm_head, nullptr, last.data(), n, logits.data());
}

void cpu_engine::round_e5m2_row(int32_t layer, const forward_input& in, int64_t pos,
                                int32_t which, kv_overflow_count& count) {
  const auto& cfg = model_->config;
  const int32_t d = cfg.head_dim, ps = kv_.page_size();
  auto page_of = [&](int64_t p) { return in.pages[size_t(p / ps)]; };
  auto slot_of = [&](int64_t p) { return int32_t(p % ps); };
  float* row = kv_.slot(layer, page_of(pos), which, slot_of(pos));
  float* scales = kv_.row_scales(layer, page_of(pos), which, slot_of(pos));
  const int64_t first = pos - pos % kv_e5m2_window;
  // The previous windows as stored: positions [history_begin, first).
  const int64_t history_begin = std::max<int64_t>(0, first - int64_t(kv_e5m2_history)
                                                           * kv_e5m2_window);
  auto amax = [d](const float* v, float m) {
    for (int32_t i = 0; i < d; ++i)
      if (std::isfinite(v[i]))
        m = std::max(m, std::fabs(v[i]));
    return m;
  };
  for (int32_t h = 0; h < cfg.num_kv_heads; ++h) {
    float scale;
    if (pos == first) {
      float reference = amax(row + int64_t(h) * d, 0.0f);
      for (int64_t j = history_begin; j < first; ++j)
        reference = amax(kv_.slot(layer, page_of(j), which, slot_of(j)) + int64_t(h) * d,
                         reference);
      scale = e5m2_window_scale(reference);
    } else {
      scale = kv_.row_scales(layer, page_of(first), which, slot_of(first))[h];
    }
    scales[h] = scale;
    ref::round_to_e5m2(row + int64_t(h) * d, d, scale, count);
  }
}

void cpu_engine::attention(int32_t layer, std::span<const forward_input> batch, const float* q,
                           float* out) {
  const auto& cfg = model_->config;
  const int32_t d = cfg.head_dim, heads = cfg.num_heads, group = cfg.gqa_group();
  const int64_t q_size = cfg.q_size();
  const float scale = 1.0f / std::sqrt(float(d));
  const bool sliding = cfg.is_sliding(layer);
  const int64_t window = cfg.sliding_window.value_or(0);

  // Work items: (row, head) pairs, rows in batch order.
  struct item {
    const forward_input* in;
    int64_t row;
    int64_t pos;
  };
  std::vector<item> items;
  int64_t row = 0;
  for (const auto& in : batch)
    for (size_t t = 0; t < in.tokens.size(); ++t, ++row)
      items.push_back({&in, row, in.start_pos + int64_t(t)});
  const int64_t total = int64_t(items.size()) * heads;
  const int64_t max_len = [&] {
    int64_t m = 0;
    for (const auto& it : items)
      m = std::max(m, it.pos + 1);
    return m;
  }();
  const int32_t page_size = kv_.page_size();
  const int64_t kv_stride_head = d;

  parallel_for(0, total, 4, [&](int64_t lo, int64_t hi) {
    std::vector<float> scores(static_cast<size_t>(max_len));
    for (int64_t w = lo; w < hi; ++w) {
      const auto& it = items[size_t(w / heads)];
      const int32_t h = int32_t(w % heads);
      const int32_t g = h / group;
      const int64_t first = sliding ? std::max<int64_t>(0, it.pos - window + 1) : 0;
      auto pages = it.in->pages;
      auto keys = [&](int64_t j) {
        return kv_.slot(layer, pages[size_t(j / page_size)], 0, int32_t(j % page_size))
               + g * kv_stride_head;
      };
      auto values = [&](int64_t j) {
        return kv_.slot(layer, pages[size_t(j / page_size)], 1, int32_t(j % page_size))
               + g * kv_stride_head;
      };
      ref::attend(q + it.row * q_size + int64_t(h) * d, d, first, it.pos, scale, keys, values,
                  scores.data(), out + it.row * q_size + int64_t(h) * d);
    }
  });
}

} // namespace metronome
