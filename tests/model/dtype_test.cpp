// Bit-level conversions between float and the 16-bit model types.

#include <cmath>
#include <algorithm>
#include <fstream>
#include <random>
#include <limits>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/cpu_ops.hpp"
#include "model/dtype.hpp"
#include "tests/test_env.hpp"

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

// The KV cache's element type: the engine and the runners hold the enum, the
// configuration and the command lines its names.
TEST(dtype, kv_cache_dtype_names_parse_both_ways) {
  for (auto t : {kv_cache_dtype_kind::bf16, kv_cache_dtype_kind::fp8,
                 kv_cache_dtype_kind::fp8_e5m2})
    EXPECT_EQ(parse_kv_cache_dtype(to_string(t)), t);
  EXPECT_EQ(to_string(kv_cache_dtype_kind::fp8), "fp8");
  EXPECT_EQ(to_string(kv_cache_dtype_kind::fp8_e5m2), "fp8_e5m2");
  EXPECT_FALSE(parse_kv_cache_dtype("fp4"));
  EXPECT_FALSE(parse_kv_cache_dtype("e5m2"));
  EXPECT_FALSE(parse_kv_cache_dtype("fp8-e5m2"));
  EXPECT_FALSE(parse_kv_cache_dtype("BF16"));
}

// FP8 E4M3 against torch's float8_e4m3fn (tools/golden/e4m3_reference.py,
// run on the GPU machine): every code's value, and the code of each input
// (values, midpoints between codes and a float ulp either side, the
// subnormal range, past 448, random floats).
TEST(dtype, e4m3_matches_torch) {
  const auto path = test::env("SOURCE_DIR") + "/tools/golden/e4m3.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing " << path;
  const auto ref = nlohmann::json::parse(in);
  ASSERT_EQ(ref.at("decode").size(), 256u);
  for (uint32_t c = 0; c < 256; ++c) {
    const auto& want = ref["decode"][c];
    const float got = e4m3_to_f32(uint8_t(c));
    if (want.is_null())
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
    else
      EXPECT_EQ(f32_to_bits(got), want.get<uint32_t>()) << "code " << c;
  }
  const auto& enc = ref.at("encode");
  ASSERT_GT(enc.size(), 1000u);
  for (const auto& row : enc) {
    const float x = bits_to_f32(row[0].get<uint32_t>());
    ASSERT_EQ(int(f32_to_e4m3(x)), row[1].get<int>()) << "input " << x;
  }
}

// The fp8 KV cache's row rounding: the row's largest |value| survives (it is
// 448 times the scale), every value moves by at most half a step of 3
// mantissa bits (or of the subnormal range), a zero row stays zero.
TEST(dtype, rows_round_to_e4m3_with_a_scale_each) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 2.0f);
  const int64_t rows = 50, n = 64;
  std::vector<float> x(size_t(rows * n));
  for (auto& v : x)
    v = d(rng) * (rng() % 4 == 0 ? 30.0f : 1.0f);
  std::fill_n(x.begin(), n, 0.0f); // row 0: zeros
  auto y = x;
  ref::round_rows_to_e4m3(y.data(), rows, n);
  int changed = 0;
  for (int64_t r = 0; r < rows; ++r) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i)
      amax = std::max(amax, std::fabs(x[size_t(r * n + i)]));
    const float scale = amax / 448.0f;
    for (int64_t i = 0; i < n; ++i) {
      const float a = x[size_t(r * n + i)], b = y[size_t(r * n + i)];
      EXPECT_LE(std::fabs(a - b), std::max(std::fabs(a) / 16.0f, scale * std::ldexp(1.0f, -10)) * 1.0001f)
        << "row " << r << " value " << a << " became " << b;
      changed += a != b;
      if (std::fabs(a) == amax) {
        EXPECT_NEAR(b, a, std::fabs(a) * 1e-6f);
      }
    }
  }
  EXPECT_GT(changed, rows * n / 2);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(y[size_t(i)], 0.0f);
}

TEST(dtype, every_finite_e4m3_survives_a_round_trip_through_float) {
  int finite = 0;
  for (uint32_t c = 0; c < 256; ++c) {
    const float f = e4m3_to_f32(uint8_t(c));
    if (std::isnan(f)) {
      EXPECT_TRUE(c == 0x7f || c == 0xff) << c;
      EXPECT_EQ(f32_to_e4m3(f), 0x7f);
      continue;
    }
    ++finite;
    EXPECT_EQ(f32_to_e4m3(f), c) << "code " << c << " value " << f;
  }
  EXPECT_EQ(finite, 254);
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f32_to_e4m3(1e6f), 0x7e);  // saturates
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
}

} // namespace
} // namespace metronome
