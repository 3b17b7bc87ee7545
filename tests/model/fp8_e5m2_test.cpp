// FP8 E5M2 and the fp8_e5m2 KV cache's CPU reference (issue 35): the
// conversions against values derived from the format's definition (every
// code, ties, saturation, NaN), the window scale rule, the counts of what
// could not be stored, and the engine's cache (one scale per window, set by
// the window's first row and the three windows before it; chunking, batching
// and pages change nothing; saturation and NaN counted per sequence).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/cpu_engine.hpp"
#include "model/cpu_ops.hpp"
#include "model/dtype.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();

/// The value of E5M2 code `c` from the format's definition (sign bit, 5
/// exponent bits with bias 15, 2 mantissa bits; exponent 0 subnormal,
/// exponent 31 infinity or NaN), computed in double with ldexp, apart from
/// dtype.hpp's bit manipulation.
double e5m2_by_definition(uint32_t c) {
  const double sign = (c & 0x80u) ? -1.0 : 1.0;
  const int e = int((c >> 2) & 31u), m = int(c & 3u);
  if (e == 31)
    return m == 0 ? sign * double(inf) : std::nan("");
  if (e == 0)
    return sign * std::ldexp(double(m), -16);            // m/4 * 2^-14
  return sign * std::ldexp(double(4 + m), e - 15 - 2);   // (1 + m/4) * 2^(e-15)
}

TEST(e5m2, every_code_decodes_to_its_definition) {
  int nans = 0, infinities = 0;
  for (uint32_t c = 0; c < 256; ++c) {
    const double want = e5m2_by_definition(c);
    const float got = e5m2_to_f32(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      ++nans;
      continue;
    }
    EXPECT_EQ(double(got), want) << "code " << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80u) != 0) << "code " << c;
    infinities += std::isinf(got);
    // E5M2 is the upper byte of an IEEE half: the half decoder agrees.
    EXPECT_EQ(f32_to_bits(got), f32_to_bits(f16_to_f32(uint16_t(c << 8)))) << "code " << c;
  }
  EXPECT_EQ(nans, 6);       // 0x7d-0x7f, 0xfd-0xff
  EXPECT_EQ(infinities, 2); // 0x7c, 0xfc
}

TEST(e5m2, known_codes_by_hand) {
  // code = sign | exponent (bias 15) << 2 | mantissa; e.g. 1.0 = 2^0:
  // exponent 15 = 01111, mantissa 00 -> 0 01111 00 = 0x3c.
  const struct {
    uint8_t code;
    float value;
  } known[] = {
    {0x00, 0.0f},          {0x01, 0x1p-16f},   {0x02, 0x1p-15f},  {0x03, 0x3p-16f},
    {0x04, 0x1p-14f},      {0x05, 0x1.4p-14f}, {0x38, 0.5f},      {0x3c, 1.0f},
    {0x3d, 1.25f},         {0x3e, 1.5f},       {0x3f, 1.75f},     {0x40, 2.0f},
    {0x42, 3.0f},          {0x47, 7.0f},       {0x5b, 224.0f},     {0x5f, 448.0f},    {0x7a, 49152.0f},
    {0x7b, 57344.0f},      {0xbc, -1.0f},      {0xc2, -3.0f},     {0xfb, -57344.0f},
    {0x81, -0x1p-16f},
  };
  for (const auto& k : known) {
    EXPECT_EQ(e5m2_to_f32(k.code), k.value) << int(k.code);
    EXPECT_EQ(int(f32_to_e5m2(k.value)), int(k.code)) << k.value;
  }
  EXPECT_EQ(e5m2_to_f32(0x7c), inf);
  EXPECT_EQ(e5m2_to_f32(0xfc), -inf);
  for (uint8_t c : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff})
    EXPECT_TRUE(std::isnan(e5m2_to_f32(c))) << int(c);
  EXPECT_EQ(int(f32_to_e5m2(-0.0f)), 0x80);
  EXPECT_TRUE(std::signbit(e5m2_to_f32(0x80)));
  EXPECT_EQ(e5m2_max, 57344.0f);
}

