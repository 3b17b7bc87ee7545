// Round-to-nearest int4 (model/rtn_quantize.hpp): the packed tensors read
// back through dequantize() as exactly the values the documented rule gives
// (a scalar re-implementation here), within half a scale of the float
// weights; make-model --quantize writes them as checkpoints the loader
// takes; the refusals name what they refuse.

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/cpu_engine.hpp"
#include "model/model_error.hpp"
#include "model/model_weights.hpp"
#include "model/quantized_linear.hpp"
#include "model/rtn_quantize.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const model_error& e) {
    return e.what();
  }
  return "<no model_error>";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// Random weights [out][in] whose groups of `group` input rows have varied
/// ranges: mostly centred, some all positive, all negative, all zero, one
/// tiny, one with a single nonzero value.
std::vector<float> random_weights(int64_t out, int64_t in, int64_t group, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> w(size_t(out * in));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t g = 0; g < in / group; ++g) {
      const int kind = int((o * 7 + g * 3) % 9);
      const float scale = kind == 6 ? 1e-6f : 0.05f * float(1 + (o + g) % 5);
      for (int64_t i = g * group; i < (g + 1) * group; ++i) {
        float v = scale * u(rng);
        if (kind == 3)
          v = std::fabs(v) + 0.01f;  // all positive: the range is [0, max]
        else if (kind == 4)
          v = -std::fabs(v) - 0.01f; // all negative
        else if (kind == 5)
          v = 0.0f;                  // all zero: scale 1
        else if (kind == 7)
          v = i == g * group + 5 ? 0.3f : 0.0f;
        w[size_t(o * in + i)] = v;
      }
    }
  return w;
}

/// The documented rule (docs/quantization.md, "RTN"), written out per
/// element: the fp32 value scale * (q - zero) of w[o][i].
std::vector<float> rule(const quantization_config& cfg, const std::vector<float>& w,
                        int64_t out, int64_t in) {
  const int64_t gs = cfg.group_size < 0 ? in : cfg.group_size;
  std::vector<float> r(w.size());
  for (int64_t o = 0; o < out; ++o)
    for (int64_t g0 = 0; g0 < in; g0 += gs) {
      float lo = 0, hi = 0;
      for (int64_t i = g0; i < g0 + gs; ++i) {
        lo = std::min(lo, w[size_t(o * in + i)]);
        hi = std::max(hi, w[size_t(o * in + i)]);
      }
      const bool gptq = cfg.method == quant_method::gptq;
      const float amax = std::max(-lo, hi);
      float s = f16_to_f32(f32_to_f16(gptq ? 2.0f * amax / 15.0f : (hi - lo) / 15.0f));
      if (s == 0.0f)
        s = 1.0f;
      int zero = 8;
      if (!gptq)
        zero = int(std::min(15.0f, std::max(0.0f, std::nearbyint(-lo / s))));
      for (int64_t i = g0; i < g0 + gs; ++i) {
        const float q = std::min(15.0f, std::max(0.0f, std::nearbyint(w[size_t(o * in + i)] / s)
                                                          + float(zero)));
        r[size_t(o * in + i)] = s * (q - float(zero));
      }
    }
  return r;
}

std::vector<float> dequantized(const quantization_config& cfg, const packed_linear& p) {
  std::vector<float> w(size_t(p.linear.in_features * p.linear.out_features));
  dequantize(cfg, p.linear, w.data());
  return w;
}

/// The scale of w[o][i]'s group, as stored.
float stored_scale(const quantization_config& cfg, const packed_linear& p, int64_t o, int64_t i) {
  const int64_t g = cfg.group_size < 0 ? 0 : i / cfg.group_size;
  return f16_to_f32(p.scales[size_t(g * p.linear.out_features + o)]);
}

const std::vector<quantization_config> layouts = {
  rtn_config(quant_method::awq, 128),  rtn_config(quant_method::gptq, 128),
  rtn_config(quant_method::awq, 32),   rtn_config(quant_method::gptq, 64),
  rtn_config(quant_method::awq, -1),   rtn_config(quant_method::gptq, -1)};

