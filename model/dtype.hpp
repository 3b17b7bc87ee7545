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

/// Element type of the KV cache (engine.kv_cache_dtype): bf16; fp8 (e4m3
/// bytes with one float scale per token row of each kv head); or fp8_e5m2
/// (e5m2 bytes with one scale per kv head and window of 256 positions of a
/// sequence, set when the window starts: e5m2_window_scale below). The CUDA
/// runner stores all three so (fp8_e5m2: gpu/kv_e5m2.cuh); the CPU's KV
/// cache is fp32 always, and `cpu_engine::set_kv_dtype` rounds it as fp8 or
/// fp8_e5m2 would store it (the formats' reference).
enum class kv_cache_dtype_kind : uint8_t { bf16, fp8, fp8_e5m2 };

/// The spelling of metronome.yaml and the command lines: "bf16", "fp8",
/// "fp8_e5m2".
constexpr std::string_view to_string(kv_cache_dtype_kind x) {
  switch (x) {
    case kv_cache_dtype_kind::bf16: return "bf16";
    case kv_cache_dtype_kind::fp8: return "fp8";
    case kv_cache_dtype_kind::fp8_e5m2: return "fp8_e5m2";
  }
  return "?";
}

/// Parses "bf16", "fp8" or "fp8_e5m2"; nullopt for anything else.
constexpr std::optional<kv_cache_dtype_kind> parse_kv_cache_dtype(std::string_view name) {
  for (auto x : {kv_cache_dtype_kind::bf16, kv_cache_dtype_kind::fp8,
                 kv_cache_dtype_kind::fp8_e5m2})
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

/// FP8 E5M2 (OCP: 5 exponent bits, bias 15, 2 mantissa bits; the upper
/// byte of an IEEE half: 0x7c infinity, 0x7d-0x7f NaN, largest finite
/// 57344 = 0x7b, smallest normal 2^-14 = 0x04, subnormals m * 2^-16) to
/// float: exact. NaN codes give a quiet NaN of their sign.
inline float e5m2_to_f32(uint8_t b) {
  const uint32_t sign = uint32_t{b & 0x80u} << 24;
  const uint32_t e = (b >> 2) & 0x1fu, m = b & 0x3u;
  if (e == 0x1fu)
    return bits_to_f32(sign | (m ? 0x7fc00000u : 0x7f800000u));
  if (e == 0) // subnormal: m * 2^-16, exact in float
    return bits_to_f32(sign | f32_to_bits(float(m) * 0x1p-16f));
  return bits_to_f32(sign | ((e + 112u) << 23) | (m << 21));
}

/// The largest finite E5M2 value.
inline constexpr float e5m2_max = 57344.0f;

/// float to FP8 E5M2, round to nearest even, saturating: a magnitude above
/// 57344, infinity included, becomes +-57344 (0x7b / 0xfb; what the GPU's
/// `cvt.rn.satfinite.e5m2x2.f32` does); NaN becomes 0x7f. Callers that must
/// know count those inputs themselves (ref::round_to_e5m2).
inline uint8_t f32_to_e5m2(float f) {
  const uint32_t bits = f32_to_bits(f);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag > 0x7f800000u)
    return 0x7f;
  if (mag >= 0x47600000u) // 57344 and above (and infinity) saturate
    return static_cast<uint8_t>(sign | 0x7bu);
  const float a = bits_to_f32(mag);
  if (a < 0x1p-14f) { // the subnormal range: steps of 2^-16, ties to even
    const float q = a * 0x1p16f; // exact
    uint32_t n = uint32_t(q);
    const float rest = q - float(n);
    if (rest > 0.5f || (rest == 0.5f && (n & 1u)))
      ++n; // n = 4 is the smallest normal, 0x04
    return static_cast<uint8_t>(sign | n);
  }
  // Normal: keep 2 of float's 23 mantissa bits, ties to even; a carry out of
  // the mantissa moves to the next exponent (at most 0x7b: above 57344 was
  // saturated before).
  const uint32_t e = (mag >> 23) - 112u; // 1..30
  uint32_t code = (e << 2) | ((mag >> 21) & 0x3u);
  const uint32_t rest = mag & 0x1fffffu;
  if (rest > 0x100000u || (rest == 0x100000u && (code & 1u)))
    ++code;
  return static_cast<uint8_t>(sign | code);
}

/// The fp8_e5m2 KV cache's scale rule (docs/architecture.md, "The KV
/// cache's element type"). A sequence's positions fall in windows of
/// kv_e5m2_window; each (layer, K or V, kv head) of a window has one scale,
/// fixed when the window's first row is written from `reference`: the
/// largest finite |value| of that row and of the kv_e5m2_history windows
/// before it, as stored. The scale is a power of two, 2^(ceil(log2
/// reference) - kv_e5m2_headroom_log2), so that dividing by it is exact and
/// a value keeps E5M2's own rounding; the reference lands at most at 2^8 =
/// 256, leaving values up to 224 times it before saturation (57344 / 256)
/// and 2^-22 of it before the subnormals. The exponent is clamped to
/// [-100, 100] (the scaled largest value stays finite in float); a
/// reference of 0 (or not finite) gives scale 1.
inline constexpr int32_t kv_e5m2_window = 256;
inline constexpr int32_t kv_e5m2_history = 3;
inline constexpr int32_t kv_e5m2_headroom_log2 = 8;

/// The rule on float bits: the bits of the scale for a reference with bits
/// `reference` (integer arithmetic only, so that the CUDA kernels share it:
/// gpu/kv_e5m2.cuh).
constexpr uint32_t e5m2_window_scale_bits(uint32_t reference) {
  const uint32_t mag = reference & 0x7fffffffu;
  if (mag == 0 || mag >= 0x7f800000u)
    return 0x3f800000u; // 1
  // ceil(log2 r): r = 1.f * 2^u (normal) is u when f == 0, else u + 1;
  // subnormals (u < -126) are far below the clamp, which takes over.
  int32_t up = 0;
  if (mag < 0x00800000u)
    up = -126;
  else
    up = int32_t(mag >> 23) - 127 + ((mag & 0x7fffffu) ? 1 : 0);
  int32_t e = up - kv_e5m2_headroom_log2;
  e = e < -100 ? -100 : (e > 100 ? 100 : e);
  return uint32_t(e + 127) << 23;
}

/// See above: 2^clamp(ceil(log2 reference) - 8, -100, 100), or 1.
inline float e5m2_window_scale(float reference) {
  return bits_to_f32(e5m2_window_scale_bits(f32_to_bits(reference)));
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