TEST(e5m2, every_finite_code_survives_a_round_trip_through_float) {
  int finite = 0;
  for (uint32_t c = 0; c < 256; ++c) {
    const float f = e5m2_to_f32(uint8_t(c));
    if (std::isnan(f)) {
      EXPECT_EQ(int(f32_to_e5m2(f)), 0x7f) << c;
    } else if (std::isinf(f)) {
      EXPECT_EQ(int(f32_to_e5m2(f)), (c & 0x80u) | 0x7b) << c; // saturates
    } else {
      ++finite;
      EXPECT_EQ(int(f32_to_e5m2(f)), int(c)) << "code " << c << " value " << f;
    }
  }
  EXPECT_EQ(finite, 248);
}

TEST(e5m2, rounds_to_nearest_with_ties_to_even) {
  // 1.125 lies halfway between 1 (0x3c, even) and 1.25 (0x3d): to 0x3c.
  EXPECT_EQ(f32_to_e5m2(1.125f), 0x3c);
  EXPECT_EQ(f32_to_e5m2(std::nextafter(1.125f, 2.0f)), 0x3d);
  EXPECT_EQ(f32_to_e5m2(std::nextafter(1.125f, 0.0f)), 0x3c);
  // 1.375 lies halfway between 1.25 (0x3d, odd) and 1.5 (0x3e): to 0x3e.
  EXPECT_EQ(f32_to_e5m2(1.375f), 0x3e);
  EXPECT_EQ(f32_to_e5m2(-1.375f), 0xbe);
  // 1.875, halfway between 1.75 (0x3f) and 2 (0x40): carries into the exponent.
  EXPECT_EQ(f32_to_e5m2(1.875f), 0x40);
  // 53248, halfway between 49152 (0x7a, even) and 57344 (0x7b): down.
  EXPECT_EQ(f32_to_e5m2(53248.0f), 0x7a);
  EXPECT_EQ(f32_to_e5m2(std::nextafter(53248.0f, inf)), 0x7b);
  // Subnormals, steps of 2^-16: 0.5 step -> 0, 1.5 -> 2, 2.5 -> 2, and
  // 3.5 -> 4, which is 0x04, the smallest normal.
  EXPECT_EQ(f32_to_e5m2(0x1p-17f), 0x00);
  EXPECT_EQ(f32_to_e5m2(std::nextafter(0x1p-17f, 1.0f)), 0x01);
  EXPECT_EQ(f32_to_e5m2(0x3p-17f), 0x02);
  EXPECT_EQ(f32_to_e5m2(0x5p-17f), 0x02);
  EXPECT_EQ(f32_to_e5m2(0x7p-17f), 0x04);
  EXPECT_EQ(f32_to_e5m2(-0x1p-18f), 0x80); // the sign of a zero is kept
  // Far below the subnormals and float's own subnormals.
  EXPECT_EQ(f32_to_e5m2(1e-40f), 0x00);
  // The largest normal below the smallest normal's tie: 2^-14 - 2^-17 is
  // 3.5 steps, up to 0x04.
  EXPECT_EQ(f32_to_e5m2(0x1p-14f - 0x1p-17f), 0x04);
}

TEST(e5m2, saturates_past_57344_and_maps_nan_to_0x7f) {
  EXPECT_EQ(f32_to_e5m2(57344.0f), 0x7b);
  EXPECT_EQ(f32_to_e5m2(57345.0f), 0x7b);
  EXPECT_EQ(f32_to_e5m2(61440.0f), 0x7b); // where IEEE rounding would reach infinity
  EXPECT_EQ(f32_to_e5m2(1e30f), 0x7b);
  EXPECT_EQ(f32_to_e5m2(-1e30f), 0xfb);
  EXPECT_EQ(f32_to_e5m2(inf), 0x7b);
  EXPECT_EQ(f32_to_e5m2(-inf), 0xfb);
  EXPECT_EQ(f32_to_e5m2(nan_f), 0x7f);
  EXPECT_EQ(f32_to_e5m2(-nan_f), 0x7f);
}

