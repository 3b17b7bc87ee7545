#include "model/model_config.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numbers>

#include <nlohmann/json.hpp>

#include "model/model_error.hpp"

namespace metronome {

using nlohmann::json;

std::string_view architecture_name(model_arch arch) {
  switch (arch) {
    case model_arch::llama: return "LlamaForCausalLM";
    case model_arch::mistral: return "MistralForCausalLM";
    case model_arch::qwen2: return "Qwen2ForCausalLM";
  }
  return "?";
}

namespace {

/// Typed access to config.json fields with errors that name the field.
class field_reader {
public:
  field_reader(const json& doc, const std::string& file) : doc_(doc), file_(file) {
    if (!doc.is_object())
      throw model_error(file_, "", "expected a JSON object at the top level");
  }

  [[noreturn]] void fail(const std::string& field, const std::string& problem) const {
    throw model_error(file_, field, problem);
  }

  bool has(const char* key) const {
    auto i = doc_.find(key);
    return i != doc_.end() && !i->is_null();
  }

  const json* find(const json& obj, const char* key) const {
    auto i = obj.find(key);
    return i == obj.end() || i->is_null() ? nullptr : &*i;
  }

  int64_t integer(const json& v, const std::string& field) const {
    if (v.is_number_integer() || v.is_number_unsigned())
      return v.get<int64_t>();
    if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()) {
      // Converting a double outside int64_t's range is undefined behaviour.
      const double d = v.get<double>();
      if (!(d >= -0x1p63 && d < 0x1p63))
        fail(field, "integer out of range: " + v.dump());
      return static_cast<int64_t>(d);
    }
    fail(field, "expected an integer, got " + std::string(v.type_name()));
  }

  int32_t positive(const json& v, const std::string& field) const {
    auto x = integer(v, field);
    if (x <= 0 || x > INT32_MAX)
      fail(field, "must be a positive 32-bit integer, got " + std::to_string(x));
    return static_cast<int32_t>(x);
  }

  int32_t required_positive(const char* key) const {
    auto* v = find(doc_, key);
    if (!v)
      fail(key, "missing required field");
    return positive(*v, key);
  }

  double number(const json& v, const std::string& field) const {
    if (!v.is_number())
      fail(field, "expected a number, got " + std::string(v.type_name()));
    return v.get<double>();
  }

  bool boolean(const char* key, bool fallback) const {
    auto* v = find(doc_, key);
    if (!v)
      return fallback;
    if (!v->is_boolean())
      fail(key, "expected true or false, got " + std::string(v->type_name()));
    return v->get<bool>();
  }

  std::string string(const json& v, const std::string& field) const {
    if (!v.is_string())
      fail(field, "expected a string, got " + std::string(v.type_name()));
    return v.get<std::string>();
  }

