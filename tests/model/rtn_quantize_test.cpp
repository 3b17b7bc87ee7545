// Round-to-nearest int4 (model/rtn_quantize.hpp, docs/quantization.md "RTN"):
// the packed tensors read back through dequantize() as exactly the values the
// documented rule gives (a scalar re-implementation here), within half a
// scale of the float weights; `--quantize int4` at load binds them as a real
// AWQ checkpoint and gives the same logits, bit for bit, as the same model
// written by `make-model --quantize awq`; the refusals name what they refuse.

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

using test::contains;
using test::error_of;

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

// -- --quantize int4 at load ----------------------------------------------------------

/// Logits of `prompt` then each of `follow` fed one at a time (teacher
/// forcing: both models see the same tokens), step-major.
std::vector<std::vector<float>> logits_of(std::shared_ptr<const model_folder> m,
                                          const std::vector<int32_t>& prompt,
                                          const std::vector<int32_t>& follow) {
  cpu_engine engine(m, 8, 16);
  const std::vector<int32_t> pages = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<std::vector<float>> out;
  std::vector<float> logits(size_t(m->config.vocab_size));
  forward_input in{prompt, 0, pages};
  engine.forward(std::span(&in, 1), logits);
  out.push_back(logits);
  int32_t pos = int32_t(prompt.size());
  for (const int32_t& t : follow) {
    forward_input step{std::span(&t, 1), pos++, pages};
    engine.forward(std::span(&step, 1), logits);
    out.push_back(logits);
  }
  return out;
}

int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

TEST(quantize_at_load, binds_every_projection_as_an_awq_checkpoint_and_keeps_the_rest) {
  const auto dir = test::tiny_model("tiny-llama3-g128");
  auto plain = model_folder::open(dir);
  auto q = model_folder::open(dir, {weight_quantization::int4});
  ASSERT_TRUE(q->config.quantization);
  EXPECT_EQ(q->config.quantization->describe(), "awq, 4 bits, group 128");
  EXPECT_EQ(q->config.quantization->describe(), rtn_int4_config().describe());
  EXPECT_TRUE(q->weights.quantized);
  EXPECT_TRUE(q->quantized_at_load);
  EXPECT_FALSE(plain->quantized_at_load);
  EXPECT_EQ(q->owned_projections.size(), size_t(7 * q->config.num_layers));
  for (size_t l = 0; l < q->weights.layers.size(); ++l) {
    const auto& layer = q->weights.layers[l];
    for (int p = 0; p < num_projections; ++p) {
      const auto& ql = layer.quantized[size_t(p)];
      ASSERT_TRUE(ql.present()) << l << " " << p;
      EXPECT_EQ(layer.weight(projection(p)), nullptr);
      const tensor_view* w = plain->weights.layers[l].weight(projection(p));
      EXPECT_EQ(ql.out_features, w->shape[0]);
      EXPECT_EQ(ql.in_features, w->shape[1]);
      EXPECT_EQ(ql.qweight->name, w->name.substr(0, w->name.size() - 6) + "qweight");
      EXPECT_EQ(ql.qweight->shape, expected_shapes(rtn_int4_config(), ql.in_features,
                                                   ql.out_features).qweight);
    }
    EXPECT_EQ(layer.attn_norm->name, plain->weights.layers[l].attn_norm->name);
    EXPECT_EQ(layer.attn_norm->data, q->store->find(layer.attn_norm->name)->data);
  }
  // Embeddings, final norm and the (tied) LM head: the float tensors as stored.
  for (const tensor_view* t : {q->weights.embed, q->weights.lm_head, q->weights.final_norm}) {
    EXPECT_EQ(t->type, dtype::bf16) << t->name;
    EXPECT_EQ(t->data, q->store->find(t->name)->data) << t->name;
  }
  EXPECT_EQ(q->weights.lm_head, q->weights.embed); // tied
  EXPECT_EQ(q->weights.type, dtype::bf16);
  EXPECT_EQ(plain->weights_description(), "bf16");
  EXPECT_EQ(q->weights_description(),
            "int4 (RTN at load: awq, 4 bits, group 128; bf16 embeddings, norms and LM head)");
}

