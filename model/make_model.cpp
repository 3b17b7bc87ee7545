#include "model/make_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "model/model_card.hpp"
#include "model/model_error.hpp"
#include "model/parallel.hpp"
#include "model/random.hpp"
#include "model/rtn_quantize.hpp"
#include "model/safetensors.hpp"

namespace metronome {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

model_config llama3_base() {
  model_config c;
  c.arch = model_arch::llama;
  c.vocab_size = 128256;
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 131072;
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001, 128008, 128009};
  c.rope_scaling = llama3_rope_scaling{32.0, 1.0, 4.0, 8192};
  return c;
}

void finish(model_config& c) {
  c.layer_sliding.assign(size_t(c.num_layers), c.sliding_window.has_value());
  c.declared_dtype = dtype::bf16;
}

} // namespace

std::vector<std::string> model_presets() {
  return {"tiny-llama3", "tiny-llama3-g128", "tiny-qwen2", "tiny-mistral", "llama3-1b",
          "llama3-8b"};
}

std::optional<model_config> preset_config(const std::string& name) {
  model_config c;
  if (name == "tiny-llama3") {
    // Llama 3.2 in miniature: tied embeddings, GQA 2, llama3 rope scaling
    // with a short original context so all three frequency bands occur.
    c = llama3_base();
    c.hidden_size = 64;
    c.intermediate_size = 192;
    c.num_layers = 4;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.max_position_embeddings = 4096;
    c.rope_scaling = llama3_rope_scaling{8.0, 1.0, 4.0, 256};
    c.tie_word_embeddings = true;
  } else if (name == "tiny-llama3-g128") {
    // tiny-llama3 widened so that every projection's input (hidden 128,
    // q 128, intermediate 384) is a multiple of 128: the int4 group size of
    // --quantize int4 and make-model --quantize (docs/quantization.md).
    c = llama3_base();
    c.hidden_size = 128;
    c.intermediate_size = 384;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 32;
    c.max_position_embeddings = 4096;
    c.rope_scaling = llama3_rope_scaling{8.0, 1.0, 4.0, 256};
    c.tie_word_embeddings = true;
  } else if (name == "tiny-qwen2") {
    // Qwen2 in miniature: q/k/v biases, tied embeddings, rope theta 1e6.
    c.arch = model_arch::qwen2;
    c.vocab_size = 151936;
    c.hidden_size = 64;
    c.intermediate_size = 160;
    c.num_layers = 3;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.max_position_embeddings = 32768;
    c.rope_theta = 1000000.0;
    c.rms_norm_eps = 1e-6;
    c.qkv_bias = true;
    c.tie_word_embeddings = true;
    c.bos_token_id = 151643;
    c.eos_token_ids = {151645};
  } else if (name == "tiny-mistral") {
    // Mistral in miniature: separate LM head, multi-query attention (4:1), a
    // sliding window short enough for the golden prompts to cross it.
    c.arch = model_arch::mistral;
    c.vocab_size = 32000;
    c.hidden_size = 64;
    c.intermediate_size = 224;
    c.num_layers = 3;
    c.num_heads = 4;
    c.num_kv_heads = 1;
    c.head_dim = 16;
    c.max_position_embeddings = 32768;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-5;
    c.sliding_window = 16;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
  } else if (name == "llama3-1b") {
    // The shape of Llama-3.2-1B.
    c = llama3_base();
    c.hidden_size = 2048;
    c.intermediate_size = 8192;
    c.num_layers = 16;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 64;
    c.tie_word_embeddings = true;
  } else if (name == "llama3-8b") {
    // The shape of Llama-3.1-8B.
    c = llama3_base();
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_layers = 32;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.rope_scaling = llama3_rope_scaling{8.0, 1.0, 4.0, 8192};
  } else {
    return std::nullopt;
  }
  finish(c);
  return c;
}