TEST(rtn, dequantize_of_the_packed_tensors_is_the_rule_bit_for_bit) {
  const int64_t out = 48, in = 256;
  for (const auto& cfg : layouts) {
    const auto w = random_weights(out, in, cfg.group_size < 0 ? in : cfg.group_size, 1);
    auto p = rtn_quantize(cfg, w.data(), out, in, "t.weight", "t.", "x.safetensors");
    const auto got = dequantized(cfg, *p);
    const auto want = rule(cfg, w, out, in);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << cfg.describe();
    // The tensors a checkpoint of the layout stores, under its names.
    const auto shapes = expected_shapes(cfg, in, out);
    EXPECT_EQ(p->qweight_view.shape, shapes.qweight);
    EXPECT_EQ(p->qzeros_view.shape, shapes.qzeros);
    EXPECT_EQ(p->scales_view.shape, shapes.scales);
    EXPECT_EQ(p->qweight_view.name, "t.qweight");
    EXPECT_EQ(p->scales_view.type, dtype::f16);
    if (cfg.method == quant_method::gptq) {
      // sym: every zero 8, stored as 7; g_idx is each row's own group.
      for (int32_t z : p->qzeros)
        EXPECT_EQ(uint32_t(z), 0x77777777u);
      ASSERT_NE(p->linear.g_idx, nullptr);
      EXPECT_EQ(p->g_idx_view.shape, shapes.g_idx);
      for (int64_t i = 0; i < in; ++i)
        EXPECT_EQ(p->g_idx[size_t(i)], cfg.group_size < 0 ? 0 : i / cfg.group_size);
      EXPECT_NO_THROW(check_group_index(cfg, p->linear));
    } else {
      EXPECT_EQ(p->linear.g_idx, nullptr);
    }
  }
}

TEST(rtn, awq_packs_columns_in_its_interleaved_order) {
  // Every column's one group spans [0, 15]: scale 1, zero 0, q = w. Row 0
  // holds c + 1 in column c, row 1 holds 15.
  const int64_t out = 8, in = 32;
  std::vector<float> w(size_t(out * in), 0.0f);
  for (int64_t c = 0; c < out; ++c) {
    w[size_t(c * in + 0)] = float(c + 1);
    w[size_t(c * in + 1)] = 15.0f;
  }
  auto p = rtn_quantize(rtn_config(quant_method::awq, 32), w.data(), out, in, "t", "t.", "x");
  // Columns 0..7 holding 1..8 pack to 0x86427531 (docs/quantization.md).
  EXPECT_EQ(uint32_t(p->qweight[0]), 0x86427531u);
  EXPECT_EQ(uint32_t(p->qweight[1]), 0xFFFFFFFFu);
  EXPECT_EQ(uint32_t(p->qzeros[0]), 0u);
  for (int64_t c = 0; c < out; ++c)
    EXPECT_EQ(p->scales[size_t(c)], f32_to_f16(1.0f));
}

TEST(rtn, error_is_within_half_a_scale) {
  // |w - w'| <= scale / 2, plus what the fp16 rounding of the scale can add
  // at the clamped ends of a group: 15 half-ulps of the scale, at most
  // 16 * 2^-11 of a normal scale or 16 * 2^-25 for a subnormal one (the
  // group of range 1e-6 here).
  const int64_t out = 64, in = 512;
  for (const auto& cfg : layouts) {
    const auto w = random_weights(out, in, 128, 2);
    auto p = rtn_quantize(cfg, w.data(), out, in, "t.weight", "t.", "x");
    const auto d = dequantized(cfg, *p);
    double worst = 0;
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        const float s = stored_scale(cfg, *p, o, i);
        const double err = std::fabs(double(w[size_t(o * in + i)]) - d[size_t(o * in + i)]);
        worst = std::max(worst, err / s);
        ASSERT_LE(err, s * (0.5 + 16.0 / 2048.0) + 16.0 * 0x1p-25)
          << cfg.describe() << " [" << o << ", " << i << "] w " << w[size_t(o * in + i)];
      }
    EXPECT_GT(worst, 0.45) << cfg.describe(); // the bound is reached, not vacuous
  }
}

TEST(rtn, a_bf16_view_quantizes_as_its_fp32_values) {
  const int64_t out = 16, in = 128;
  auto w = random_weights(out, in, 128, 3);
  std::vector<uint16_t> bf(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    bf[i] = f32_to_bf16(w[i]);
    w[i] = bf16_to_f32(bf[i]);
  }
  tensor_view v;
  v.name = "m.weight";
  v.type = dtype::bf16;
  v.shape = {out, in};
  v.data = reinterpret_cast<const std::byte*>(bf.data());
  v.nbytes = bf.size() * 2;
  const auto cfg = rtn_int4_config();
  auto a = rtn_quantize(cfg, v, "m.", "x");
  auto b = rtn_quantize(cfg, w.data(), out, in, "m.weight", "m.", "x");
  EXPECT_EQ(a->qweight, b->qweight);
  EXPECT_EQ(a->qzeros, b->qzeros);
  EXPECT_EQ(a->scales, b->scales);
  EXPECT_EQ(cfg.method, quant_method::awq);
  EXPECT_EQ(cfg.group_size, 128);
}