TEST(quantize_at_load, logits_stay_close_to_the_float_models) {
  // The bound. make-model's weights are uniform in [-a, a]; RTN's error is
  // about uniform in +-s/2 with s = range / 15 ~ 2a / 15, so each
  // projection's output carries noise of (2a/15)/sqrt(12) / (a/sqrt(3)) =
  // 6.7% of its own size (checked first, on random inputs, below 8%). The
  // logits sit behind two layers of seven projections whose errors add in
  // quadrature, sqrt(14) * 6.7% = 25%: their relative L2 error must stay
  // under twice that, 0.5, where unrelated logits are ~1.4 apart.
  const auto dir = test::tiny_model("tiny-llama3-g128");
  auto plain = model_folder::open(dir);
  auto q = model_folder::open(dir, {weight_quantization::int4});
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (size_t l = 0; l < q->weights.layers.size(); ++l)
    for (int p = 0; p < num_projections; ++p) {
      const auto& ql = q->weights.layers[l].quantized[size_t(p)];
      const tensor_view* w = plain->weights.layers[l].weight(projection(p));
      std::vector<float> f(size_t(w->numel())), d(f.size()), x(size_t(ql.in_features));
      to_f32(w->type, w->data, f.data(), f.size());
      dequantize(*q->config.quantization, ql, d.data());
      for (auto& v : x)
        v = normal(rng);
      double num = 0, den = 0;
      for (int64_t o = 0; o < ql.out_features; ++o) {
        double yf = 0, yd = 0;
        for (int64_t i = 0; i < ql.in_features; ++i) {
          yf += double(f[size_t(o * ql.in_features + i)]) * x[size_t(i)];
          yd += double(d[size_t(o * ql.in_features + i)]) * x[size_t(i)];
        }
        num += (yf - yd) * (yf - yd);
        den += yf * yf;
      }
      EXPECT_LT(std::sqrt(num / den), 0.08) << w->name;
      EXPECT_GT(std::sqrt(num / den), 0.04) << w->name; // the estimate is not vacuous
    }
  const std::vector<int32_t> prompt = {128000, 791, 4062, 14198, 39935, 35308, 927, 279, 16053,
                                       5679, 13};
  // The float model's own greedy continuation, fed to both.
  std::vector<int32_t> follow, seq = prompt;
  for (int s = 0; s < 8; ++s) {
    seq.push_back(argmax(logits_of(plain, seq, {}).back()));
    follow.push_back(seq.back());
  }
  const auto a = logits_of(plain, prompt, follow);
  const auto b = logits_of(q, prompt, follow);
  double worst = 0;
  int agree = 0;
  for (size_t s = 0; s < a.size(); ++s) {
    double num = 0, den = 0;
    for (size_t v = 0; v < a[s].size(); ++v) {
      num += (double(a[s][v]) - b[s][v]) * (double(a[s][v]) - b[s][v]);
      den += double(a[s][v]) * a[s][v];
    }
    worst = std::max(worst, std::sqrt(num / den));
    agree += argmax(a[s]) == argmax(b[s]);
  }
  std::printf("relative logit error (worst of %zu steps): %.4f; top-1 agreement %d/%zu\n",
              a.size(), worst, agree, a.size());
  EXPECT_LT(worst, 0.5);
  EXPECT_GT(worst, 0.0); // the weights did change
}