namespace {

/// How one tensor's elements are drawn: uniform in [center - a, center + a].
struct init_rule {
  float center = 0.0f;
  float half_width = 0.0f;
};

init_rule rule_for(const std::string& name, const model_config& c) {
  const float sqrt3 = 1.7320508f;
  auto uniform_std = [&](double std) { return init_rule{0.0f, float(std * sqrt3)}; };
  const double residual = 1.0 / std::sqrt(2.0 * c.num_layers);
  if (name.ends_with("norm.weight"))
    return {1.0f, 0.2f};
  if (name.ends_with(".bias"))
    return {0.0f, 0.1f};
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight")
    return uniform_std(1.0 / std::sqrt(double(c.hidden_size)));
  if (name.ends_with("o_proj.weight"))
    return uniform_std(residual / std::sqrt(double(c.q_size())));
  if (name.ends_with("down_proj.weight"))
    return uniform_std(residual / std::sqrt(double(c.intermediate_size)));
  return uniform_std(1.0 / std::sqrt(double(c.hidden_size))); // q, k, v, gate, up
}

std::vector<std::pair<std::string, std::vector<int64_t>>> tensor_shapes(const model_config& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), f = c.intermediate_size;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out.push_back({p + "input_layernorm.weight", {h}});
    out.push_back({p + "self_attn.q_proj.weight", {q, h}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    if (c.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {q}});
      out.push_back({p + "self_attn.k_proj.bias", {kv}});
      out.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    out.push_back({p + "self_attn.o_proj.weight", {h, q}});
    if (c.o_bias)
      out.push_back({p + "self_attn.o_proj.bias", {h}});
    out.push_back({p + "post_attention_layernorm.weight", {h}});
    out.push_back({p + "mlp.gate_proj.weight", {f, h}});
    out.push_back({p + "mlp.up_proj.weight", {f, h}});
    out.push_back({p + "mlp.down_proj.weight", {h, f}});
  }
  out.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings)
    out.push_back({"lm_head.weight", {c.vocab_size, h}});
  return out;
}

safetensors_writer::fill_fn make_fill(uint64_t stream, init_rule rule, dtype type) {
  return [=](size_t first, std::span<std::byte> out) {
    const size_t esz = dtype_size(type);
    const int64_t n = int64_t(out.size() / esz);
    parallel_for(0, (n + 1023) / 1024, 64, [&](int64_t b0, int64_t b1) {
      float buf[1024];
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t lo = b * 1024, hi = std::min<int64_t>(n, lo + 1024);
        for (int64_t i = lo; i < hi; ++i) {
          const float u = random_unit(stream, uint64_t(first) + uint64_t(i)); // [0, 1)
          buf[i - lo] = rule.center + (2.0f * u - 1.0f) * rule.half_width;
        }
        from_f32(type, buf, out.data() + size_t(lo) * esz, size_t(hi - lo));
      }
    });
  };
}

/// Whether `name` is a decoder projection's weight (q, k, v, o, gate, up,
/// down): what make_model_options::quantize packs.
bool is_projection(const std::string& name) {
  for (const char* p : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                        "gate_proj.weight", "up_proj.weight", "down_proj.weight"})
    if (name.ends_with(std::string(".") + p))
      return true;
  return false;
}

void write_json(const fs::path& path, const json& doc) {
  std::ofstream out(path, std::ios::trunc);
  out << doc.dump(2) << "\n";
  if (!out)
    throw model_error(path.string(), "", "cannot write file");
}

int64_t tokenizer_max_id(const fs::path& file) {
  std::ifstream in(file);
  if (!in)
    throw model_error(file.string(), "", "cannot open file");
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::exception& e) { // parse_error, or out_of_range for a number like 1e400
    throw model_error(file.string(), "", std::string("malformed JSON: ") + e.what());
  }
  int64_t max_id = -1;
  if (doc.contains("model") && doc["model"].contains("vocab") && doc["model"]["vocab"].is_object())
    for (const auto& [_, id] : doc["model"]["vocab"].items())
      if (id.is_number_integer())
        max_id = std::max(max_id, id.get<int64_t>());
  if (doc.contains("added_tokens") && doc["added_tokens"].is_array())
    for (const auto& t : doc["added_tokens"])
      if (t.contains("id") && t["id"].is_number_integer())
        max_id = std::max(max_id, t["id"].get<int64_t>());
  return max_id;
}

} // namespace

