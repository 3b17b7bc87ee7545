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

/// Element type of a tensor as stored in a safetensors file. i32 holds the
/// packed 4-bit words of GPTQ and AWQ checkpoints (qweight, qzeros, g_idx;
/// docs/quantization.md): never a float, so to_f32 and from_f32 refuse it.
enum class dtype : uint8_t { f32, f16, bf16, i32 };

/// Bytes per element.
constexpr size_t dtype_size(dtype t) {
  return t == dtype::f32 || t == dtype::i32 ? 4 : 2;
}

/// Whether `t` holds floating-point values (f32, f16, bf16).
constexpr bool is_float(dtype t) {
  return t != dtype::i32;
}

/// The safetensors spelling ("F32", "F16", "BF16", "I32").
constexpr std::string_view dtype_name(dtype t) {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::i32: return "I32";
  }
  return "?";
}

/// Parses a safetensors dtype string; nullopt for types Metronome cannot use.
std::optional<dtype> parse_dtype(std::string_view name);

/// Parses a `torch_dtype` value of config.json ("bfloat16", "float16", "float32").
std::optional<dtype> parse_torch_dtype(std::string_view name);

/// The config.json spelling ("bfloat16", ...).
std::string_view torch_dtype_name(dtype t);

/// Element type of the KV cache (engine.kv_cache_dtype): bf16, or fp8 (e4m3
/// bytes with one float scale per token row of each kv head). Only the CUDA
/// runner stores it so; the CPU's KV cache is fp32 always.
enum class kv_cache_dtype_kind : uint8_t { bf16, fp8 };

/// The spelling of metronome.yaml and the command lines: "bf16", "fp8".
constexpr std::string_view to_string(kv_cache_dtype_kind x) {
  switch (x) {
    case kv_cache_dtype_kind::bf16: return "bf16";
    case kv_cache_dtype_kind::fp8: return "fp8";
  }
  return "?";
}

/// Parses "bf16" or "fp8"; nullopt for anything else.
constexpr std::optional<kv_cache_dtype_kind> parse_kv_cache_dtype(std::string_view name) {
  for (auto x : {kv_cache_dtype_kind::bf16, kv_cache_dtype_kind::fp8})
    if (name == to_string(x))
      return x;
  return std::nullopt;
}

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

/// FP8 E4M3 (OCP "e4m3fn": 4 exponent bits, bias 7, 3 mantissa bits, no
/// infinities, 0x7f and 0xff NaN, largest finite 448) to float: exact. The
/// KV cache's fp8 form stores its rows this way (gpu/kernels.hpp, kv_view).
inline float e4m3_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t{b & 0x80u} << 24;
  const uint32_t e = (b >> 3) & 0xfu, m = b & 0x7u;
  if (e == 0xfu && m == 0x7u)
    return bits_to_f32(sign | 0x7fc00000u);
  if (e == 0) // subnormal: m * 2^-9, exact in float
    return bits_to_f32(sign | f32_to_bits(float(m) * 0x1p-9f));
  return bits_to_f32(sign | ((e + 120u) << 23) | (m << 20));
}

/// float to FP8 E4M3, round to nearest even, saturating to +-448 (what the
/// GPU's `cvt.rn.satfinite.e4m3x2.f32` does); NaN to 0x7f.
inline uint8_t f32_to_e4m3(float f) {
  const uint32_t bits = f32_to_bits(f);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag > 0x7f800000u)
    return 0x7f;
  if (mag >= 0x43e00000u) // 448 and above (and infinity) saturate
    return static_cast<uint8_t>(sign | 0x7eu);
  const float a = bits_to_f32(mag);
  if (a < 0x1p-6f) { // the subnormal range: steps of 2^-9, ties to even
    const float q = a * 0x1p9f;  // exact
    uint32_t n = uint32_t(q);
    const float rest = q - float(n);
    if (rest > 0.5f || (rest == 0.5f && (n & 1u)))
      ++n; // n = 8 is the smallest normal, 0x08
    return static_cast<uint8_t>(sign | n);
  }
  // Normal: keep 3 of float's 23 mantissa bits, ties to even; a carry out of
  // the mantissa moves to the next exponent (at most 448, checked above).
  const uint32_t e = (mag >> 23) - 120u; // 1..15
  uint32_t code = (e << 3) | ((mag >> 20) & 0x7u);
  const uint32_t rest = mag & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (code & 1u)))
    ++code;
  return static_cast<uint8_t>(sign | code);
}

/// IEEE half (stored as its 16 bits) to float: exact.
float f16_to_f32(uint16_t h);

/// float to IEEE half, round to nearest even, overflow to infinity.
uint16_t f32_to_f16(float f);

/// Converts `n` elements of float type `t` at `src` to float; throws
/// std::invalid_argument for i32 (packed words, not values).
void to_f32(dtype t, const std::byte* src, float* dst, size_t n);

/// Converts `n` floats to float type `t` at `dst`; throws
/// std::invalid_argument for i32.
void from_f32(dtype t, const float* src, std::byte* dst, size_t n);

} // namespace metronome