TEST(quantize_at_load, equals_the_same_model_written_by_make_model_in_either_layout) {
  // make-model --quantize awq|gptq draws the same bf16 weights and quantizes
  // them by the same rule as opening the float folder with int4 in that
  // layout (model_load_options::int4_layout): same integers, same scales,
  // same logits, bit for bit.
  const auto float_dir = test::tiny_model("tiny-llama3-g128");
  for (auto layout : {quant_method::awq, quant_method::gptq}) {
    SCOPED_TRACE(std::string(quant_method_name(layout)));
    make_model_options o;
    o.config = *preset_config("tiny-llama3-g128");
    o.seed = 7; // tiny_model's
    o.quantize = rtn_config(layout, 128);
    o.out_dir = test::scratch_dir("rtn-" + std::string(quant_method_name(layout)) + "-"
                                  + std::to_string(::getpid()));
    make_model(o);
    auto loaded = model_folder::open(o.out_dir);
    auto at_load = model_folder::open(float_dir, {weight_quantization::int4, layout});
    ASSERT_TRUE(loaded->config.quantization);
    EXPECT_FALSE(loaded->quantized_at_load);
    EXPECT_EQ(at_load->config.quantization->method, layout);
    EXPECT_EQ(loaded->config.quantization->describe(), at_load->config.quantization->describe());
    auto bytes = [](const tensor_view* t) {
      return t ? std::string(reinterpret_cast<const char*>(t->data), t->nbytes) : std::string();
    };
    for (size_t l = 0; l < loaded->weights.layers.size(); ++l)
      for (int p = 0; p < num_projections; ++p) {
        const auto& a = loaded->weights.layers[l].quantized[size_t(p)];
        const auto& b = at_load->weights.layers[l].quantized[size_t(p)];
        ASSERT_TRUE(a.present() && b.present());
        EXPECT_EQ(bytes(a.qweight), bytes(b.qweight)) << a.qweight->name;
        EXPECT_EQ(bytes(a.qzeros), bytes(b.qzeros)) << a.qzeros->name;
        EXPECT_EQ(bytes(a.scales), bytes(b.scales)) << a.scales->name;
        EXPECT_EQ(bytes(a.g_idx), bytes(b.g_idx)) << a.qweight->name;
        EXPECT_EQ(a.qweight->name, b.qweight->name);
      }
    const std::vector<int32_t> prompt = {128000, 9906, 11, 1917, 0, 578, 374};
    const std::vector<int32_t> follow = {264, 1296, 315, 279};
    EXPECT_EQ(logits_of(loaded, prompt, follow), logits_of(at_load, prompt, follow));
    if (layout == quant_method::awq) {
      EXPECT_EQ(loaded->weights_description(),
                "int4 (awq, 4 bits, group 128; bf16 embeddings, norms and LM head)");
    }
    EXPECT_EQ(at_load->weights_description(),
              "int4 (RTN at load: " + loaded->config.quantization->describe()
                + "; bf16 embeddings, norms and LM head)");
    fs::remove_all(o.out_dir);
  }
}

// -- refusals -------------------------------------------------------------------------

TEST(quantize_at_load, refuses_a_quantized_checkpoint) {
  make_model_options o;
  o.config = *preset_config("tiny-llama3-g128");
  o.quantize = rtn_config(quant_method::gptq, 128);
  o.out_dir = test::scratch_dir("rtn-requantize-" + std::to_string(::getpid()));
  make_model(o);
  const auto e = error_of([&] { model_folder::open(o.out_dir, {weight_quantization::int4}); });
  EXPECT_TRUE(contains(e, "config.json: quantization_config: --quantize int4 (model.quantize) "
                          "needs a float checkpoint, but this one is already quantized (gptq, 4 "
                          "bits, group 128, sym)"))
    << e;
  fs::remove_all(o.out_dir);
}

TEST(quantize_at_load, refuses_projections_the_group_cannot_divide_naming_the_tensor) {
  // tiny-llama3: hidden 64, so q_proj's 64 inputs are not a multiple of 128.
  auto e = error_of([&] {
    model_folder::open(test::tiny_model("tiny-llama3"), {weight_quantization::int4});
  });
  EXPECT_TRUE(contains(e, "model.layers.0.self_attn.q_proj.weight: --quantize int4 needs "
                          "in_features that are a multiple of the group size 128, but this "
                          "projection has 64 (out 64 x in 64)"))
    << e;
  // Outputs not a multiple of 8: one head of 36 (q_proj [36, 128]).
  make_model_options o;
  o.config = *preset_config("tiny-llama3-g128");
  o.config.num_heads = 1;
  o.config.num_kv_heads = 1;
  o.config.head_dim = 36;
  o.config.intermediate_size = 128;
  o.out_dir = test::scratch_dir("rtn-odd-" + std::to_string(::getpid()));
  make_model(o);
  e = error_of([&] { model_folder::open(o.out_dir, {weight_quantization::int4}); });
  EXPECT_TRUE(contains(e, "model.layers.0.self_attn.q_proj.weight: --quantize int4 needs "
                          "out_features that are a multiple of 8, but this projection has 36"))
    << e;
  fs::remove_all(o.out_dir);
}