// A reference by search: the nearest of the 124 finite magnitudes (in
// double), ties to the even code, beyond 57344 the largest.
uint8_t e5m2_by_search(float x) {
  static const std::vector<double> mags = [] {
    std::vector<double> m;
    for (uint32_t c = 0; c <= 0x7b; ++c)
      m.push_back(e5m2_by_definition(c));
    return m;
  }();
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(double(x));
  if (a >= 57344.0)
    return sign | 0x7b;
  uint32_t best = 0;
  for (uint32_t c = 1; c < mags.size(); ++c) {
    const double d = std::fabs(a - mags[c]), db = std::fabs(a - mags[best]);
    if (d < db || (d == db && (c & 1u) == 0))
      best = c;
  }
  return uint8_t(sign | best);
}

TEST(e5m2, floats_round_to_the_nearest_code_as_a_search_finds_it) {
  std::vector<float> inputs;
  // Every code's value, the midpoint to the next and a float ulp either side.
  for (uint32_t c = 0; c < 0x7b; ++c) {
    const float lo = float(e5m2_by_definition(c)), hi = float(e5m2_by_definition(c + 1));
    const float mid = lo + (hi - lo) / 2; // exact: both fit float's 24 bits
    for (float v : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, inf)}) {
      inputs.push_back(v);
      inputs.push_back(-v);
    }
  }
  std::mt19937 rng(35);
  std::uniform_real_distribution<float> expo(-20.0f, 17.0f);
  for (int i = 0; i < 200000; ++i)
    inputs.push_back((rng() & 1u ? -1.0f : 1.0f) * std::exp2(expo(rng)));
  for (float x : inputs)
    ASSERT_EQ(int(f32_to_e5m2(x)), int(e5m2_by_search(x))) << "input " << x;
}

TEST(e5m2, window_scale_is_a_power_of_two_that_puts_the_reference_in_128_to_256) {
  // ceil(log2 r) - 8, by hand: 1 -> 0 - 8; 1.5 and 2 -> 1 - 8; 2.0001 -> 2 - 8.
  EXPECT_EQ(e5m2_window_scale(1.0f), 0x1p-8f);
  EXPECT_EQ(e5m2_window_scale(1.5f), 0x1p-7f);
  EXPECT_EQ(e5m2_window_scale(2.0f), 0x1p-7f);
  EXPECT_EQ(e5m2_window_scale(2.0001f), 0x1p-6f);
  EXPECT_EQ(e5m2_window_scale(256.0f), 1.0f);
  EXPECT_EQ(e5m2_window_scale(57344.0f), 0x1p8f); // log2 57344 = 15.8 -> 16
  EXPECT_EQ(e5m2_window_scale(0.01f), 0x1p-14f);  // log2 0.01 = -6.6 -> -6
  // No reference: the unscaled range. Not finite: the same.
  EXPECT_EQ(e5m2_window_scale(0.0f), 1.0f);
  EXPECT_EQ(e5m2_window_scale(-0.0f), 1.0f);
  EXPECT_EQ(e5m2_window_scale(inf), 1.0f);
  EXPECT_EQ(e5m2_window_scale(nan_f), 1.0f);
  // Clamped to 2^-100 .. 2^100 (also for float subnormals).
  EXPECT_EQ(e5m2_window_scale(0x1p-120f), 0x1p-100f);
  EXPECT_EQ(e5m2_window_scale(1e-45f), 0x1p-100f);
  EXPECT_EQ(e5m2_window_scale(3e38f), 0x1p100f);
  EXPECT_TRUE(std::isfinite(57344.0f * e5m2_window_scale(3e38f)));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> expo(-90.0f, 100.0f);
  for (int i = 0; i < 10000; ++i) {
    const float r = std::exp2(expo(rng));
    const float s = e5m2_window_scale(r);
    ASSERT_EQ(f32_to_bits(s) & 0x7fffffu, 0u) << r; // a power of two
    ASSERT_GT(r / s, 128.0f) << r;
    ASSERT_LE(r / s, 256.0f) << r;
  }
}

