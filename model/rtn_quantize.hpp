#pragma once
// Round-to-nearest (RTN) 4-bit quantization of a float projection into the
// checkpoint layouts Metronome loads (docs/quantization.md, "RTN"): AWQ GEMM
// (asymmetric, a zero per group) and GPTQ v1 (symmetric, zero 8). Used by
// `--quantize int4` at load (quantize_projections) and by `metronome
// make-model --quantize` (model/make_model.hpp); both produce the tensors a
// real checkpoint of that layout stores, so `dequantize()`
// (model/quantized_linear.hpp) reads them back exactly as
// scale * (q - zero), and the CUDA runner sees one path.
//
// The rules, per output column o and group of `group_size` input rows
// (all arithmetic in fp32, scales rounded to fp16 once, round() = to
// nearest, ties to even):
//   AWQ:  lo = min(min w, 0), hi = max(max w, 0)
//         scale = f16((hi - lo) / 15)            (1 where that is 0)
//         zero  = clamp(round(-lo / scale), 0, 15)
//         q     = clamp(round(w / scale) + zero, 0, 15)
//   GPTQ: a = max |w|
//         scale = f16(2 a / 15)                  (1 where that is 0)
//         zero  = 8 (stored 7: v1 stores zero - 1)
//         q     = clamp(round(w / scale) + 8, 0, 15)
// and w' = scale * (q - zero). Error: |w - w'| <= scale / 2 up to the fp16
// rounding of the scale (15 half-ulps of it more: 16 * 2^-11 of a normal
// scale, 16 * 2^-25 for a subnormal one).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/quantization_config.hpp"
#include "model/quantized_linear.hpp"
#include "model/safetensors.hpp"

namespace metronome {

struct model_folder;

/// The quantization_config `--quantize int4` gives a float model: AWQ GEMM,
/// 4 bits, group 128, zero points (what a real AutoAWQ checkpoint's
/// config.json parses to).
quantization_config rtn_int4_config();

/// The layouts' configs make-model writes: AWQ (asymmetric) or GPTQ v1
/// (sym: true, desc_act: false), 4 bits, `group_size` 32, 64, 128 or -1.
quantization_config rtn_config(quant_method method, int32_t group_size = 128);

/// One projection's packed tensors, owned, with views (named as a
/// checkpoint names them) for a quantized_linear. Not copyable or movable:
/// `linear` points at the views.
struct packed_linear {
  std::vector<int32_t> qweight;  ///< GPTQ [in / 8, out]; AWQ [in, out / 8]
  std::vector<int32_t> qzeros;   ///< [groups, out / 8]
  std::vector<uint16_t> scales;  ///< f16 bits, [groups, out]
  std::vector<int32_t> g_idx;    ///< GPTQ only: [in], i / group_size
  tensor_view qweight_view, qzeros_view, scales_view, g_idx_view;
  /// Points at the views above (g_idx null for AWQ).
  quantized_linear linear;

  packed_linear() = default;
  packed_linear(const packed_linear&) = delete;
  packed_linear& operator=(const packed_linear&) = delete;
};

/// Quantizes `weight` ([out, in], nn.Linear's layout; F32, F16 or BF16)
/// with `cfg`'s layout and group size by the rules above; `prefix` names the
/// views ("model.layers.0.self_attn.q_proj." + "qweight", ...), `file` is
/// their file for messages. Parallel over output columns (parallel_for).
/// Throws model_error naming weight.name when it is not a float 2-D tensor,
/// when in is not a multiple of the group size (of 8 for per channel) or out
/// not a multiple of 8, when a weight is not finite, or when a group's range
/// overflows an fp16 scale.
std::unique_ptr<packed_linear> rtn_quantize(const quantization_config& cfg,
                                            const tensor_view& weight, const std::string& prefix,
                                            const std::string& file);

/// The same from fp32 values w[out][in] (`name` for messages).
std::unique_ptr<packed_linear> rtn_quantize(const quantization_config& cfg, const float* w,
                                            int64_t out, int64_t in, const std::string& name,
                                            const std::string& prefix, const std::string& file);

/// `--quantize int4`: replaces every decoder projection (q, k, v, o, gate,
/// up, down) of the float model `m` by its RTN form in `cfg`'s layout and
/// group size (by default the AWQ GEMM layout, group 128: rtn_int4_config;
/// the quality tool also asks for GPTQ's, rtn_config(gptq)), held in
/// m.owned_projections; binds each as the loader binds a real checkpoint's
/// (layer_weights::quantized set, the float weight pointer null,
/// model_weights::quantized true), and sets m.config.quantization to `cfg`
/// and m.quantized_at_load. Embeddings, norms, biases and the LM head stay
/// as they are. The float projections' pages are released from memory
/// (they stay mapped). `cfg.group_size` must be positive. Throws
/// model_error when the checkpoint is already quantized (naming
/// config.json's quantization_config) or a projection's in_features is not
/// a multiple of the group size or out_features not of 8 (naming the
/// tensor).
void quantize_projections(model_folder& m, const quantization_config& cfg = rtn_int4_config());

} // namespace metronome