// -- the CLI --------------------------------------------------------------------------

TEST(quantize_cli, make_model_int4_then_generate_and_quantize_at_load_agree) {
  const std::string bin = test::shell_quote(test::env("BIN"));
  const auto root = test::scratch_dir("rtn-cli-" + std::to_string(::getpid()));
  const auto flt = root / "float", awq = root / "awq", gptq = root / "gptq";
  auto made = test::run_command(bin + " make-model --preset tiny-llama3-g128 --seed 5 --out "
                                + test::shell_quote(flt.string()));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  made = test::run_command(bin + " make-model --preset tiny-llama3-g128 --seed 5 --quantize awq "
                           "--out " + test::shell_quote(awq.string()));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  EXPECT_TRUE(contains(made.output, "int4 awq, 4 bits, group 128")) << made.output;
  made = test::run_command(bin + " make-model --preset tiny-llama3 --seed 5 --quantize gptq "
                           "--group-size 32 --out " + test::shell_quote(gptq.string()));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto cfg = json::parse(std::ifstream(awq / "config.json"));
  EXPECT_EQ(cfg["quantization_config"]["quant_method"], "awq");
  EXPECT_EQ(cfg["quantization_config"]["group_size"], 128);
  EXPECT_EQ(cfg["quantization_config"]["version"], "gemm");
  cfg = json::parse(std::ifstream(gptq / "config.json"));
  EXPECT_EQ(cfg["quantization_config"]["quant_method"], "gptq");
  EXPECT_EQ(cfg["quantization_config"]["sym"], true);
  auto card = json::parse(std::ifstream(awq / "metronome.json"));
  EXPECT_TRUE(contains(card["description"].get<std::string>(), "int4 by round to nearest"))
    << card;

  auto generate = [&](const fs::path& dir, const std::string& extra) {
    auto r = test::run_command(bin + " generate --model " + test::shell_quote(dir.string())
                               + " --prompt-ids 128000,791,4062 -n 12 --temperature 0 "
                                 "--ignore-eos --json" + extra);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.exit_code == 0 ? json::parse(r.output) : json::object();
  };
  const auto from_awq = generate(awq, "");
  const auto at_load = generate(flt, " --quantize int4");
  const auto plain = generate(flt, "");
  const auto from_gptq = generate(gptq, "");
  EXPECT_EQ(from_awq["ids"].size(), 12u);
  EXPECT_EQ(from_awq["ids"], at_load["ids"]);
  EXPECT_EQ(from_gptq["ids"].size(), 12u);
  EXPECT_EQ(at_load["weights"],
            "int4 (RTN at load: awq, 4 bits, group 128; bf16 embeddings, norms and LM head)");
  EXPECT_EQ(from_awq["weights"], "int4 (awq, 4 bits, group 128; bf16 embeddings, norms and LM head)");
  EXPECT_EQ(plain["weights"], "bf16");

  // Refusals: a bad value, an already quantized folder, a bad shape.
  auto r = test::run_command(bin + " generate --model " + test::shell_quote(flt.string())
                             + " --prompt-ids 1 --quantize int8");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--quantize: expected none or int4, got 'int8'")) << r.output;
  r = test::run_command(bin + " generate --model " + test::shell_quote(awq.string())
                        + " --prompt-ids 1 --quantize int4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "already quantized (awq, 4 bits, group 128)")) << r.output;
  r = test::run_command(bin + " make-model --preset tiny-llama3 --quantize awq --out "
                        + test::shell_quote((root / "bad").string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "q_proj.weight: int4 quantization with group size 128 needs "
                                 "in_features that are a multiple of it"))
    << r.output;
  r = test::run_command(bin + " make-model --preset tiny-llama3 --quantize int4 --out "
                        + test::shell_quote((root / "bad2").string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--quantize: expected awq or gptq, got 'int4'")) << r.output;
  fs::remove_all(root);
}

} // namespace
} // namespace metronome