TEST(e5m2, rounding_counts_what_saturated_or_was_not_finite) {
  std::vector<float> x = {1.0f, -3.0f, 57344.0f, 57345.0f, -1e6f, inf, -inf, nan_f,
                          0x1p-17f, 0.3f};
  kv_overflow_count count;
  ref::round_to_e5m2(x.data(), int64_t(x.size()), 1.0f, count);
  const std::vector<float> want = {1.0f, -3.0f, 57344.0f, 57344.0f, -57344.0f, 57344.0f,
                                   -57344.0f, nan_f, 0.0f,
                                   0.3125f}; // 0.3 = 1.2 * 2^-2: nearest 1.25 * 2^-2
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(want[i]))
      EXPECT_TRUE(std::isnan(x[i])) << i;
    else
      EXPECT_EQ(x[i], want[i]) << i;
  }
  EXPECT_EQ(count.saturated, 2);  // 57345 and -1e6; 57344 itself fits
  EXPECT_EQ(count.non_finite, 3); // +-inf and NaN
  EXPECT_EQ(count.total(), 5);
  // With a scale of 2^-8 the range is 224: 300 saturates, 0.5 is exact,
  // -0.001 = -0.256 * 2^-8 rounds to -0.25 * 2^-8; the count accumulates.
  std::vector<float> y = {0.5f, 300.0f, -0.001f};
  ref::round_to_e5m2(y.data(), 3, 0x1p-8f, count);
  EXPECT_EQ(y[0], 0.5f);
  EXPECT_EQ(y[1], 224.0f);
  EXPECT_EQ(y[2], -0.25f * 0x1p-8f);
  EXPECT_EQ(count.saturated, 3);
  EXPECT_EQ(count.non_finite, 3);
}

// -- the CPU engine's fp8_e5m2 cache ---------------------------------------------------

class fp8_e5m2_engine_test : public ::testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    model_ = model_folder::open(test::tiny_model(GetParam()));
    vocab_ = model_->config.vocab_size;
  }

  std::vector<int32_t> random_tokens(size_t n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::vector<int32_t> out(n);
    for (auto& t : out)
      t = int32_t(rng() % uint32_t(vocab_));
    return out;
  }

  /// Logits of the last token after prefilling `tokens` in chunks of
  /// `chunk` into `pages` (of page_size) with the cache's element type
  /// `dtype`; the engine is kept in engine_ for inspection.
  std::vector<float> prefill(const std::vector<int32_t>& tokens, size_t chunk,
                             const std::vector<int32_t>& pages, int32_t page_size,
                             kv_cache_dtype_kind dtype, kv_overflow_count* count = nullptr) {
    engine_ = std::make_unique<cpu_engine>(model_, 160, page_size);
    engine_->set_kv_dtype(dtype);
    std::vector<float> logits(static_cast<size_t>(vocab_));
    for (size_t start = 0; start < tokens.size(); start += chunk) {
      auto part = std::span<const int32_t>(tokens).subspan(start, std::min(chunk, tokens.size() - start));
      forward_input in{part, int32_t(start), pages, count};
      engine_->forward(std::span(&in, 1), logits);
    }
    return logits;
  }

  static std::vector<int32_t> page_range(int32_t first, int32_t n) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    std::iota(p.begin(), p.end(), first);
    return p;
  }

  std::shared_ptr<const model_folder> model_;
  std::unique_ptr<cpu_engine> engine_;
  int32_t vocab_ = 0;
};

// 600 tokens cross two window boundaries (256, 512): whole, in chunks that
// start mid-window and mid-page, token by token over the boundaries, on
// shuffled pages and with another page size, the logits are the same.
TEST_P(fp8_e5m2_engine_test, chunking_and_pages_do_not_change_the_logits) {
  const auto e5m2 = kv_cache_dtype_kind::fp8_e5m2;
  const auto tokens = random_tokens(600, 21);
  const auto pages = page_range(0, 38);
  kv_overflow_count count;
  const auto whole = prefill(tokens, tokens.size(), pages, 16, e5m2, &count);
  EXPECT_EQ(count.total(), 0); // a model of ordinary activations
  EXPECT_EQ(prefill(tokens, 100, pages, 16, e5m2), whole);
  EXPECT_EQ(prefill(tokens, 7, pages, 16, e5m2), whole);
  auto shuffled = page_range(0, 38);
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(4));
  EXPECT_EQ(prefill(tokens, 61, shuffled, 16, e5m2), whole);
  EXPECT_EQ(prefill(tokens, 600, page_range(0, 75), 8, e5m2), whole);
  // Token by token from 250 on (both boundaries decoded one at a time).
  {
    engine_ = std::make_unique<cpu_engine>(model_, 160, 16);
    engine_->set_kv_dtype(e5m2);
    std::vector<float> logits(static_cast<size_t>(vocab_));
    forward_input in{std::span<const int32_t>(tokens).first(250), 0, pages};
    engine_->forward(std::span(&in, 1), logits);
    for (size_t t = 250; t < tokens.size(); ++t) {
      in = {std::span<const int32_t>(tokens).subspan(t, 1), int32_t(t), pages};
      engine_->forward(std::span(&in, 1), logits);
    }
    EXPECT_EQ(logits, whole);
  }
  // The rounding moves the logits, by about what 2 mantissa bits cost.
  const auto exact = prefill(tokens, tokens.size(), pages, 16, kv_cache_dtype_kind::bf16);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < exact.size(); ++i) {
    diff = std::max(diff, double(std::fabs(whole[i] - exact[i])));
    scale = std::max(scale, double(std::fabs(exact[i])));
  }
  EXPECT_GT(diff, 1e-4 * scale);
  EXPECT_LT(diff, 0.2 * scale);
}

