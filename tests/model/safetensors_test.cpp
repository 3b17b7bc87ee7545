// safetensors reading and model folder binding: valid files, shards, and
// one clear error (file and tensor named) for each way a folder can be wrong.

#include <cstring>
#include <fstream>
#include <functional>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/model_error.hpp"
#include "model/model_weights.hpp"
#include "model/safetensors.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

/// Writes a safetensors file from a header text and raw data bytes.
void write_raw(const fs::path& path, const std::string& header, const std::string& data,
               uint64_t declared_len = UINT64_MAX) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint64_t n = declared_len == UINT64_MAX ? header.size() : declared_len;
  for (int i = 0; i < 8; ++i)
    out.put(char((n >> (8 * i)) & 0xff));
  out << header << data;
}

/// The message of the model_error that `f` throws, or "" (a test failure).
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const model_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no model_error thrown";
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(safetensors, reads_dtype_shape_and_bytes) {
  auto dir = test::scratch_dir("st-valid");
  std::string data(24, '\0');
  const float values[4] = {1.5f, -2.0f, 0.25f, 8.0f};
  std::memcpy(data.data(), values, 16);
  data[16] = 0x80; // bf16 1.0 = 0x3f80, little endian
  data[17] = 0x3f;
  write_raw(dir / "a.safetensors",
            R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
            R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]},"__metadata__":{"x":"y"}})",
            data);
  auto store = tensor_store::open_file(dir / "a.safetensors");
  ASSERT_EQ(store.tensors().size(), 2u);
  const auto* w = store.find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->type, dtype::f32);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 2}));
  float got[4];
  std::memcpy(got, w->data, 16);
  EXPECT_EQ(got[1], -2.0f);
  EXPECT_EQ(bf16_to_f32(uint16_t(std::to_integer<uint8_t>(store.find("b")->data[0])
                                 | std::to_integer<uint8_t>(store.find("b")->data[1]) << 8)),
            1.0f);
}

TEST(safetensors, rejects_broken_files_naming_file_and_tensor) {
  auto dir = test::scratch_dir("st-broken");
  auto f = dir / "x.safetensors";
  auto open = [&] { tensor_store::open_file(f); };
  std::ofstream(f, std::ios::binary) << "abc";
  EXPECT_TRUE(contains(error_of(open), "truncated file"));
  write_raw(f, R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "", 4096);
  EXPECT_TRUE(contains(error_of(open), "truncated file"));
  write_raw(f, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234");
  auto e = error_of(open);
  EXPECT_TRUE(contains(e, "x.safetensors: w: truncated file")) << e;
  write_raw(f, R"({"w":{"dtype":"F32","shape":[2],)", "");
  EXPECT_TRUE(contains(error_of(open), "malformed header"));
  write_raw(f, R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", "12345678");
  e = error_of(open);
  EXPECT_TRUE(contains(e, "w: unsupported dtype 'F64'")) << e;
  write_raw(f, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", "12345678");
  EXPECT_TRUE(contains(error_of(open), "w: size mismatch"));
  write_raw(f, R"({"w":{"dtype":"F32","shape":[2]}})", "12345678");
  EXPECT_TRUE(contains(error_of(open), "w: malformed header entry"));
  write_raw(f, R"([1,2,3])", "");
  EXPECT_TRUE(contains(error_of(open), "malformed header"));
}

// Found by tests/fuzz/safetensors_fuzz.cpp: a number the JSON parser cannot
// hold escaped as nlohmann's out_of_range instead of a model_error naming
// the file.
TEST(safetensors, numbers_out_of_range_are_a_malformed_header) {
  auto dir = test::scratch_dir("st-overflow");
  auto f = dir / "x.safetensors";
  write_raw(f, R"({"w":{"dtype":"F32","shape":[-1e400],"data_offsets":[0,4]}})", "1234");
  auto e = error_of([&] { tensor_store::open_file(f); });
  EXPECT_TRUE(contains(e, "x.safetensors")) << e;
  EXPECT_TRUE(contains(e, "malformed header")) << e;
}

// A shape whose element count overflows 64 bits wrapped to a size that
// matched the (empty) data: 2^62 * 4 elements of 4 bytes "fit" in 0 bytes.
TEST(safetensors, shapes_that_overflow_are_refused) {
  auto dir = test::scratch_dir("st-huge-shape");
  auto f = dir / "x.safetensors";
  write_raw(f, R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})",
            "");
  auto e = error_of([&] { tensor_store::open_file(f); });
  EXPECT_TRUE(contains(e, "w: size mismatch")) << e;
}

TEST(safetensors, weights_are_views_into_the_file_mapping_not_copies) {
  auto model = model_folder::open(test::tiny_model("tiny-llama3"));
  const auto* embed = model->weights.embed;
  auto addr = reinterpret_cast<uintptr_t>(embed->data);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  bool found = false;
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && addr >= lo && addr < hi)
      found = contains(line, "model.safetensors");
  }
  EXPECT_TRUE(found) << "embedding data is not inside the mapping of model.safetensors";
}

