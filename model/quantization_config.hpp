#pragma once
// `quantization_config` of config.json: which 4-bit layout a checkpoint's
// linear projections are stored in (docs/quantization.md, "What Metronome
// loads"). Only what Metronome can dequantize exactly is accepted: GPTQ v1
// and AWQ GEMM, 4 bits, group size 32, 64, 128 or per channel. Every other
// value of a field that changes the tensors' meaning, and every field this
// parser does not know, is refused by name: a checkpoint is never read in a
// layout it is not in.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace metronome {

/// The two 4-bit layouts (docs/quantization.md).
enum class quant_method : uint8_t { gptq, awq };

/// "gptq" or "awq", as config.json spells it.
std::string_view quant_method_name(quant_method m);

/// The parsed and validated `quantization_config` object.
struct quantization_config {
  quant_method method = quant_method::gptq;
  /// Always 4 once parsed.
  int32_t bits = 4;
  /// Input rows per group of scales and zeros: 32, 64 or 128; -1 is one
  /// group spanning every input row ("per channel").
  int32_t group_size = 128;
  /// GPTQ: every zero is 8 (qzeros hold 7s); false: zeros per group. AWQ
  /// always stores zeros (`zero_point: true`) and leaves this false.
  bool sym = false;
  /// GPTQ act-order: `g_idx` maps input rows to groups in any order. False:
  /// row i is in group i / group_size (g_idx, if stored, must say so).
  bool desc_act = false;
  /// AWQ's `modules_to_not_convert` (GPTQ: empty): names of modules left in
  /// float. Informational: the loader takes a projection as quantized where
  /// its `qweight` is stored and as plain where its `weight` is.
  std::vector<std::string> modules_to_not_convert;

  /// Groups of scales and zeros for `in_features` input rows: ceil(in /
  /// group_size), 1 for per channel.
  int64_t num_groups(int64_t in_features) const {
    return group_size < 0 ? 1 : (in_features + group_size - 1) / group_size;
  }

  /// A short description for messages and logs: "gptq, 4 bits, group 128,
  /// sym, desc_act".
  std::string describe() const;

  /// Parses `q`, the value of config.json's `quantization_config`; `file`
  /// names config.json in errors. Throws model_error whose field is
  /// "quantization_config.<field>" for an unsupported method, bit width,
  /// group size, checkpoint format, AWQ version or zero-point setting, a
  /// mistyped value, or a field it does not know.
  static quantization_config from_json(const nlohmann::json& q, const std::string& file);

  /// The `quantization_config` object a checkpoint of this layout carries
  /// in config.json (from_json parses it back to an equal value; GPTQ's
  /// modules_to_not_convert is not written).
  nlohmann::json to_json() const;
};

} // namespace metronome
