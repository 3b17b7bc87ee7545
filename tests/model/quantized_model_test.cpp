// 4-bit checkpoints (GPTQ v1, AWQ GEMM; docs/quantization.md) on the CPU
// engine, against goldens nobody here wrote: tools/golden/int4_goldens.tar.xz
// holds seven tiny Llama folders quantized by make_int4_goldens.py and, per
// variant, transformers' fp32 logits on the weights dequantized with the
// layouts' published formulas. The archive is unpacked once per test
// process into a scratch folder (tar and xz, as on every CI machine).
// Also: the loader's refusals, each naming the file and the field or tensor,
// and the CUDA runner's repacking of each layout (gpu/int4_layout), which
// needs no GPU.

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpu/cuda_runner.hpp"
#include "gpu/int4_layout.hpp"
#include "model/cpu_engine.hpp"
#include "model/model_error.hpp"
#include "model/model_weights.hpp"
#include "model/quantized_linear.hpp"
#include "tests/model/golden_support.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<std::string>& variants = test::int4_golden_variants();

fs::path goldens() {
  return test::int4_goldens();
}

/// A tensor_view over `bytes` of host memory at `data`.
tensor_view view(const char* name, dtype t, std::vector<int64_t> shape, const void* data,
                 size_t bytes) {
  tensor_view v;
  v.name = name;
  v.type = t;
  v.shape = std::move(shape);
  v.data = static_cast<const std::byte*>(data);
  v.nbytes = bytes;
  return v;
}

using test::contains;
using test::error_of;

// -- the goldens -------------------------------------------------------------------

class int4_golden : public ::testing::TestWithParam<std::string> {};

TEST_P(int4_golden, batched_prefill_and_greedy_decode_match_transformers) {
  const auto ref = test::load_golden(goldens() / (GetParam() + ".json"));
  auto model = model_folder::open(goldens() / GetParam());
  ASSERT_TRUE(model->weights.quantized);
  ASSERT_TRUE(model->config.quantization);
  test::expect_engine_matches_golden(model, ref, GetParam());
}

TEST_P(int4_golden, runner_generates_the_reference_greedy_ids) {
  const auto ref = test::load_golden(goldens() / (GetParam() + ".json"));
  test::expect_runner_greedy_ids(model_folder::open(goldens() / GetParam()), ref, GetParam());
}