// The rule itself, on layer 0, whose keys and values do not depend on the
// cache's rounding (they come before any attention): an fp32 engine gives
// the values before rounding. Each window of 256 positions has one scale
// per K/V and kv head, a power of two putting its reference (the window's
// first row and the 3 windows before it, as stored) in (128, 256]; every
// stored value is e5m2(value / scale) * scale.
TEST_P(fp8_e5m2_engine_test, each_window_has_one_scale_from_its_first_row_and_three_before) {
  const auto& cfg = model_->config;
  const int32_t ps = 16, d = cfg.head_dim;
  const auto tokens = random_tokens(1300, 22); // windows 0..5, the last partial
  const auto pages = page_range(0, 82);
  prefill(tokens, 300, pages, ps, kv_cache_dtype_kind::bf16);
  auto exact = std::move(engine_);
  prefill(tokens, 300, pages, ps, kv_cache_dtype_kind::fp8_e5m2);
  cpu_kv_cache& raw = exact->kv_cache();
  cpu_kv_cache& stored = engine_->kv_cache();
  auto at = [&](cpu_kv_cache& c, int which, int64_t p, int32_t h) {
    return c.slot(0, pages[size_t(p / ps)], which, int32_t(p % ps)) + int64_t(h) * d;
  };
  int windows_checked = 0, history_mattered = 0;
  for (int which = 0; which < 2; ++which)
    for (int32_t h = 0; h < cfg.num_kv_heads; ++h)
      for (int64_t first = 0; first < int64_t(tokens.size()); first += kv_e5m2_window) {
        float own = 0, reference = 0;
        for (int32_t i = 0; i < d; ++i)
          own = std::max(own, std::fabs(at(raw, which, first, h)[i]));
        reference = own;
        for (int64_t p = std::max<int64_t>(0, first - 3 * kv_e5m2_window); p < first; ++p)
          for (int32_t i = 0; i < d; ++i)
            reference = std::max(reference, std::fabs(at(stored, which, p, h)[i]));
        history_mattered += reference > own;
        const float s = engine_->kv_cache().row_scales(0, pages[size_t(first / ps)], which,
                                                       int32_t(first % ps))[h];
        ASSERT_EQ(f32_to_bits(s) & 0x7fffffu, 0u) << "not a power of two: " << s;
        EXPECT_GT(reference / s, 128.0f) << "window at " << first;
        EXPECT_LE(reference / s, 256.0f) << "window at " << first;
        const int64_t end = std::min<int64_t>(first + kv_e5m2_window, int64_t(tokens.size()));
        for (int64_t p = first; p < end; ++p) {
          ASSERT_EQ(stored.row_scales(0, pages[size_t(p / ps)], which, int32_t(p % ps))[h], s)
            << "position " << p;
          for (int32_t i = 0; i < d; ++i) {
            const float v = at(raw, which, p, h)[i];
            ASSERT_EQ(at(stored, which, p, h)[i], e5m2_to_f32(f32_to_e5m2(v / s)) * s)
              << "position " << p << " value " << v;
          }
        }
        ++windows_checked;
      }
  EXPECT_EQ(windows_checked, 2 * cfg.num_kv_heads * 6);
  EXPECT_GT(history_mattered, 0); // some window's scale came from before it
}