/// Copies a model folder's weights into `dst` with edits: drop, add or
/// replace tensors (by name).
void rewrite_weights(const fs::path& src, const fs::path& dst,
                     const std::function<void(safetensors_writer&, const tensor_store&)>& edit,
                     const std::set<std::string>& drop = {}) {
  fs::create_directories(dst);
  fs::copy_file(src / "config.json", dst / "config.json", fs::copy_options::overwrite_existing);
  auto store = std::make_shared<tensor_store>(tensor_store::open_folder(src));
  safetensors_writer w;
  for (const auto& [name, t] : store->tensors()) {
    if (drop.contains(name))
      continue;
    const tensor_view* view = &t;
    w.add(name, t.type, t.shape, [store, view](size_t first, std::span<std::byte> out) {
      std::memcpy(out.data(), view->data + first * dtype_size(view->type), out.size());
    });
  }
  edit(w, *store);
  w.write(dst / "model.safetensors");
}

safetensors_writer::fill_fn zeros() {
  return [](size_t, std::span<std::byte> out) { std::memset(out.data(), 0, out.size()); };
}

TEST(model_folder, reports_missing_unexpected_misshapen_and_mistyped_tensors) {
  auto src = test::tiny_model("tiny-llama3");
  auto dst = test::scratch_dir("mf-broken");
  auto open = [&] { model_folder::open(dst); };
  const std::string q = "model.layers.1.self_attn.q_proj.weight";

  rewrite_weights(src, dst, [](auto&, auto&) {}, {q});
  auto e = error_of(open);
  EXPECT_TRUE(contains(e, q + ": missing tensor")) << e;

  rewrite_weights(src, dst, [](auto& w, auto&) { w.add("model.extra.weight", dtype::bf16, {4}, zeros()); });
  e = error_of(open);
  EXPECT_TRUE(contains(e, "model.extra.weight: unexpected tensor")) << e;

  rewrite_weights(src, dst, [&](auto& w, auto&) { w.add(q, dtype::bf16, {64, 63}, zeros()); }, {q});
  e = error_of(open);
  EXPECT_TRUE(contains(e, q + ": wrong shape [64, 63], expected [64, 64]")) << e;

  rewrite_weights(src, dst, [&](auto& w, auto&) { w.add(q, dtype::f32, {64, 64}, zeros()); }, {q});
  e = error_of(open);
  EXPECT_TRUE(contains(e, q + ": wrong dtype F32")) << e;
}

TEST(model_folder, reports_missing_and_malformed_config_and_weights) {
  auto src = test::tiny_model("tiny-llama3");
  auto dst = test::scratch_dir("mf-config");
  auto open = [&] { model_folder::open(dst); };
  auto e = error_of(open);
  EXPECT_TRUE(contains(e, "config.json: cannot open file")) << e;
  std::ofstream(dst / "config.json") << "{ not json";
  EXPECT_TRUE(contains(error_of(open), "config.json: malformed JSON"));
  // A number JSON cannot hold is malformed JSON too, not an escaping
  // nlohmann::json::out_of_range.
  std::ofstream(dst / "config.json", std::ios::trunc) << R"({"vocab_size": 1e400})";
  EXPECT_TRUE(contains(error_of(open), "config.json: malformed JSON"));
  fs::copy_file(src / "config.json", dst / "config.json", fs::copy_options::overwrite_existing);
  e = error_of(open);
  EXPECT_TRUE(contains(e, "no model.safetensors")) << e;
  EXPECT_TRUE(contains(error_of([] { model_folder::open("/nonexistent/model"); }), "not a directory"));
}

TEST(model_folder, loads_sharded_weights_through_the_index) {
  auto single = model_folder::open(test::tiny_model("tiny-mistral"));
  make_model_options o;
  o.config = *preset_config("tiny-mistral");
  o.seed = 7;
  o.out_dir = test::scratch_dir("mf-sharded");
  o.max_shard_bytes = 1'000'000;
  make_model(o);
  ASSERT_TRUE(fs::exists(o.out_dir / "model.safetensors.index.json"));
  ASSERT_FALSE(fs::exists(o.out_dir / "model.safetensors"));
  auto sharded = model_folder::open(o.out_dir);
  EXPECT_GT(sharded->store->files().size(), 2u);
  ASSERT_EQ(sharded->store->tensors().size(), single->store->tensors().size());
  for (const auto& [name, t] : single->store->tensors()) {
    const auto* s = sharded->store->find(name);
    ASSERT_NE(s, nullptr) << name;
    ASSERT_EQ(s->nbytes, t.nbytes);
    EXPECT_EQ(std::memcmp(s->data, t.data, t.nbytes), 0) << name;
  }
}

TEST(model_folder, reports_index_problems) {
  make_model_options o;
  o.config = *preset_config("tiny-mistral");
  o.out_dir = test::scratch_dir("mf-index");
  o.max_shard_bytes = 1'000'000;
  make_model(o);
  auto index_path = o.out_dir / "model.safetensors.index.json";
  json index = json::parse(std::ifstream(index_path));
  auto first_shard = index["weight_map"]["lm_head.weight"].get<std::string>();
  index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = first_shard;
  std::ofstream(index_path) << index.dump();
  auto e = error_of([&] { model_folder::open(o.out_dir); });
  EXPECT_TRUE(contains(e, "model.layers.9.mlp.up_proj.weight: listed in the index but missing"))
    << e;
  index["weight_map"].erase("model.layers.9.mlp.up_proj.weight");
  fs::remove(o.out_dir / first_shard);
  std::ofstream(index_path) << index.dump();
  e = error_of([&] { model_folder::open(o.out_dir); });
  EXPECT_TRUE(contains(e, "does not exist")) << e;
}

} // namespace
} // namespace metronome