INSTANTIATE_TEST_SUITE_P(variants, int4_golden, ::testing::ValuesIn(variants),
                         [](const auto& info) {
                           auto s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

TEST(int4, gptq_g64_asym_and_awq_g64_give_identical_weights_and_logits) {
  // The same integers, scales and zeros in the two layouts.
  auto gptq = model_folder::open(goldens() / "gptq-g64-asym");
  auto awq = model_folder::open(goldens() / "awq-g64");
  for (size_t l = 0; l < gptq->weights.layers.size(); ++l)
    for (int p = 0; p < num_projections; ++p) {
      const auto& a = gptq->weights.layers[l].quantized[size_t(p)];
      const auto& b = awq->weights.layers[l].quantized[size_t(p)];
      std::vector<float> wa(size_t(a.in_features * a.out_features)), wb(wa.size());
      dequantize(*gptq->config.quantization, a, wa.data());
      dequantize(*awq->config.quantization, b, wb.data());
      ASSERT_EQ(wa, wb) << "layer " << l << " projection " << p;
    }
  const auto ref = test::load_golden(goldens() / "awq-g64.json");
  const auto from_gptq = test::expect_engine_matches_golden(gptq, ref, "gptq-g64-asym");
  const auto from_awq = test::expect_engine_matches_golden(awq, ref, "awq-g64");
  EXPECT_EQ(from_gptq, from_awq);
}

TEST(int4, dequantizes_hand_packed_words) {
  // One 8 x 8 projection, one group. GPTQ: input row 8r + k in nibble k
  // (0x87654321: rows 0..7 hold 1..8 for every output); zeros stored as
  // zero - 1. AWQ: output column 8c + j in nibble REVERSE[j] (0x86427531:
  // columns 0..7 hold 1..8 for every input row); zeros as is.
  std::vector<uint16_t> scales(8, f32_to_f16(0.5f));
  quantization_config c;
  c.group_size = -1;
  {
    c.method = quant_method::gptq;
    std::vector<uint32_t> qweight(8, 0x87654321u);
    uint32_t qzeros = 0x76543210u; // zero of output o: o + 1
    auto qw = view("q.qweight", dtype::i32, {1, 8}, qweight.data(), 32);
    auto qz = view("q.qzeros", dtype::i32, {1, 1}, &qzeros, 4);
    auto sc = view("q.scales", dtype::f16, {1, 8}, scales.data(), 16);
    quantized_linear p{&qw, &qz, &sc, nullptr, 8, 8};
    std::vector<float> w(64);
    dequantize(c, p, w.data());
    for (int o = 0; o < 8; ++o)
      for (int i = 0; i < 8; ++i)
        EXPECT_EQ(w[size_t(o * 8 + i)], 0.5f * float((i + 1) - (o + 1))) << o << "," << i;
  }
  {
    c.method = quant_method::awq;
    std::vector<uint32_t> qweight(8, 0x86427531u); // [in 8, out / 8 = 1]
    uint32_t qzeros = 0x11111111u;                // zero 1 everywhere
    auto qw = view("q.qweight", dtype::i32, {8, 1}, qweight.data(), 32);
    auto qz = view("q.qzeros", dtype::i32, {1, 1}, &qzeros, 4);
    auto sc = view("q.scales", dtype::f16, {1, 8}, scales.data(), 16);
    quantized_linear p{&qw, &qz, &sc, nullptr, 8, 8};
    std::vector<float> w(64);
    dequantize(c, p, w.data());
    for (int o = 0; o < 8; ++o)
      for (int i = 0; i < 8; ++i)
        EXPECT_EQ(w[size_t(o * 8 + i)], 0.5f * float((o + 1) - 1)) << o << "," << i;
  }
}

// -- refusals: quantization_config ---------------------------------------------------

json base_config(const std::string& variant) {
  return json::parse(std::ifstream(goldens() / variant / "config.json"));
}

/// The model_error of parsing `variant`'s config.json with `edit` applied to
/// its quantization_config.
std::string config_error(const std::string& variant,
                         const std::function<void(json&)>& edit) {
  auto doc = base_config(variant);
  edit(doc["quantization_config"]);
  return error_of([&] { model_config::from_json(doc, "x/config.json"); });
}

TEST(int4, refuses_unsupported_quantization_config_fields_by_name) {
  struct refusal {
    std::string variant;
    std::function<void(json&)> edit;
    std::string expected;
  };
  const std::vector<refusal> cases = {
    {"gptq-g128-sym", [](json& q) { q["bits"] = 8; }, "quantization_config.bits: unsupported: 8 bits"},
    {"gptq-g128-sym", [](json& q) { q["bits"] = 3; }, "quantization_config.bits"},
    {"awq-g128", [](json& q) { q["bits"] = 8; }, "quantization_config.bits"},
    {"gptq-g128-sym", [](json& q) { q["group_size"] = 256; }, "quantization_config.group_size: unsupported group size 256"},
    {"gptq-g128-sym", [](json& q) { q.erase("group_size"); }, "quantization_config.group_size: missing"},
    {"gptq-g128-sym", [](json& q) { q["quant_method"] = "bitsandbytes"; }, "quantization_config.quant_method: unsupported quantization method 'bitsandbytes'"},
    {"gptq-g128-sym", [](json& q) { q.erase("quant_method"); }, "quantization_config.quant_method: missing"},
    {"gptq-g128-sym", [](json& q) { q["checkpoint_format"] = "gptq_v2"; }, "quantization_config.checkpoint_format: unsupported GPTQ checkpoint format 'gptq_v2'"},
    {"gptq-g128-sym", [](json& q) { q["checkpoint_format"] = "marlin"; }, "quantization_config.checkpoint_format: unsupported GPTQ checkpoint format 'marlin'"},
    {"gptq-g128-sym", [](json& q) { q["format"] = "gptq_v2"; }, "quantization_config.format: unsupported GPTQ checkpoint format 'gptq_v2'"},
    {"gptq-g128-sym", [](json& q) { q["is_marlin_format"] = true; }, "quantization_config.is_marlin_format"},
    {"gptq-g128-sym", [](json& q) { q["lm_head"] = true; }, "quantization_config.lm_head: a quantized lm_head is not supported"},
    {"gptq-g128-sym", [](json& q) { q["sym"] = "yes"; }, "quantization_config.sym: expected true or false"},
    {"gptq-g128-sym", [](json& q) { q["zero_point"] = true; }, "quantization_config.zero_point: unknown field"},
    {"gptq-g128-sym", [](json& q) { q["act_order_v3"] = 1; }, "quantization_config.act_order_v3: unknown field"},
    {"awq-g128", [](json& q) { q["version"] = "gemv"; }, "quantization_config.version: unsupported AWQ version 'gemv'"},
    {"awq-g128", [](json& q) { q["version"] = "exllama"; }, "quantization_config.version: unsupported AWQ version 'exllama'"},
    {"awq-g128", [](json& q) { q["zero_point"] = false; }, "quantization_config.zero_point: AWQ without zero points is not supported"},
    {"awq-g128", [](json& q) { q["desc_act"] = false; }, "quantization_config.desc_act: unknown field"},
  };
  for (const auto& c : cases) {
    const auto e = config_error(c.variant, c.edit);
    EXPECT_TRUE(contains(e, "x/config.json: " + c.expected)) << e;
  }
  // What is accepted: AutoAWQ's upper-case "GEMM", fields about how the
  // checkpoint was made.
  EXPECT_EQ(config_error("awq-g128", [](json& q) { q["version"] = "GEMM"; }), "<no model_error>");
  EXPECT_EQ(config_error("gptq-g64-asym", [](json& q) { q["damp_percent"] = 0.1; }),
            "<no model_error>");
}

// -- refusals: tensors -----------------------------------------------------------------

/// Copies `variant` to a scratch folder, its config.json edited by
/// `edit_config` and its weights rewritten: `drop` left out, then `edit`
/// adding tensors.
fs::path broken_copy(const std::string& variant, const std::vector<std::string>& drop,
                     const std::function<void(safetensors_writer&, const tensor_store&)>& edit,
                     const std::function<void(json&)>& edit_config = {}) {
  const auto src = goldens() / variant;
  auto dst = test::scratch_dir("int4-broken");
  auto doc = base_config(variant);
  if (edit_config)
    edit_config(doc);
  std::ofstream(dst / "config.json") << doc.dump(2);
  auto store = std::make_shared<tensor_store>(tensor_store::open_folder(src));
  safetensors_writer w;
  for (const auto& [name, view] : store->tensors()) {
    if (std::find(drop.begin(), drop.end(), name) != drop.end())
      continue;
    const tensor_view* v = &view;
    w.add(name, v->type, v->shape, [v](size_t first, std::span<std::byte> out) {
      std::memcpy(out.data(), v->data + first * dtype_size(v->type), out.size());
    });
  }
  edit(w, *store);
  w.write(dst / "model.safetensors");
  return dst;
}

/// Adds `name` as a copy of `from`'s bytes under another dtype or shape.
void add_like(safetensors_writer& w, const tensor_store& s, const std::string& name,
              const std::string& from, dtype type, std::vector<int64_t> shape) {
  const tensor_view* v = s.find(from);
  w.add(name, type, std::move(shape), [v, type](size_t first, std::span<std::byte> out) {
    std::memset(out.data(), 0, out.size());
    const size_t at = first * dtype_size(type);
    if (at < v->nbytes)
      std::memcpy(out.data(), v->data + at, std::min(out.size(), v->nbytes - at));
  });
}

TEST(int4, refuses_misshapen_mistyped_missing_and_stray_4bit_tensors) {
  const std::string p = "model.layers.1.mlp.down_proj.";
  auto open_error = [](const fs::path& dir) { return error_of([&] { model_folder::open(dir); }); };

  // GPTQ down_proj: in 512, out 256: qweight [64, 256].
  auto e = open_error(broken_copy("gptq-g128-sym", {p + "qweight"}, [&](auto& w, auto& s) {
    add_like(w, s, p + "qweight", p + "qweight", dtype::i32, {64, 248});
  }));
  EXPECT_TRUE(contains(e, p + "qweight: wrong shape [64, 248], expected [64, 256]")) << e;
  e = open_error(broken_copy("gptq-g128-sym", {p + "qweight"}, [&](auto& w, auto& s) {
    add_like(w, s, p + "qweight", p + "qweight", dtype::f32, {64, 256});
  }));
  EXPECT_TRUE(contains(e, p + "qweight: wrong dtype F32, expected I32")) << e;
  e = open_error(broken_copy("awq-g128", {p + "qweight"}, [&](auto& w, auto& s) {
    add_like(w, s, p + "qweight", p + "qweight", dtype::i32, {64, 256}); // GPTQ's shape
  }));
  EXPECT_TRUE(contains(e, p + "qweight: wrong shape [64, 256], expected [512, 32]")) << e;
  e = open_error(broken_copy("gptq-g128-sym", {p + "scales"}, [&](auto& w, auto& s) {
    add_like(w, s, p + "scales", p + "scales", dtype::bf16, {4, 256});
  }));
  EXPECT_TRUE(contains(e, p + "scales: wrong dtype BF16, expected F16")) << e;
  e = open_error(broken_copy("gptq-g64-asym", {p + "qzeros"}, [](auto&, auto&) {}));
  EXPECT_TRUE(contains(e, p + "qzeros: missing tensor")) << e;
  e = open_error(broken_copy("gptq-actorder-g32-asym", {p + "g_idx"}, [](auto&, auto&) {}));
  EXPECT_TRUE(contains(e, p + "g_idx: missing tensor")) << e;

  // g_idx naming a group that does not exist; without desc_act, one that is
  // not the row's own.
  e = open_error(broken_copy("gptq-actorder-g128-sym", {p + "g_idx"}, [&](auto& w, auto&) {
    w.add(p + "g_idx", dtype::i32, {512}, [](size_t first, std::span<std::byte> out) {
      for (size_t i = 0; i < out.size() / 4; ++i) {
        const int32_t g = first + i == 7 ? 4 : 0;
        std::memcpy(out.data() + 4 * i, &g, 4);
      }
    });
  }));
  EXPECT_TRUE(contains(e, p + "g_idx: row 7 names group 4 of 4")) << e;
  e = open_error(broken_copy("gptq-g128-sym", {p + "g_idx"}, [&](auto& w, auto&) {
    w.add(p + "g_idx", dtype::i32, {512}, [](size_t, std::span<std::byte> out) {
      std::memset(out.data(), 0, out.size()); // every row in group 0
    });
  }));
  EXPECT_TRUE(contains(e, p + "g_idx: row 128 is in group 0 but desc_act is false")) << e;

  // 4-bit tensors where nothing says how to read them, or beside the float
  // weight, or for the LM head.
  e = open_error(broken_copy("gptq-g128-sym", {}, [](auto&, auto&) {},
                             [](json& c) { c.erase("quantization_config"); }));
  EXPECT_TRUE(contains(e, "qweight: a 4-bit tensor, but config.json has no quantization_config"))
    << e;
  e = open_error(broken_copy("gptq-g128-sym", {}, [&](auto& w, auto&) {
    w.add(p + "weight", dtype::bf16, {256, 512}, [](size_t, std::span<std::byte> out) {
      std::memset(out.data(), 0, out.size());
    });
  }));
  EXPECT_TRUE(contains(e, p + "weight: a float weight beside " + p + "qweight")) << e;
  e = open_error(broken_copy("awq-g64", {}, [&](auto& w, auto& s) {
    add_like(w, s, "lm_head.qweight", p + "qweight", dtype::i32, {256, 64});
  }));
  EXPECT_TRUE(contains(e, "lm_head.qweight: unexpected 4-bit tensor")) << e;
}

TEST(int4, refuses_a_truncated_qweight) {
  // A qweight whose header promises more rows than its bytes hold.
  const auto src = goldens() / "gptq-g64-asym";
  auto dst = test::scratch_dir("int4-truncated");
  fs::copy_file(src / "config.json", dst / "config.json");
  std::ifstream in(src / "model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  auto header = json::parse(bytes.substr(8, n));
  const std::string q = "model.layers.0.self_attn.q_proj.qweight";
  header[q]["shape"] = {33, 256}; // 32 rows stored
  std::string text = header.dump();
  while (text.size() % 8)
    text.push_back(' ');
  const uint64_t len = text.size();
  std::ofstream out(dst / "model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << text << bytes.substr(8 + n);
  out.close();
  const auto e = error_of([&] { model_folder::open(dst); });
  EXPECT_TRUE(contains(e, q + ": size mismatch")) << e;
}

// -- the CUDA runner's layout (gpu/int4_layout) ----------------------------------------

TEST_P(int4_golden, the_cuda_layout_repacks_every_projection_exactly) {
  auto model = model_folder::open(goldens() / GetParam());
  const auto& qc = *model->config.quantization;
  const bool act_order = contains(GetParam(), "actorder");
  for (size_t l = 0; l < model->weights.layers.size(); ++l) {
    const auto& layer = model->weights.layers[l];
    std::vector<gpu::int4_layout> qkv;
    for (int p = 0; p < num_projections; ++p) {
      const auto& ql = layer.quantized[size_t(p)];
      ASSERT_TRUE(ql.present());
      gpu::int4_layout m = gpu::repack_int4(qc, ql);
      EXPECT_EQ(m.rows, ql.out_features);
      EXPECT_EQ(m.cols, ql.in_features);
      EXPECT_EQ(m.perm.empty(), !act_order) << "layer " << l << " projection " << p;
      std::vector<float> want(size_t(ql.in_features * ql.out_features)), got(want.size());
      dequantize(qc, ql, want.data());
      gpu::dequantize(m, got.data());
      ASSERT_EQ(got, want) << GetParam() << " layer " << l << " projection " << p;
      if (p <= int(projection::v))
        qkv.push_back(std::move(m));
    }
    // The goldens draw an act-order permutation per projection, so q, k
    // and v cannot share one input order; in order, they stack.
    std::string why;
    const auto stacked = gpu::stack_int4(std::move(qkv), &why);
    if (act_order) {
      EXPECT_FALSE(stacked);
      EXPECT_TRUE(contains(why, "permutations (g_idx) differ")) << why;
    } else {
      ASSERT_TRUE(stacked) << why;
      EXPECT_EQ(stacked->rows, model->config.q_size() + 2 * model->config.kv_size());
    }
  }
}

TEST(int4, the_cuda_layout_refuses_act_order_groups_that_are_not_runs) {
  // 64 inputs in groups of 32, but g_idx puts 33 rows in group 0.
  std::vector<uint32_t> qweight(8 * 8, 0x12345678u); // [in / 8, out 8]
  std::vector<uint32_t> qzeros(2, 0x77777777u);      // [groups 2, out / 8]
  std::vector<uint16_t> scales(16, f32_to_f16(0.25f));
  std::vector<int32_t> g_idx(64);
  for (int i = 0; i < 64; ++i)
    g_idx[size_t(i)] = i % 2;
  g_idx[1] = 0;
  auto qw = view("o.qweight", dtype::i32, {8, 8}, qweight.data(), 256);
  auto qz = view("o.qzeros", dtype::i32, {2, 1}, qzeros.data(), 8);
  auto sc = view("o.scales", dtype::f16, {2, 8}, scales.data(), 32);
  auto gi = view("o.g_idx", dtype::i32, {64}, g_idx.data(), 256);
  quantization_config c;
  c.group_size = 32;
  c.desc_act = true;
  const quantized_linear p{&qw, &qz, &sc, &gi, 64, 8};
  const auto e = error_of([&] { gpu::repack_int4(c, p); });
  EXPECT_TRUE(contains(e, "o.g_idx: act-order groups are not runs of 32 rows")) << e;
  // Alternating groups that are runs once sorted repack, exactly.
  g_idx[1] = 1;
  const gpu::int4_layout m = gpu::repack_int4(c, p);
  ASSERT_EQ(m.perm.size(), 64u);
  EXPECT_EQ(m.perm[0], 0);
  EXPECT_EQ(m.perm[1], 2);
  EXPECT_EQ(m.perm[32], 1);
  std::vector<float> want(64 * 8), got(want.size());
  dequantize(c, p, want.data());
  gpu::dequantize(m, got.data());
  EXPECT_EQ(got, want);
}

TEST(int4, half_bits_read_as_their_float) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 0.0001f, 65504.0f, 6.1e-5f, 3.0e-7f})
    EXPECT_EQ(gpu::half_bits_to_float(f32_to_f16(f)), f16_to_f32(f32_to_f16(f))) << f;
  EXPECT_TRUE(gpu::int4_kernels_take(4096, 128));
  EXPECT_TRUE(gpu::int4_kernels_take(4096, -1));
  EXPECT_FALSE(gpu::int4_kernels_take(4104, 128));
  EXPECT_FALSE(gpu::int4_kernels_take(4096, 48));
}

// -- the CUDA runner and the CLI ---------------------------------------------------------

TEST(int4, metronome_generate_runs_a_4bit_folder_on_the_cpu) {
  for (const std::string variant : {"gptq-actorder-g32-asym", "awq-g128"}) {
    const auto ref = test::load_golden(goldens() / (variant + ".json"));
    const auto& run = ref["runs"][2];
    std::string ids;
    for (auto id : run["prompt"])
      ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
    auto r = test::run_command(test::shell_quote(test::env("BIN")) + " generate --model "
                               + test::shell_quote((goldens() / variant).string())
                               + " --prompt-ids " + ids
                               + " -n 17 --temperature 0 --ignore-eos --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(json::parse(r.output)["ids"], run["greedy_ids"]) << variant;
  }
}

} // namespace
} // namespace metronome