  const json& doc() const {
    return doc_;
  }

private:
  const json& doc_;
  const std::string& file_;
};

model_arch parse_arch(const field_reader& r) {
  const json* archs = r.find(r.doc(), "architectures");
  if (!archs)
    r.fail("architectures", "missing required field");
  if (!archs->is_array() || archs->empty())
    r.fail("architectures", "expected a non-empty array of class names");
  auto name = r.string((*archs)[0], "architectures[0]");
  for (auto a : {model_arch::llama, model_arch::mistral, model_arch::qwen2})
    if (name == architecture_name(a))
      return a;
  r.fail("architectures[0]", "unsupported architecture '" + name
                                  + "' (supported: LlamaForCausalLM, MistralForCausalLM, "
                                    "Qwen2ForCausalLM)");
}

/// Reads rope settings from the 4.x keys (`rope_theta`, `rope_scaling`) or the
/// 5.x key (`rope_parameters`).
void parse_rope(const field_reader& r, model_config& cfg) {
  const json* params = r.find(r.doc(), "rope_parameters");
  const json* scaling = r.find(r.doc(), "rope_scaling");
  std::string where = "rope_scaling";
  if (params && params->is_object()) {
    if (auto* t = r.find(*params, "rope_theta"))
      cfg.rope_theta = r.number(*t, "rope_parameters.rope_theta");
    scaling = params;
    where = "rope_parameters";
  }
  if (auto* t = r.find(r.doc(), "rope_theta"))
    cfg.rope_theta = r.number(*t, "rope_theta");
  if (!(cfg.rope_theta > 1.0))
    r.fail("rope_theta", "must be greater than 1");
  if (!scaling)
    return;
  if (!scaling->is_object())
    r.fail(where, "expected an object or null");
  const json* type = r.find(*scaling, "rope_type");
  if (!type)
    type = r.find(*scaling, "type");
  std::string kind = type ? r.string(*type, where + ".rope_type") : "default";
  if (kind == "default")
    return;
  if (kind != "llama3")
    r.fail(where + ".rope_type", "unsupported rope scaling '" + kind
                                     + "' (supported: default, llama3)");
  llama3_rope_scaling s;
  auto num = [&](const char* key, double& out) {
    auto* v = r.find(*scaling, key);
    if (!v)
      r.fail(where + "." + key, "missing required field for llama3 rope scaling");
    out = r.number(*v, where + "." + key);
    if (!(out > 0))
      r.fail(where + "." + key, "must be positive");
  };
  num("factor", s.factor);
  num("low_freq_factor", s.low_freq_factor);
  num("high_freq_factor", s.high_freq_factor);
  auto* omp = r.find(*scaling, "original_max_position_embeddings");
  if (!omp)
    r.fail(where + ".original_max_position_embeddings", "missing required field");
  s.original_max_position_embeddings
    = r.positive(*omp, where + ".original_max_position_embeddings");
  if (!(s.high_freq_factor > s.low_freq_factor))
    r.fail(where + ".high_freq_factor", "must be greater than low_freq_factor");
  cfg.rope_scaling = s;
}

void parse_sliding(const field_reader& r, model_config& cfg) {
  cfg.layer_sliding.assign(size_t(cfg.num_layers), false);
  const json* window = r.find(r.doc(), "sliding_window");
  bool enabled = false;
  switch (cfg.arch) {
    case model_arch::llama:
      return; // Llama has no sliding window
    case model_arch::mistral:
      enabled = window != nullptr;
      if (enabled)
        cfg.layer_sliding.assign(size_t(cfg.num_layers), true);
      break;
    case model_arch::qwen2: {
      enabled = r.boolean("use_sliding_window", false) && window;
      if (!enabled)
        break;
      int32_t first = cfg.num_layers;
      if (auto* m = r.find(r.doc(), "max_window_layers")) {
        // Layers from this index on slide; a negative one would index
        // layer_sliding out of bounds, one past the last means none.
        auto v = r.integer(*m, "max_window_layers");
        if (v < 0)
          r.fail("max_window_layers", "must not be negative, got " + std::to_string(v));
        first = static_cast<int32_t>(std::min<int64_t>(v, cfg.num_layers));
      }
      for (int32_t i = first; i < cfg.num_layers; ++i)
        cfg.layer_sliding[size_t(i)] = true;
      break;
    }
  }
  if (auto* types = r.find(r.doc(), "layer_types")) {
    if (!types->is_array() || types->size() != size_t(cfg.num_layers))
      r.fail("layer_types", "expected an array with one entry per layer");
    for (size_t i = 0; i < types->size(); ++i) {
      auto t = r.string((*types)[i], "layer_types[" + std::to_string(i) + "]");
      if (t != "full_attention" && t != "sliding_attention")
        r.fail("layer_types[" + std::to_string(i) + "]", "unknown layer type '" + t + "'");
      cfg.layer_sliding[i] = t == "sliding_attention";
    }
    enabled = window != nullptr;
  }
  if (enabled)
    cfg.sliding_window = r.positive(*window, "sliding_window");
}

/// A token id: an integer that fits int32_t (a wider one would wrap to
/// another id, maybe a valid one).
int32_t parse_id(const field_reader& r, const json& v, const std::string& field) {
  auto x = r.integer(v, field);
  if (x < INT32_MIN || x > INT32_MAX)
    r.fail(field, "token id out of range: " + std::to_string(x));
  return static_cast<int32_t>(x);
}

std::vector<int32_t> parse_ids(const field_reader& r, const json& v, const std::string& field) {
  std::vector<int32_t> out;
  if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i)
      out.push_back(parse_id(r, v[i], field + "[" + std::to_string(i) + "]"));
  } else {
    out.push_back(parse_id(r, v, field));
  }
  return out;
}

} // namespace

