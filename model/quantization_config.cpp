#include "model/quantization_config.hpp"

#include <algorithm>
#include <cctype>
#include <set>

#include <nlohmann/json.hpp>

#include "model/model_error.hpp"

namespace metronome {

using nlohmann::json;

std::string_view quant_method_name(quant_method m) {
  switch (m) {
    case quant_method::gptq: return "gptq";
    case quant_method::awq: return "awq";
  }
  return "?";
}

std::string quantization_config::describe() const {
  std::string s(quant_method_name(method));
  s += ", " + std::to_string(bits) + " bits, ";
  s += group_size < 0 ? std::string("per channel") : "group " + std::to_string(group_size);
  if (method == quant_method::gptq) {
    s += sym ? ", sym" : ", asym";
    if (desc_act)
      s += ", desc_act";
  }
  return s;
}

namespace {

/// Fields that describe how a checkpoint was made or how some other runtime
/// should run it, never what its tensors mean: accepted and not read.
const std::set<std::string, std::less<>> gptq_ignored = {
  "damp_percent",   "damp_auto_increment", "true_sequential",
  "static_groups",  "model_name_or_path",  "model_file_base_name",
  "meta",           "mse",                 "tokenizer",
  "dataset",        "batch_size",          "pad_token_id",
  "use_exllama",    "exllama_config",      "use_cuda_fp16",
  "max_input_length", "cache_block_outputs", "module_name_preceding_first_linear",
  "model_seqlen",   "block_name_to_quantize", "disable_exllama",
  "backend",        "modules_in_block_to_quantize"};

const std::set<std::string, std::less<>> awq_ignored = {
  "do_fuse", "fuse_max_seq_len", "modules_to_fuse", "exllama_config"};

class reader {
public:
  reader(const json& q, const std::string& file) : q_(q), file_(file) {}

  [[noreturn]] void fail(std::string_view key, const std::string& problem) const {
    throw model_error(file_, "quantization_config" + (key.empty() ? "" : "." + std::string(key)),
                      problem);
  }

  const json* find(const char* key) {
    seen_.insert(key);
    auto i = q_.find(key);
    return i == q_.end() || i->is_null() ? nullptr : &*i;
  }

  std::string string(const char* key, const std::string& fallback) {
    const json* v = find(key);
    if (!v)
      return fallback;
    if (!v->is_string())
      fail(key, "expected a string, got " + std::string(v->type_name()));
    return v->get<std::string>();
  }

  bool boolean(const char* key, bool fallback) {
    const json* v = find(key);
    if (!v)
      return fallback;
    if (!v->is_boolean())
      fail(key, "expected true or false, got " + std::string(v->type_name()));
    return v->get<bool>();
  }

  int64_t integer(const char* key) {
    const json* v = find(key);
    if (!v)
      fail(key, "missing required field");
    if (!v->is_number_integer())
      fail(key, "expected an integer, got " + v->dump());
    return v->get<int64_t>();
  }

  /// Refuses any field neither read nor in `ignored`.
  void reject_unknown(const std::set<std::string, std::less<>>& ignored) const {
    for (const auto& [key, _] : q_.items())
      if (!seen_.contains(key) && !ignored.contains(key))
        fail(key, "unknown field: Metronome cannot tell whether it changes the weights' "
                  "layout, so it does not load this checkpoint");
  }

private:
  const json& q_;
  const std::string& file_;
  std::set<std::string, std::less<>> seen_;
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

} // namespace

quantization_config quantization_config::from_json(const json& q, const std::string& file) {
  reader r(q, file);
  if (!q.is_object())
    r.fail("", "expected an object");
  quantization_config c;
  const std::string method = r.string("quant_method", "");
  if (method.empty())
    r.fail("quant_method", "missing required field (supported: gptq, awq)");
  if (method == "gptq")
    c.method = quant_method::gptq;
  else if (method == "awq")
    c.method = quant_method::awq;
  else
    r.fail("quant_method", "unsupported quantization method '" + method
                             + "' (supported: gptq, awq)");
  const int64_t bits = r.integer("bits");
  if (bits != 4)
    r.fail("bits", "unsupported: " + std::to_string(bits) + " bits (supported: 4)");
  c.bits = 4;
  const int64_t group = r.integer("group_size");
  if (group != 32 && group != 64 && group != 128 && group != -1)
    r.fail("group_size", "unsupported group size " + std::to_string(group)
                           + " (supported: 32, 64, 128, -1 for per channel)");
  c.group_size = int32_t(group);
  if (const json* m = r.find("modules_to_not_convert")) {
    if (!m->is_array())
      r.fail("modules_to_not_convert", "expected a list of module names or null");
    for (const auto& name : *m) {
      if (!name.is_string())
        r.fail("modules_to_not_convert", "expected a list of module names");
      c.modules_to_not_convert.push_back(name.get<std::string>());
    }
  }

  if (c.method == quant_method::gptq) {
    c.sym = r.boolean("sym", true);
    c.desc_act = r.boolean("desc_act", false);
    // GPTQModel writes `format`, AutoGPTQ and transformers `checkpoint_format`;
    // absent, both mean the v1 layout. gptq_v2 stores zeros without the -1,
    // marlin and others repack qweight: different tensors under the same names.
    for (const char* key : {"checkpoint_format", "format"}) {
      const std::string f = r.string(key, "gptq");
      if (f != "gptq")
        r.fail(key, "unsupported GPTQ checkpoint format '" + f + "' (supported: gptq)");
    }
    if (r.boolean("is_marlin_format", false))
      r.fail("is_marlin_format", "Marlin-packed GPTQ checkpoints are not supported (supported: "
                                 "the gptq format)");
    if (r.boolean("lm_head", false))
      r.fail("lm_head", "a quantized lm_head is not supported (embeddings and lm_head must stay "
                        "in float)");
    if (const json* d = r.find("dynamic"); d && !(d->is_object() && d->empty()))
      r.fail("dynamic", "per-module overrides of the quantization are not supported");
    if (const std::string p = r.string("pack_dtype", "int32"); p != "int32")
      r.fail("pack_dtype", "unsupported packing '" + p + "' (supported: int32)");
    r.reject_unknown(gptq_ignored);
  } else {
    if (!r.boolean("zero_point", true))
      r.fail("zero_point", "AWQ without zero points is not supported (supported: true)");
    const std::string version = r.string("version", "");
    if (version.empty())
      r.fail("version", "missing required field (supported: gemm)");
    // AutoAWQ writes "GEMM", transformers "gemm".
    if (lower(version) != "gemm")
      r.fail("version", "unsupported AWQ version '" + version
                          + "' (supported: gemm; gemv and exllama pack differently)");
    if (const std::string b = r.string("backend", "autoawq"); b != "autoawq")
      r.fail("backend", "unsupported AWQ backend '" + b + "' (supported: autoawq)");
    r.reject_unknown(awq_ignored);
  }
  return c;
}

json quantization_config::to_json() const {
  json j = {{"quant_method", std::string(quant_method_name(method))},
            {"bits", bits},
            {"group_size", group_size}};
  json modules = nullptr;
  if (!modules_to_not_convert.empty())
    modules = modules_to_not_convert;
  if (method == quant_method::gptq) {
    j["desc_act"] = desc_act;
    j["sym"] = sym;
    j["checkpoint_format"] = "gptq";
  } else {
    j["zero_point"] = true;
    j["version"] = "gemm";
    j["modules_to_not_convert"] = modules;
  }
  return j;
}

} // namespace metronome
