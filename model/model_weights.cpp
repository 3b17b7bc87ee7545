#include "model/model_weights.hpp"

#include <cctype>
#include <set>

#include "model/model_error.hpp"
#include "model/rtn_quantize.hpp"

namespace metronome {

namespace fs = std::filesystem;

namespace {

/// Binds names while recording which tensors were used.
class binder {
public:
  explicit binder(const tensor_store& store) : store_(store) {}

  /// How a tensor's dtype is checked.
  enum class kind {
    model_float, ///< a float type, the same for all such tensors (the model's dtype)
    any_float,   ///< any float type (biases of quantized projections)
    exact,       ///< exactly the dtype given (the 4-bit layouts' tensors)
  };

  const tensor_view* need(const std::string& name, std::vector<int64_t> shape,
                          kind k = kind::model_float, dtype exact = dtype::f32) {
    const auto* t = store_.find(name);
    if (!t)
      throw model_error(first_file(), name, "missing tensor (expected shape "
                                              + shape_text(shape) + ")");
    if (k == kind::model_float) {
      check(*t, shape);
    } else {
      check_shape(*t, shape);
      if (k == kind::exact && t->type != exact)
        throw model_error(t->file, t->name, "wrong dtype " + std::string(dtype_name(t->type))
                                              + ", expected " + std::string(dtype_name(exact)));
      if (k == kind::any_float)
        check_float(*t);
    }
    used_.insert(name);
    return t;
  }

  /// Marks a tensor that may be present and is ignored.
  void tolerate(const std::string& name) {
    used_.insert(name);
  }

  static void check_shape(const tensor_view& t, const std::vector<int64_t>& shape) {
    if (t.shape != shape)
      throw model_error(t.file, t.name, "wrong shape " + t.shape_string() + ", expected "
                                          + shape_text(shape));
  }

  static void check_float(const tensor_view& t) {
    if (!is_float(t.type))
      throw model_error(t.file, t.name, "wrong dtype " + std::string(dtype_name(t.type))
                                          + ": expected a float tensor (F32, F16 or BF16)");
  }

