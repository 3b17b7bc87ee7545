// Bit-level conversions between float and the 16-bit model types.

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "model/dtype.hpp"

namespace metronome {
namespace {

TEST(dtype, every_half_survives_a_round_trip_through_float) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), h) << "half bits " << h;
  }
}

TEST(dtype, every_bfloat16_survives_a_round_trip_through_float) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    if (std::isnan(f))
      continue;
    EXPECT_EQ(f32_to_bf16(f), h) << "bfloat16 bits " << h;
  }
}

TEST(dtype, half_decodes_known_values) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);               // largest normal
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
}

TEST(dtype, float_to_half_rounds_to_nearest_even_and_overflows_to_infinity) {
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even 1.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3 * 2^-11 lies halfway between 1 + 2^-10 and 1 + 2^-9: even is the latter.
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(-1e9f), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);       // tie to even zero
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);       // above the tie
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14) * (1 - std::ldexp(1.0f, -12))), 0x0400); // rounds up into normals
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14) * 0.999f), 0x03ff); // 1022.98 subnormal units
}

TEST(dtype, float_to_bfloat16_rounds_to_nearest_even) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808000)), 0x3f80); // tie, even stays
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f818000)), 0x3f82); // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808001)), 0x3f81); // above the tie
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(dtype, names_parse_both_ways) {
  for (auto t : {dtype::f32, dtype::f16, dtype::bf16}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
    EXPECT_EQ(parse_torch_dtype(torch_dtype_name(t)), t);
  }
  EXPECT_FALSE(parse_dtype("F64"));
  EXPECT_FALSE(parse_dtype("I8"));
  EXPECT_FALSE(parse_torch_dtype("int8"));
}

} // namespace
} // namespace metronome
