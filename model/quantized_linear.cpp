#include "model/quantized_linear.hpp"

#include <cstring>

#include "model/dtype.hpp"
#include "model/model_error.hpp"
#include "model/parallel.hpp"

namespace metronome {


quantized_shapes expected_shapes(const quantization_config& cfg, int64_t in, int64_t out) {
  const int64_t groups = cfg.num_groups(in);
  quantized_shapes s;
  if (cfg.method == quant_method::gptq) {
    s.qweight = {in / 8, out};
    s.g_idx = {in};
  } else {
    s.qweight = {in, out / 8};
  }
  s.qzeros = {groups, out / 8};
  s.scales = {groups, out};
  return s;
}

void check_group_index(const quantization_config& cfg, const quantized_linear& p) {
  if (!p.g_idx)
    return;
  const int64_t groups = cfg.num_groups(p.in_features);
  for (int64_t i = 0; i < p.in_features; ++i) {
    const int32_t g = int32_t(packed_word(*p.g_idx, i));
    if (g < 0 || g >= groups)
      throw model_error(p.g_idx->file, p.g_idx->name,
                        "row " + std::to_string(i) + " names group " + std::to_string(g)
                          + " of " + std::to_string(groups));
    const int64_t own = cfg.group_size < 0 ? 0 : i / cfg.group_size;
    if (!cfg.desc_act && g != own)
      throw model_error(p.g_idx->file, p.g_idx->name,
                        "row " + std::to_string(i) + " is in group " + std::to_string(g)
                          + " but desc_act is false, which puts it in group "
                          + std::to_string(own) + " (i / group_size)");
  }
}

void dequantize(const quantization_config& cfg, const quantized_linear& p, float* w) {
  const int64_t in = p.in_features, out = p.out_features;
  const int64_t zero_words = out / 8;
  std::vector<float> scale(size_t(p.scales->numel()));
  to_f32(p.scales->type, p.scales->data, scale.data(), scale.size());
  std::vector<int32_t> group(static_cast<size_t>(in));
  for (int64_t i = 0; i < in; ++i)
    group[size_t(i)] = p.g_idx ? int32_t(packed_word(*p.g_idx, i))
                               : (cfg.group_size < 0 ? 0 : int32_t(i / cfg.group_size));
  const bool gptq = cfg.method == quant_method::gptq;
  parallel_for(0, out, 8, [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o) {
      float* row = w + o * in;
      // Column o of the packed words: its nibble within a word along out.
      const int k_out = gptq ? int(o % 8) : awq_reverse[o % 8];
      for (int64_t i = 0; i < in; ++i) {
        const int64_t g = group[size_t(i)];
        int32_t q, zero;
        if (gptq) {
          q = int32_t(packed_nibble(packed_word(*p.qweight, (i / 8) * out + o), int(i % 8)));
          // v1 stores zero - 1; a stored 15 reads as 16 (docs/quantization.md).
          zero = int32_t(packed_nibble(packed_word(*p.qzeros, g * zero_words + o / 8), k_out)) + 1;
        } else {
          q = int32_t(packed_nibble(packed_word(*p.qweight, i * zero_words + o / 8), k_out));
          zero = int32_t(packed_nibble(packed_word(*p.qzeros, g * zero_words + o / 8), k_out));
        }
        row[i] = scale[size_t(g * out + o)] * float(q - zero);
      }
    }
  });
}

} // namespace metronome