  void check(const tensor_view& t, const std::vector<int64_t>& shape) {
    check_shape(t, shape);
    check_float(t);
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
      if (!used_.contains(name) && !name.ends_with("rotary_emb.inv_freq")) {
        for (const char* part : {".qweight", ".qzeros", ".scales", ".g_idx"})
          if (name.ends_with(part))
            throw model_error(t.file, name, "unexpected 4-bit tensor: only the q, k, v, o, "
                                            "gate, up and down projections may be quantized");
        throw model_error(t.file, name, "unexpected tensor: not part of this architecture");
      }
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

/// Binds projection `p` of layer `l`, named `prefix` + weight or qweight ...:
/// quantized where its qweight is stored, plain otherwise.
void bind_projection(binder& b, const model_config& cfg, const tensor_store& store,
                     layer_weights& l, projection p, const std::string& prefix, int64_t out,
                     int64_t in) {
  const tensor_view* qweight = store.find(prefix + "qweight");
  if (!qweight) {
    l.weight(p) = b.need(prefix + "weight", {out, in});
    return;
  }
  if (!cfg.quantization)
    throw model_error(qweight->file, qweight->name,
                      "a 4-bit tensor, but config.json has no quantization_config");
  if (const tensor_view* plain = store.find(prefix + "weight"))
    throw model_error(plain->file, plain->name,
                      "a float weight beside " + prefix + "qweight: the projection is stored twice");
  const auto& q = *cfg.quantization;
  if (in % 8 != 0 || out % 8 != 0)
    throw model_error(qweight->file, qweight->name,
                      "4-bit packing needs in and out features that are multiples of 8 (this "
                      "projection: " + std::to_string(out) + " x " + std::to_string(in) + ")");
  const auto shapes = expected_shapes(q, in, out);
  using k = binder::kind;
  quantized_linear ql;
  ql.in_features = in;
  ql.out_features = out;
  ql.qweight = b.need(prefix + "qweight", shapes.qweight, k::exact, dtype::i32);
  ql.qzeros = b.need(prefix + "qzeros", shapes.qzeros, k::exact, dtype::i32);
  ql.scales = b.need(prefix + "scales", shapes.scales, k::exact, dtype::f16);
  // AWQ has no g_idx (one there is reported as unexpected); GPTQ needs it for
  // act-order and may omit it otherwise.
  if (q.method == quant_method::gptq && (q.desc_act || store.find(prefix + "g_idx")))
    ql.g_idx = b.need(prefix + "g_idx", shapes.g_idx, k::exact, dtype::i32);
  check_group_index(q, ql);
  l.quantized[size_t(p)] = ql;
}

} // namespace

const tensor_view*& layer_weights::weight(projection p) {
  switch (p) {
    case projection::q: return q;
    case projection::k: return k;
    case projection::v: return v;
    case projection::o: return o;
    case projection::gate: return gate;
    case projection::up: return up;
    case projection::down: break;
  }
  return down;
}

const tensor_view* layer_weights::weight(projection p) const {
  return const_cast<layer_weights*>(this)->weight(p);
}

model_weights model_weights::bind(const model_config& cfg, const tensor_store& store) {
  binder b(store);
  model_weights w;
  const int64_t h = cfg.hidden_size, q = cfg.q_size(), kv = cfg.kv_size();
  const int64_t inter = cfg.intermediate_size, vocab = cfg.vocab_size;
  w.embed = b.need("model.embed_tokens.weight", {vocab, h});
  for (int32_t i = 0; i < cfg.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    layer_weights l;
    auto proj = [&](projection which, const char* name, int64_t out, int64_t in) {
      bind_projection(b, cfg, store, l, which, p + name + ".", out, in);
    };
    // A quantized projection's bias is stored in the layout's float type
    // (F16), whatever the rest of the model is.
    auto bias = [&](projection which, const char* name, int64_t out) {
      return b.need(p + name + ".bias", {out},
                    l.quantized[size_t(which)].present() ? binder::kind::any_float
                                                         : binder::kind::model_float);
    };
    l.attn_norm = b.need(p + "input_layernorm.weight", {h});
    proj(projection::q, "self_attn.q_proj", q, h);
    proj(projection::k, "self_attn.k_proj", kv, h);
    proj(projection::v, "self_attn.v_proj", kv, h);
    if (cfg.qkv_bias) {
      l.q_bias = bias(projection::q, "self_attn.q_proj", q);
      l.k_bias = bias(projection::k, "self_attn.k_proj", kv);
      l.v_bias = bias(projection::v, "self_attn.v_proj", kv);
    }
    proj(projection::o, "self_attn.o_proj", h, q);
    if (cfg.o_bias)
      l.o_bias = bias(projection::o, "self_attn.o_proj", h);
    l.mlp_norm = b.need(p + "post_attention_layernorm.weight", {h});
    proj(projection::gate, "mlp.gate_proj", inter, h);
    proj(projection::up, "mlp.up_proj", inter, h);
    proj(projection::down, "mlp.down_proj", h, inter);
    for (const auto& ql : l.quantized)
      w.quantized = w.quantized || ql.present();
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

std::string model_folder::weights_description() const {
  std::string float_type(dtype_name(weights.type)); // "BF16" -> "bf16"
  for (auto& ch : float_type)
    ch = char(std::tolower(static_cast<unsigned char>(ch)));
  if (!weights.quantized)
    return float_type;
  std::string s = "int4 (";
  if (quantized_at_load)
    s += "RTN at load: ";
  s += config.quantization ? config.quantization->describe() : std::string("?");
  return s + "; " + float_type + " embeddings, norms and LM head)";
}

std::shared_ptr<const model_folder> model_folder::open(const fs::path& dir,
                                                       const model_load_options& options) {
  if (!fs::is_directory(dir))
    throw model_error(dir.string(), "", "not a directory");
  auto m = std::make_shared<model_folder>();
  m->dir = dir;
  m->config = model_config::load(dir / "config.json");
  m->store = std::make_unique<tensor_store>(tensor_store::open_folder(dir));
  m->weights = model_weights::bind(m->config, *m->store);
  if (options.quantize == weight_quantization::int4)
    quantize_projections(*m, rtn_config(options.int4_layout, 128));
  return m;
}

} // namespace metronome
