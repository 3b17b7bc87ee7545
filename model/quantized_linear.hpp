#pragma once
// One linear projection stored as 4-bit integers in the GPTQ v1 or AWQ GEMM
// layout (docs/quantization.md), as views into the mapped checkpoint, and
// its exact dequantization: w = scale * (q - zero).

#include <cstdint>
#include <cstring>
#include <vector>

#include "model/quantization_config.hpp"
#include "model/safetensors.hpp"

namespace metronome {

/// The tensors of a quantized `nn.Linear(in_features, out_features)`,
/// shapes and dtypes checked by model_weights::bind. Valid while the
/// tensor_store they point into lives.
struct quantized_linear {
  /// I32, GPTQ [in / 8, out] packed along in; AWQ [in, out / 8] packed
  /// along out, interleaved.
  const tensor_view* qweight = nullptr;
  /// I32 [groups, out / 8], packed along out (AWQ interleaved).
  const tensor_view* qzeros = nullptr;
  /// F16 [groups, out].
  const tensor_view* scales = nullptr;
  /// GPTQ only, I32 [in]: the group of each input row; null where the
  /// checkpoint omits it (row i is then in group i / group_size).
  const tensor_view* g_idx = nullptr;
  int64_t in_features = 0;
  int64_t out_features = 0;

  /// Whether the projection is stored quantized (false: as a float weight).
  bool present() const {
    return qweight != nullptr;
  }
};

/// AWQ GEMM's interleave (AutoAWQ's AWQ_REVERSE_ORDER): output column 8c + j
/// of a packed row is nibble awq_reverse[j] of word c. Every reader and
/// writer of the layout uses this table.
inline constexpr int awq_reverse[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/// Word `index` of an I32 tensor, as unsigned bits (unaligned-safe).
inline uint32_t packed_word(const tensor_view& t, int64_t index) {
  uint32_t v;
  std::memcpy(&v, t.data + size_t(index) * 4, 4);
  return v;
}

/// Nibble k (bits 4k..4k+3) of a packed word, unsigned.
constexpr uint32_t packed_nibble(uint32_t w, int k) {
  return (w >> (4 * k)) & 0xFu;
}

/// The shapes a layout stores for a projection of in x out features.
struct quantized_shapes {
  std::vector<int64_t> qweight, qzeros, scales, g_idx;
};

/// Shapes of `cfg`'s layout for a projection of `in` inputs and `out`
/// outputs (both multiples of 8; the caller checks).
quantized_shapes expected_shapes(const quantization_config& cfg, int64_t in, int64_t out);

/// Checks what shapes cannot: each g_idx entry names a group that exists,
/// and without desc_act it is the row's own group (i / group_size), as
/// kernels that ignore g_idx assume. Throws model_error naming the tensor
/// and the first bad row.
void check_group_index(const quantization_config& cfg, const quantized_linear& p);

/// Dequantizes `p` into w [out_features][in_features] (nn.Linear's weight
/// layout), fp32, with the layout's published formula: GPTQ w[o, i] =
/// scale[g, o] * (q[i, o] - (stored zero + 1)), g = g_idx[i]; AWQ w[o, i] =
/// (q[i, o] - zero[g, o]) * scale[g, o], g = i / group_size. Exact: an f16
/// scale times an integer of at most 5 bits fits fp32's 24-bit mantissa.
/// Parallel over output rows (parallel_for); any thread.
void dequantize(const quantization_config& cfg, const quantized_linear& p, float* w);

} // namespace metronome
