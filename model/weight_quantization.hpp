#pragma once
// model.quantize / --quantize: whether a float checkpoint's projections are
// quantized when it is loaded (model/rtn_quantize.hpp). Header-only, so the
// configuration library can name the values without linking the model.

#include <cstdint>
#include <optional>
#include <string_view>

namespace metronome {

/// none: the weights as stored; int4: every decoder projection of a float
/// checkpoint rounded to nearest into the AWQ GEMM layout, group 128.
enum class weight_quantization : uint8_t { none, int4 };

/// The spelling of metronome.yaml and the command lines: "none", "int4".
constexpr std::string_view to_string(weight_quantization x) {
  switch (x) {
    case weight_quantization::none: return "none";
    case weight_quantization::int4: return "int4";
  }
  return "?";
}

/// Parses "none" or "int4"; nullopt for anything else.
constexpr std::optional<weight_quantization> parse_weight_quantization(std::string_view name) {
  for (auto x : {weight_quantization::none, weight_quantization::int4})
    if (name == to_string(x))
      return x;
  return std::nullopt;
}

} // namespace metronome