void make_model(const make_model_options& o) {
  const auto& c = o.config;
  // The 4-bit projections first, from the same values the float folder
  // holds: a shape that does not fit the layout is refused before any file
  // is written.
  std::map<std::string, std::shared_ptr<const packed_linear>> packed;
  if (o.quantize) {
    for (const auto& [name, shape] : tensor_shapes(c)) {
      if (!is_projection(name))
        continue;
      const int64_t out = shape[0], in = shape[1];
      std::vector<std::byte> raw(size_t(out * in) * dtype_size(o.weight_type));
      make_fill(mix64(o.seed) ^ hash_name(name), rule_for(name, c), o.weight_type)(0, raw);
      std::vector<float> w(size_t(out * in));
      to_f32(o.weight_type, raw.data(), w.data(), w.size());
      raw = {};
      const std::string prefix = name.substr(0, name.size() - 6); // "weight"
      packed[name] = rtn_quantize(*o.quantize, w.data(), out, in, name, prefix,
                                  (o.out_dir / "model.safetensors").string());
    }
  }
  fs::create_directories(o.out_dir);
  if (o.tokenizer_dir) {
    auto tok = *o.tokenizer_dir / "tokenizer.json";
    if (!fs::exists(tok))
      throw model_error(tok.string(), "", "no tokenizer.json in the tokenizer folder");
    auto max_id = tokenizer_max_id(tok);
    if (max_id >= c.vocab_size)
      throw model_error(tok.string(), "", "token id " + std::to_string(max_id)
                                            + " does not fit vocab_size "
                                            + std::to_string(c.vocab_size));
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
      if (fs::exists(*o.tokenizer_dir / f)) {
        fs::copy_file(*o.tokenizer_dir / f, o.out_dir / f, fs::copy_options::overwrite_existing);
        fs::permissions(o.out_dir / f, fs::perms::owner_read | fs::perms::owner_write,
                        fs::perm_options::add);
      }
  }
  model_config written = c;
  written.quantization = o.quantize;
  auto config_json = written.to_json();
  config_json["torch_dtype"] = std::string(torch_dtype_name(o.weight_type));
  write_json(o.out_dir / "config.json", config_json);
  json gen = {{"_from_model_config", true}};
  if (c.bos_token_id)
    gen["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_ids.size() == 1)
    gen["eos_token_id"] = c.eos_token_ids[0];
  else if (!c.eos_token_ids.empty())
    gen["eos_token_id"] = c.eos_token_ids;
  write_json(o.out_dir / "generation_config.json", gen);
  // Says what the folder is wherever Metronome shows a model (model_card.hpp).
  std::string description = "random weights (metronome make-model, seed " + std::to_string(o.seed);
  if (o.quantize)
    description += "; projections int4 by round to nearest: " + o.quantize->describe();
  write_json(o.out_dir / model_card_file,
             {{"description", description + "): not a trained model, its text is noise"}});

  // Every tensor to write: the float ones drawn at write time, the 4-bit
  // ones copied from `packed`.
  struct entry {
    std::string name;
    dtype type;
    std::vector<int64_t> shape;
    safetensors_writer::fill_fn fill;
  };
  std::vector<entry> entries;
  for (const auto& [name, shape] : tensor_shapes(c)) {
    auto q = packed.find(name);
    if (q == packed.end()) {
      auto stream = mix64(o.seed) ^ hash_name(name);
      entries.push_back({name, o.weight_type, shape,
                         make_fill(stream, rule_for(name, c), o.weight_type)});
      continue;
    }
    const auto p = q->second;
    for (const tensor_view* v : {&p->qweight_view, &p->qzeros_view, &p->scales_view,
                                 &p->g_idx_view}) {
      if (!v->data)
        continue; // AWQ: no g_idx
      entries.push_back({v->name, v->type, v->shape,
                         [p, v](size_t first, std::span<std::byte> out) {
                           std::memcpy(out.data(), v->data + first * dtype_size(v->type),
                                       out.size());
                         }});
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const entry& a, const entry& b) { return a.name < b.name; });
  // Assign tensors (in name order) to shards of at most max_shard_bytes.
  std::vector<safetensors_writer> shards(1);
  uint64_t total = 0;
  for (auto& e : entries) {
    uint64_t bytes = dtype_size(e.type);
    for (auto d : e.shape)
      bytes *= uint64_t(d);
    if (o.max_shard_bytes > 0 && shards.back().data_bytes() > 0
        && shards.back().data_bytes() + bytes > o.max_shard_bytes)
      shards.emplace_back();
    shards.back().add(e.name, e.type, e.shape, std::move(e.fill));
    total += bytes;
  }
  for (const auto& old : {"model.safetensors", "model.safetensors.index.json"})
    fs::remove(o.out_dir / old);
  if (shards.size() == 1) {
    shards[0].write(o.out_dir / "model.safetensors");
    return;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", json::object()}};
  char buf[64];
  for (size_t i = 0; i < shards.size(); ++i) {
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    shards[i].write(o.out_dir / buf);
    for (const auto& name : shards[i].names())
      index["weight_map"][name] = buf;
  }
  write_json(o.out_dir / "model.safetensors.index.json", index);
}

} // namespace metronome