INSTANTIATE_TEST_SUITE_P(presets, fp8_e5m2_engine_test,
                         ::testing::Values("tiny-llama3", "tiny-qwen2", "tiny-mistral"),
                         [](const auto& info) {
                           auto s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// A model made to overflow: token 6's embedding is all along dimension 0,
// which the value row (head 0, dim 0) of layer 0 reads with a weight of
// 1e5; the other tokens used have nothing there, so a window begun by token
// 5 gets a scale for ordinary values and token 6's value lies far beyond
// its range.
// Token 7's embedding holds a NaN. Each sequence counts its own values;
// the other element types count nothing.
TEST(fp8_e5m2_engine, values_beyond_a_window_range_are_counted_per_sequence) {
  make_model_options o;
  o.config = *preset_config("tiny-llama3");
  o.seed = 11;
  o.weight_type = dtype::f32;
  o.out_dir = test::scratch_dir("e5m2-overflow");
  make_model(o);
  const auto file = o.out_dir / "model.safetensors";
  test::overwrite_f32_tensor(file, "model.embed_tokens.weight",
                             [](float* v, const std::vector<int64_t>& shape) {
                               const int64_t hidden = shape[1];
                               for (int64_t t : {5, 7, 9, 10, 11, 12})
                                 v[t * hidden] = 0.0f;
                               for (int64_t i = 0; i < hidden; ++i)
                                 v[6 * hidden + i] = i == 0 ? 1.0f : 0.0f;
                               v[7 * hidden + 3] = nan_f;
                             });
  test::overwrite_f32_tensor(file, "model.layers.0.self_attn.v_proj.weight",
                             [](float* v, const std::vector<int64_t>&) { v[0] = 1e5f; });
  auto model = model_folder::open(o.out_dir);
  const auto& cfg = model->config;
  const std::vector<std::vector<int32_t>> seqs = {{5, 6, 9, 10, 11}, {5, 9, 10, 11, 12},
                                                  {5, 9, 7, 10, 11}};
  const std::vector<std::vector<int32_t>> pages = {{0}, {1}, {2}};
  auto run = [&](kv_cache_dtype_kind dtype, std::vector<kv_overflow_count>& counts) {
    auto engine = std::make_unique<cpu_engine>(model, 4, 16);
    engine->set_kv_dtype(dtype);
    counts.assign(seqs.size(), {});
    std::vector<forward_input> batch;
    for (size_t i = 0; i < seqs.size(); ++i)
      batch.push_back({seqs[i], 0, pages[i], &counts[i]});
    std::vector<float> logits(seqs.size() * size_t(cfg.vocab_size));
    engine->forward(batch, logits);
    return engine;
  };
  std::vector<kv_overflow_count> counts;
  auto engine = run(kv_cache_dtype_kind::fp8_e5m2, counts);
  EXPECT_GT(counts[0].saturated, 0);
  EXPECT_EQ(counts[0].non_finite, 0);
  EXPECT_EQ(counts[1].total(), 0);
  EXPECT_EQ(counts[2].saturated, 0);
  // Token 7's keys and values in every layer at least (NaN spreads on).
  EXPECT_GE(counts[2].non_finite, int64_t(2) * cfg.kv_size() * cfg.num_layers);
  // Token 6's value (head 0, dim 0, layer 0) is stored as the largest the
  // window's scale allows.
  auto& kv = engine->kv_cache();
  const float s = kv.row_scales(0, 0, 1, 1)[0];
  EXPECT_EQ(s, kv.row_scales(0, 0, 1, 0)[0]); // the window's scale, set by token 5
  EXPECT_EQ(std::fabs(kv.slot(0, 0, 1, 1)[0]), e5m2_max * s);
  for (auto dtype : {kv_cache_dtype_kind::bf16, kv_cache_dtype_kind::fp8}) {
    run(dtype, counts);
    for (const auto& c : counts)
      EXPECT_EQ(c.total(), 0) << to_string(dtype);
  }
}

} // namespace
} // namespace metronome