model_config model_config::from_json(const json& doc, const std::string& file) {
  field_reader r(doc, file);
  model_config cfg;
  cfg.arch = parse_arch(r);
  if (auto* t = r.find(doc, "hidden_act"); t && r.string(*t, "hidden_act") != "silu")
    r.fail("hidden_act", "unsupported activation '" + t->get<std::string>() + "' (supported: silu)");
  if (r.boolean("mlp_bias", false))
    r.fail("mlp_bias", "MLP biases are not supported");
  cfg.vocab_size = r.required_positive("vocab_size");
  cfg.hidden_size = r.required_positive("hidden_size");
  cfg.intermediate_size = r.required_positive("intermediate_size");
  cfg.num_layers = r.required_positive("num_hidden_layers");
  cfg.num_heads = r.required_positive("num_attention_heads");
  cfg.num_kv_heads = r.has("num_key_value_heads") ? r.required_positive("num_key_value_heads")
                                                  : cfg.num_heads;
  if (cfg.num_heads % cfg.num_kv_heads != 0)
    r.fail("num_key_value_heads", "must divide num_attention_heads ("
                                      + std::to_string(cfg.num_heads) + ")");
  if (r.has("head_dim")) {
    cfg.head_dim = r.required_positive("head_dim");
  } else {
    if (cfg.hidden_size % cfg.num_heads != 0)
      r.fail("hidden_size", "must be a multiple of num_attention_heads when head_dim is absent");
    cfg.head_dim = cfg.hidden_size / cfg.num_heads;
  }
  if (cfg.head_dim % 2 != 0)
    r.fail("head_dim", "must be even for rotary embeddings");
  cfg.max_position_embeddings = r.has("max_position_embeddings")
                                  ? r.required_positive("max_position_embeddings")
                                  : 4096;
  if (auto* e = r.find(doc, "rms_norm_eps")) {
    cfg.rms_norm_eps = r.number(*e, "rms_norm_eps");
    if (!(cfg.rms_norm_eps > 0 && cfg.rms_norm_eps < 1))
      r.fail("rms_norm_eps", "must lie in (0, 1)");
  }
  parse_rope(r, cfg);
  cfg.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  switch (cfg.arch) {
    case model_arch::qwen2:
      cfg.qkv_bias = true;
      break;
    case model_arch::llama:
      cfg.qkv_bias = cfg.o_bias = r.boolean("attention_bias", false);
      break;
    case model_arch::mistral:
      break;
  }
  parse_sliding(r, cfg);
  if (auto* b = r.find(doc, "bos_token_id"))
    cfg.bos_token_id = parse_id(r, *b, "bos_token_id");
  if (auto* e = r.find(doc, "eos_token_id"))
    cfg.eos_token_ids = parse_ids(r, *e, "eos_token_id");
  for (auto id : cfg.eos_token_ids)
    if (id < 0 || id >= cfg.vocab_size)
      r.fail("eos_token_id", "id " + std::to_string(id) + " outside the vocabulary");
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (auto* d = r.find(doc, key)) {
      auto name = r.string(*d, key);
      cfg.declared_dtype = parse_torch_dtype(name);
      if (!cfg.declared_dtype)
        r.fail(key, "unsupported dtype '" + name + "' (supported: bfloat16, float16, float32)");
    }
  }
  if (auto* q = r.find(doc, "quantization_config"))
    cfg.quantization = quantization_config::from_json(*q, file);
  return cfg;
}

model_config model_config::load(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in)
    throw model_error(path.string(), "", "cannot open file");
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::exception& e) { // parse_error, or out_of_range for a number like 1e400
    throw model_error(path.string(), "", std::string("malformed JSON: ") + e.what());
  }
  return from_json(doc, path.string());
}

json model_config::to_json() const {
  json j;
  j["architectures"] = {std::string(architecture_name(arch))};
  switch (arch) {
    case model_arch::llama: j["model_type"] = "llama"; break;
    case model_arch::mistral: j["model_type"] = "mistral"; break;
    case model_arch::qwen2: j["model_type"] = "qwen2"; break;
  }
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_layers;
  j["num_attention_heads"] = num_heads;
  j["num_key_value_heads"] = num_kv_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  if (rope_scaling)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", rope_scaling->factor},
                         {"low_freq_factor", rope_scaling->low_freq_factor},
                         {"high_freq_factor", rope_scaling->high_freq_factor},
                         {"original_max_position_embeddings",
                          rope_scaling->original_max_position_embeddings}};
  else
    j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["initializer_range"] = 0.02;
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
  if (arch == model_arch::llama) {
    j["attention_bias"] = qkv_bias;
    j["mlp_bias"] = false;
  }
  if (arch == model_arch::mistral)
    j["sliding_window"] = sliding_window ? json(*sliding_window) : json(nullptr);
  if (arch == model_arch::qwen2) {
    j["use_sliding_window"] = sliding_window.has_value();
    j["sliding_window"] = sliding_window ? json(*sliding_window) : json(nullptr);
    int32_t first = num_layers;
    for (int32_t i = 0; i < num_layers; ++i)
      if (is_sliding(i)) {
        first = i;
        break;
      }
    j["max_window_layers"] = first;
  }
  if (bos_token_id)
    j["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() == 1)
    j["eos_token_id"] = eos_token_ids[0];
  else if (!eos_token_ids.empty())
    j["eos_token_id"] = eos_token_ids;
  j["torch_dtype"] = std::string(torch_dtype_name(declared_dtype.value_or(dtype::bf16)));
  if (quantization)
    j["quantization_config"] = quantization->to_json();
  return j;
}

std::vector<float> rope_inv_freq(const model_config& cfg) {
  const int32_t half = cfg.head_dim / 2;
  std::vector<float> out(static_cast<size_t>(half));
  for (int32_t i = 0; i < half; ++i) {
    // As Hugging Face: exponent 2i/d in float32, then base^-exponent.
    float exponent = float(2 * i) / float(cfg.head_dim);
    double inv = 1.0 / std::pow(cfg.rope_theta, double(exponent));
    if (cfg.rope_scaling) {
      const auto& s = *cfg.rope_scaling;
      double old_len = s.original_max_position_embeddings;
      double low_wavelen = old_len / s.low_freq_factor;
      double high_wavelen = old_len / s.high_freq_factor;
      double wavelen = 2 * std::numbers::pi / inv;
      if (wavelen > low_wavelen) {
        inv = inv / s.factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (old_len / wavelen - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
        inv = (1 - smooth) * inv / s.factor + smooth * inv;
      }
    }
    out[size_t(i)] = static_cast<float>(inv);
  }
  return out;
}

} // namespace metronome
