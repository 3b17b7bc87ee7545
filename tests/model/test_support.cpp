#include "tests/model/test_support.hpp"

#include "model/model_error.hpp"
#include "model/rtn_quantize.hpp"

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace metronome::test {

namespace fs = std::filesystem;

fs::path scratch_dir(const std::string& name) {
  auto base = env("WORK_DIR");
  fs::path root = base.empty() ? fs::temp_directory_path() / "metronome-test" : fs::path(base);
  auto dir = root / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

namespace {

/// Removes this process's model folders when the test program ends.
struct model_folders {
  std::map<std::pair<std::string, uint64_t>, fs::path> made;
  ~model_folders() {
    std::error_code ec;
    for (const auto& [_, dir] : made)
      fs::remove_all(dir, ec);
  }
};

} // namespace

fs::path tiny_model(const std::string& preset, uint64_t seed) {
  static std::mutex mtx;
  static model_folders folders;
  auto& made = folders.made;
  std::lock_guard guard{mtx};
  auto key = std::make_pair(preset, seed);
  if (auto i = made.find(key); i != made.end())
    return i->second;
  make_model_options o;
  o.config = *preset_config(preset);
  o.seed = seed;
  o.out_dir = scratch_dir("models-" + std::to_string(::getpid()) + "-" + preset + "-"
                          + std::to_string(seed));
  make_model(o);
  made[key] = o.out_dir;
  return o.out_dir;
}

fs::path int4_model(quant_method layout) {
  static std::mutex mtx;
  static std::map<quant_method, fs::path> made;
  std::lock_guard guard{mtx};
  if (auto i = made.find(layout); i != made.end())
    return i->second;
  make_model_options o;
  o.config = *preset_config("tiny-llama3");
  o.config.hidden_size = 256;
  o.config.num_heads = 4;
  o.config.num_kv_heads = 2;
  o.config.head_dim = 64;
  o.config.intermediate_size = 512;
  o.config.num_layers = 2;
  o.seed = 5;
  o.quantize = rtn_config(layout, 128);
  o.out_dir = scratch_dir("models-" + std::to_string(::getpid()) + "-int4-"
                          + std::string(quant_method_name(layout)));
  make_model(o);
  made[layout] = o.out_dir;
  return o.out_dir;
}

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

fs::path int4_goldens() {
  struct unpacked {
    fs::path root;
    ~unpacked() {
      std::error_code ec;
      if (!root.empty())
        fs::remove_all(root, ec);
    }
  };
  static std::mutex mtx;
  static unpacked dir;
  std::lock_guard guard{mtx};
  if (dir.root.empty()) {
    auto root = scratch_dir("int4-goldens-" + std::to_string(::getpid()));
    const auto archive = env("SOURCE_DIR") + "/tools/golden/int4_goldens.tar.xz";
    auto r = run_command("tar -xJf " + shell_quote(archive) + " -C " + shell_quote(root.string()));
    if (r.exit_code != 0)
      throw std::runtime_error("cannot unpack " + archive + ": " + r.output);
    dir.root = root;
  }
  return dir.root / "int4_goldens";
}

const std::vector<std::string>& int4_golden_variants() {
  static const std::vector<std::string> v = {
    "gptq-g128-sym",          "gptq-g64-asym", "gptq-perchannel", "gptq-actorder-g32-asym",
    "gptq-actorder-g128-sym", "awq-g64",       "awq-g128"};
  return v;
}

fs::path served_model(const std::string& preset, const std::string& tokenizer) {
  static std::mutex mtx;
  static model_folders folders;
  std::lock_guard guard{mtx};
  auto key = std::make_pair(preset + "+" + tokenizer, uint64_t{7});
  if (auto i = folders.made.find(key); i != folders.made.end())
    return i->second;
  make_model_options o;
  o.config = *preset_config(preset);
  o.seed = 7;
  o.tokenizer_dir = env("TESTDATA") + "/tokenizers/" + tokenizer;
  o.out_dir = scratch_dir("served-" + std::to_string(::getpid()) + "-" + preset);
  make_model(o);
  folders.made[key] = o.out_dir;
  return o.out_dir;
}

void overwrite_f32_tensor(const fs::path& file, const std::string& name,
                          const std::function<void(float*, const std::vector<int64_t>&)>& edit) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  if (!f)
    throw std::runtime_error("cannot open " + file.string());
  uint64_t header_len = 0;
  f.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  f.read(header.data(), std::streamsize(header_len));
  const auto j = nlohmann::json::parse(header);
  if (!j.contains(name) || j[name]["dtype"] != "F32")
    throw std::runtime_error(file.string() + ": no F32 tensor " + name);
  const auto shape = j[name]["shape"].get<std::vector<int64_t>>();
  const auto begin = j[name]["data_offsets"][0].get<uint64_t>();
  const auto end = j[name]["data_offsets"][1].get<uint64_t>();
  std::vector<float> values((end - begin) / 4);
  f.seekg(std::streamoff(8 + header_len + begin));
  f.read(reinterpret_cast<char*>(values.data()), std::streamsize(end - begin));
  edit(values.data(), shape);
  f.seekp(std::streamoff(8 + header_len + begin));
  f.write(reinterpret_cast<const char*>(values.data()), std::streamsize(end - begin));
  if (!f)
    throw std::runtime_error("cannot write " + file.string());
}

fs::path overflowing_model() {
  static std::mutex mtx;
  static model_folders folders;
  std::lock_guard guard{mtx};
  auto key = std::make_pair(std::string("overflowing"), uint64_t{11});
  if (auto i = folders.made.find(key); i != folders.made.end())
    return i->second;
  make_model_options o;
  o.config = *preset_config("tiny-llama3");
  o.seed = 11;
  o.weight_type = dtype::f32;
  o.tokenizer_dir = env("TESTDATA") + "/tokenizers/llama3";
  o.out_dir = scratch_dir("overflowing-" + std::to_string(::getpid()));
  make_model(o);
  const auto file = o.out_dir / "model.safetensors";
  overwrite_f32_tensor(file, "model.embed_tokens.weight",
                       [](float* v, const std::vector<int64_t>& shape) {
                         const int64_t vocab = shape[0], hidden = shape[1];
                         for (int64_t t = 0; t < vocab; ++t)
                           v[t * hidden] = 0.0f;
                         for (int64_t i = 0; i < hidden; ++i)
                           v[overflow_token * hidden + i] = i == 0 ? 1.0f : 0.0f;
                       });
  overwrite_f32_tensor(file, "model.layers.0.self_attn.v_proj.weight",
                       [](float* v, const std::vector<int64_t>&) { v[0] = 1e5f; });
  folders.made[key] = o.out_dir;
  return o.out_dir;
}

command_result run_command(const std::string& cmd) {
  command_result r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p)
    return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0)
    r.output.append(buf.data(), n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

reference_logprobs load_reference_logprobs(const std::string& preset) {
  const auto path = env("SOURCE_DIR") + "/tools/golden/" + preset + "-logprobs.json";
  std::ifstream in(path);
  if (!in)
    throw std::runtime_error("cannot open " + path);
  const auto j = nlohmann::json::parse(in);
  reference_logprobs ref;
  ref.top = j.at("top").get<int32_t>();
  for (const auto& r : j.at("runs")) {
    reference_logprobs::run run;
    run.prompt = r.at("prompt").get<std::vector<int32_t>>();
    for (const auto& s : r.at("steps"))
      run.steps.push_back({s.at("token").get<int32_t>(), s.at("logprob").get<double>(),
                           s.at("top_ids").get<std::vector<int32_t>>(),
                           s.at("top_logprobs").get<std::vector<double>>()});
    ref.runs.push_back(std::move(run));
  }
  return ref;
}

bool expect_logprobs_near(const reference_logprobs::step& ref,
                          const std::vector<token_logprob>& got, size_t n, double tolerance,
                          const std::string& where) {
  bool ok = true;
  auto check = [&](bool cond, const std::string& what) {
    EXPECT_TRUE(cond) << where << ": " << what;
    ok = ok && cond;
  };
  check(got.size() == n + 1, "reported " + std::to_string(got.size()) + " entries, want "
                               + std::to_string(n + 1));
  if (got.size() != n + 1)
    return false;
  if (got[0].token == ref.token)
    check(std::abs(got[0].logprob - ref.logprob) <= tolerance,
          "sampled token's logprob " + std::to_string(got[0].logprob) + ", reference "
            + std::to_string(ref.logprob));
  for (size_t k = 0; k < n && k < ref.top_ids.size(); ++k) {
    const auto& e = got[1 + k];
    check(std::abs(e.logprob - ref.top_logprobs[k]) <= tolerance,
          "entry " + std::to_string(k) + ": " + std::to_string(e.logprob) + ", reference "
            + std::to_string(ref.top_logprobs[k]));
    if (k > 0)
      check(got[k].logprob >= e.logprob, "entries out of order at " + std::to_string(k));
    for (size_t r = 0; r < ref.top_ids.size(); ++r)
      if (ref.top_ids[r] == e.token)
        check(std::abs(e.logprob - ref.top_logprobs[r]) <= tolerance,
              "token " + std::to_string(e.token) + ": " + std::to_string(e.logprob)
                + ", reference " + std::to_string(ref.top_logprobs[r]));
    if (e.token == got[0].token)
      check(e.logprob == got[0].logprob, "the sampled token's two entries differ");
  }
  return ok;
}

} // namespace metronome::test
