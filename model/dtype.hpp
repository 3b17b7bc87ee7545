#pragma once
// Element types of model tensors and exact conversions between them.
//
// The conversions are bit-level and deterministic (no dependence on the
// host's floating-point environment), so a model written on one machine is
// byte-identical to one written on another. Shared with CUDA sources: C++20.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace metronome {

/// Element type of a tensor as stored in a safetensors file.
enum class dtype : uint8_t { f32, f16, bf16 };

/// Bytes per element.
constexpr size_t dtype_size(dtype t) {
  return t == dtype::f32 ? 4 : 2;
}

/// The safetensors spelling ("F32", "F16", "BF16").
constexpr std::string_view dtype_name(dtype t) {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
  }
  return "?";
}

/// Parses a safetensors dtype string; nullopt for types Metronome cannot use.
std::optional<dtype> parse_dtype(std::string_view name);

/// Parses a `torch_dtype` value of config.json ("bfloat16", "float16", "float32").
std::optional<dtype> parse_torch_dtype(std::string_view name);

/// The config.json spelling ("bfloat16", ...).
std::string_view torch_dtype_name(dtype t);

// -- scalar conversions ---------------------------------------------------------

inline float bits_to_f32(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint32_t f32_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

/// bfloat16 (stored as its 16 bits) to float: exact.
inline float bf16_to_f32(uint16_t h) {
  return bits_to_f32(uint32_t{h} << 16);
}

/// float to bfloat16, round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits = f32_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) // NaN: keep it quiet
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

/// IEEE half (stored as its 16 bits) to float: exact.
float f16_to_f32(uint16_t h);

/// float to IEEE half, round to nearest even, overflow to infinity.
uint16_t f32_to_f16(float f);

/// Converts `n` elements of type `t` at `src` to float.
void to_f32(dtype t, const std::byte* src, float* dst, size_t n);

/// Converts `n` floats to type `t` at `dst`.
void from_f32(dtype t, const float* src, std::byte* dst, size_t n);

} // namespace metronome