TEST(rtn, refuses_shapes_the_layouts_cannot_hold_and_values_that_are_not_finite) {
  std::vector<float> w(size_t(16 * 128), 0.5f);
  auto e = error_of([&] {
    rtn_quantize(rtn_int4_config(), w.data(), 12, 128, "a.weight", "a.", "f.safetensors");
  });
  EXPECT_TRUE(contains(e, "f.safetensors: a.weight: int4 quantization needs out_features that "
                          "are a multiple of 8"))
    << e;
  e = error_of([&] {
    rtn_quantize(rtn_int4_config(), w.data(), 16, 96, "a.weight", "a.", "f.safetensors");
  });
  EXPECT_TRUE(contains(e, "a.weight: int4 quantization with group size 128 needs in_features "
                          "that are a multiple of it (this projection: out 16 x in 96)"))
    << e;
  w[size_t(3 * 128 + 9)] = std::nanf("");
  e = error_of([&] {
    rtn_quantize(rtn_int4_config(), w.data(), 16, 128, "a.weight", "a.", "f.safetensors");
  });
  EXPECT_TRUE(contains(e, "a.weight: weight [3, 9] is not finite")) << e;
}

TEST(rtn, quantization_config_round_trips_through_config_json) {
  for (const auto& cfg : layouts) {
    const auto back = quantization_config::from_json(cfg.to_json(), "config.json");
    EXPECT_EQ(back.method, cfg.method);
    EXPECT_EQ(back.group_size, cfg.group_size);
    EXPECT_EQ(back.sym, cfg.sym);
    EXPECT_EQ(back.desc_act, cfg.desc_act);
    EXPECT_EQ(back.describe(), cfg.describe());
  }
}

// -- make-model --quantize ----------------------------------------------------------

TEST(make_model_int4, gptq_folders_load_and_hold_the_symmetric_rule) {
  make_model_options o;
  o.config = *preset_config("tiny-llama3");
  o.seed = 3;
  o.quantize = rtn_config(quant_method::gptq, 64);
  o.out_dir = test::scratch_dir("rtn-gptq-" + std::to_string(::getpid()));
  make_model(o);
  auto m = model_folder::open(o.out_dir);
  ASSERT_TRUE(m->config.quantization);
  EXPECT_EQ(m->config.quantization->describe(), "gptq, 4 bits, group 64, sym");
  auto plain = model_folder::open(test::tiny_model("tiny-llama3", 3));
  // Every projection dequantizes to the rule applied to the float folder's
  // bf16 values.
  for (size_t l = 0; l < m->weights.layers.size(); ++l)
    for (int p = 0; p < num_projections; ++p) {
      const auto& ql = m->weights.layers[l].quantized[size_t(p)];
      ASSERT_TRUE(ql.present());
      ASSERT_NE(ql.g_idx, nullptr);
      const tensor_view* w = plain->weights.layers[l].weight(projection(p));
      std::vector<float> f(size_t(w->numel())), d(f.size());
      to_f32(w->type, w->data, f.data(), f.size());
      dequantize(*m->config.quantization, ql, d.data());
      EXPECT_EQ(d, rule(*m->config.quantization, f, w->shape[0], w->shape[1])) << w->name;
    }
  // The float tensors stay in the folder's dtype.
  EXPECT_EQ(m->weights.embed->type, dtype::bf16);
  fs::remove_all(o.out_dir);
}

TEST(make_model_int4, refuses_shapes_the_group_cannot_divide_before_writing) {
  // tiny-llama3's 64 inputs per projection hold no group of 128.
  make_model_options bad;
  bad.config = *preset_config("tiny-llama3");
  bad.quantize = rtn_config(quant_method::awq, 128);
  bad.out_dir = test::scratch_dir("rtn-bad-" + std::to_string(::getpid())) / "out";
  const auto e = error_of([&] { make_model(bad); });
  EXPECT_TRUE(contains(e, "model.layers.0.self_attn.q_proj.weight: int4 quantization with "
                          "group size 128 needs in_features that are a multiple of it"))
    << e;
  EXPECT_FALSE(fs::exists(bad.out_dir));
  fs::remove_all(bad.out_dir.parent_path());
}

} // namespace
} // namespace metronome
