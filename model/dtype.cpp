#include "model/dtype.hpp"

#include <array>
#include <stdexcept>

namespace metronome {

std::optional<dtype> parse_dtype(std::string_view name) {
  if (name == "F32")
    return dtype::f32;
  if (name == "F16")
    return dtype::f16;
  if (name == "BF16")
    return dtype::bf16;
  if (name == "I32")
    return dtype::i32;
  return std::nullopt;
}

std::optional<dtype> parse_torch_dtype(std::string_view name) {
  if (name == "float32" || name == "float")
    return dtype::f32;
  if (name == "float16" || name == "half")
    return dtype::f16;
  if (name == "bfloat16")
    return dtype::bf16;
  return std::nullopt;
}

std::string_view torch_dtype_name(dtype t) {
  switch (t) {
    case dtype::f32: return "float32";
    case dtype::f16: return "float16";
    case dtype::bf16: return "bfloat16";
    case dtype::i32: return "int32";
  }
  return "?";
}

namespace {

float f16_to_f32_slow(uint16_t h) {
  uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) // inf / nan
    return bits_to_f32(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0)
      return bits_to_f32(sign);
    // Subnormal: normalise.
    int shift = 0;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      ++shift;
    }
    mant &= 0x3ffu;
    return bits_to_f32(sign | uint32_t(127 - 15 + 1 - shift) << 23 | (mant << 13));
  }
  return bits_to_f32(sign | (exp + 127 - 15) << 23 | (mant << 13));
}

const std::array<float, 65536>& f16_table() {
  static const auto table = [] {
    std::array<float, 65536> t{};
    for (uint32_t i = 0; i < 65536; ++i)
      t[i] = f16_to_f32_slow(static_cast<uint16_t>(i));
    return t;
  }();
  return table;
}

} // namespace

float f16_to_f32(uint16_t h) {
  return f16_table()[h];
}

uint16_t f32_to_f16(float f) {
  uint32_t bits = f32_to_bits(f);
  uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) // NaN
    return static_cast<uint16_t>(sign | 0x7e00u);
  if (abs >= 0x477ff000u) // rounds to >= 65520: infinity
    return static_cast<uint16_t>(sign | 0x7c00u);
  if (abs < 0x38800000u) { // below the smallest normal half (2^-14)
    if (abs < 0x33000000u) // below half of the smallest subnormal: zero
      return static_cast<uint16_t>(sign);
    // value = m * 2^(e-150) with the implicit bit in m; in units of the
    // smallest subnormal (2^-24) that is m >> (126 - e), shift in [14, 24].
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u)))
      ++q; // rounding up to 0x400 yields the smallest normal, as it should
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias and round the 13 dropped bits to nearest even.
  uint32_t rebased = abs - ((127u - 15u) << 23);
  uint32_t q = rebased >> 13;
  uint32_t rem = rebased & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u)))
    ++q; // may carry into the exponent, which is the right rounding
  return static_cast<uint16_t>(sign | q);
}

void to_f32(dtype t, const std::byte* src, float* dst, size_t n) {
  switch (t) {
    case dtype::f32:
      std::memcpy(dst, src, n * 4);
      return;
    case dtype::bf16: {
      auto* s = reinterpret_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i)
        dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case dtype::f16: {
      auto* s = reinterpret_cast<const uint16_t*>(src);
      const auto& table = f16_table();
      for (size_t i = 0; i < n; ++i)
        dst[i] = table[s[i]];
      return;
    }
    case dtype::i32:
      throw std::invalid_argument("to_f32: I32 holds packed integers, not values to convert");
  }
}

void from_f32(dtype t, const float* src, std::byte* dst, size_t n) {
  switch (t) {
    case dtype::f32:
      std::memcpy(dst, src, n * 4);
      return;
    case dtype::bf16: {
      auto* d = reinterpret_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i)
        d[i] = f32_to_bf16(src[i]);
      return;
    }
    case dtype::f16: {
      auto* d = reinterpret_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i)
        d[i] = f32_to_f16(src[i]);
      return;
    }
    case dtype::i32:
      throw std::invalid_argument("from_f32: I32 holds packed integers, not values to convert");
  }
}

} // namespace metronome
