#include "model/model_weights.hpp"

#include <set>

#include "model/model_error.hpp"

namespace metronome {

namespace fs = std::filesystem;

namespace {

/// Binds names while recording which tensors were used.
class binder {
public:
  explicit binder(const tensor_store& store) : store_(store) {}

  const tensor_view* need(const std::string& name, std::vector<int64_t> shape) {
    const auto* t = store_.find(name);
    if (!t)
      throw model_error(first_file(), name, "missing tensor (expected shape "
                                              + shape_text(shape) + ")");
    check(*t, shape);
    used_.insert(name);
    return t;
  }

  /// Marks a tensor that may be present and is ignored.
  void tolerate(const std::string& name) {
    used_.insert(name);
  }

  void check(const tensor_view& t, const std::vector<int64_t>& shape) {
    if (t.shape != shape)
      throw model_error(t.file, t.name, "wrong shape " + t.shape_string() + ", expected "
                                          + shape_text(shape));
    if (!type_) {
      type_ = t.type;
      type_source_ = t.name;
    } else if (t.type != *type_) {
      throw model_error(t.file, t.name, "wrong dtype " + std::string(dtype_name(t.type))
                                          + ": the model's other tensors are "
                                          + std::string(dtype_name(*type_)) + " (e.g. "
                                          + type_source_ + ")");
    }
  }

  void reject_unexpected() const {
    for (const auto& [name, t] : store_.tensors())
      if (!used_.contains(name) && !name.ends_with("rotary_emb.inv_freq"))
        throw model_error(t.file, name, "unexpected tensor: not part of this architecture");
  }

  dtype type() const {
    return type_.value_or(dtype::bf16);
  }

private:
  std::string first_file() const {
    auto files = store_.files();
    return files.empty() ? std::string("<no file>") : files.front();
  }

  static std::string shape_text(const std::vector<int64_t>& s) {
    tensor_view v;
    v.shape = s;
    return v.shape_string();
  }

  const tensor_store& store_;
  std::set<std::string> used_;
  std::optional<dtype> type_;
  std::string type_source_;
};

} // namespace

model_weights model_weights::bind(const model_config& cfg, const tensor_store& store) {
  binder b(store);
  model_weights w;
  const int64_t h = cfg.hidden_size, q = cfg.q_size(), kv = cfg.kv_size();
  const int64_t inter = cfg.intermediate_size, vocab = cfg.vocab_size;
  w.embed = b.need("model.embed_tokens.weight", {vocab, h});
  for (int32_t i = 0; i < cfg.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    layer_weights l;
    l.attn_norm = b.need(p + "input_layernorm.weight", {h});
    l.q = b.need(p + "self_attn.q_proj.weight", {q, h});
    l.k = b.need(p + "self_attn.k_proj.weight", {kv, h});
    l.v = b.need(p + "self_attn.v_proj.weight", {kv, h});
    if (cfg.qkv_bias) {
      l.q_bias = b.need(p + "self_attn.q_proj.bias", {q});
      l.k_bias = b.need(p + "self_attn.k_proj.bias", {kv});
      l.v_bias = b.need(p + "self_attn.v_proj.bias", {kv});
    }
    l.o = b.need(p + "self_attn.o_proj.weight", {h, q});
    if (cfg.o_bias)
      l.o_bias = b.need(p + "self_attn.o_proj.bias", {h});
    l.mlp_norm = b.need(p + "post_attention_layernorm.weight", {h});
    l.gate = b.need(p + "mlp.gate_proj.weight", {inter, h});
    l.up = b.need(p + "mlp.up_proj.weight", {inter, h});
    l.down = b.need(p + "mlp.down_proj.weight", {h, inter});
    w.layers.push_back(l);
  }
  w.final_norm = b.need("model.norm.weight", {h});
  if (cfg.tie_word_embeddings) {
    w.lm_head = w.embed;
    if (const auto* t = store.find("lm_head.weight")) { // some exports keep the copy
      b.check(*t, {vocab, h});
      b.tolerate("lm_head.weight");
    }
  } else {
    w.lm_head = b.need("lm_head.weight", {vocab, h});
  }
  b.reject_unexpected();
  w.type = b.type();
  return w;
}

std::shared_ptr<const model_folder> model_folder::open(const fs::path& dir) {
  if (!fs::is_directory(dir))
    throw model_error(dir.string(), "", "not a directory");
  auto m = std::make_shared<model_folder>();
  m->dir = dir;
  m->config = model_config::load(dir / "config.json");
  m->store = std::make_unique<tensor_store>(tensor_store::open_folder(dir));
  m->weights = model_weights::bind(m->config, *m->store);
  return m;
}

} // namespace metronome
