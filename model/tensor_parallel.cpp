#include "model/tensor_parallel.hpp"

#include <cstring>
#include <deque>

#include "model/dtype.hpp"
#include "model/model_error.hpp"

namespace metronome {

namespace {

// 4-bit weights pack 8 values per int32 (AWQ along outputs, GPTQ along
// inputs): a slice must not cut a word.
constexpr int64_t pack_values = 8;

std::string str(int64_t v) {
  return std::to_string(v);
}

} // namespace

split_kind split_of(projection p) {
  return p == projection::o || p == projection::down ? split_kind::row_parallel
                                                     : split_kind::column_parallel;
}

index_range rank_shard::rows(projection p) const {
  switch (p) {
    case projection::q:
      return {q_heads.begin * head_dim_, q_heads.end * head_dim_};
    case projection::k:
    case projection::v:
      return {kv_heads.begin * head_dim_, kv_heads.end * head_dim_};
    case projection::gate:
    case projection::up:
      return intermediate;
    case projection::o:
    case projection::down:
      break;
  }
  return {0, hidden_};
}

index_range rank_shard::cols(projection p) const {
  switch (p) {
    case projection::o:
      return {q_heads.begin * head_dim_, q_heads.end * head_dim_};
    case projection::down:
      return intermediate;
    default:
      break;
  }
  return {0, hidden_};
}

const std::vector<all_reduce_point>& tensor_parallel_plan::layer_all_reduces() {
  static const std::vector<all_reduce_point> points{all_reduce_point::after_o_proj,
                                                    all_reduce_point::after_down_proj};
  return points;
}

tensor_parallel_plan::tensor_parallel_plan(const model_config& cfg, int32_t ranks,
                                           const std::string& file)
  : cfg_(cfg) {
  const int64_t n = ranks;
  if (n < 1)
    throw model_error("--tensor-parallel", "", "must be at least 1 (got " + str(n) + ")");
  const std::string flag = "--tensor-parallel " + str(n);
  auto refuse = [&](const std::string& field, int64_t value, const std::string& why) {
    throw model_error(file, field, str(value) + " " + why);
  };
  if (cfg.num_heads % n != 0)
    refuse("num_attention_heads", cfg.num_heads, "is not divisible by " + flag);
  if (cfg.num_kv_heads % n == 0)
    kv_layout_ = kv_head_layout::split;
  else if (n % cfg.num_kv_heads == 0)
    kv_layout_ = kv_head_layout::replicated;
  else
    refuse("num_key_value_heads", cfg.num_kv_heads,
           "is neither divisible by " + flag + " nor a divisor of it");
  if (cfg.intermediate_size % n != 0)
    refuse("intermediate_size", cfg.intermediate_size, "is not divisible by " + flag);

  const int64_t heads = cfg.num_heads / n;
  const int64_t kv_heads = kv_layout_ == kv_head_layout::split ? cfg.num_kv_heads / n : 1;
  const int64_t inter = cfg.intermediate_size / n;

  if (cfg.quantization && n > 1) {
    // Each rank holds whole words and whole groups of the 4-bit layout, so
    // its slice is itself a valid 4-bit tensor with its own scales.
    const auto& q = *cfg.quantization;
    const std::string field = "quantization_config";
    if (q.desc_act)
      throw model_error(file, field + ".desc_act",
                        "act-order (g_idx) weights are not split by " + flag + " yet");
    if (heads * cfg.head_dim % pack_values != 0 || kv_heads * cfg.head_dim % pack_values != 0)
      refuse("head_dim", cfg.head_dim,
             "gives per-rank q/k/v slices that are not whole words of 8 4-bit values with "
               + flag);
    if (inter % pack_values != 0)
      refuse("intermediate_size", cfg.intermediate_size,
             "gives per-rank slices of " + str(inter)
               + ", not whole words of 8 4-bit values, with " + flag);
    if (q.group_size > 0 && (heads * cfg.head_dim % q.group_size != 0
                             || inter % q.group_size != 0))
      throw model_error(file, field + ".group_size",
                        str(q.group_size) + " does not divide the per-rank "
                          "inputs of o_proj (" + str(heads * cfg.head_dim) + ") and down_proj ("
                          + str(inter) + ") with " + flag);
  }

  rank_config_ = cfg;
  rank_config_.num_heads = int32_t(heads);
  rank_config_.num_kv_heads = int32_t(kv_heads);
  rank_config_.intermediate_size = int32_t(inter);

  // Under replication, group / (heads per rank) ranks share a kv head.
  const int64_t group = cfg.gqa_group();
  shards_.resize(size_t(n));
  for (int64_t r = 0; r < n; ++r) {
    rank_shard& s = shards_[size_t(r)];
    s.rank = int32_t(r);
    s.q_heads = {r * heads, (r + 1) * heads};
    s.kv_heads = kv_layout_ == kv_head_layout::split
                   ? index_range{r * kv_heads, (r + 1) * kv_heads}
                   : index_range{r * heads / group, r * heads / group + 1};
    s.intermediate = {r * inter, (r + 1) * inter};
    s.head_dim_ = cfg.head_dim;
    s.hidden_ = cfg.hidden_size;
  }
}

std::string tensor_parallel_plan::describe() const {
  std::string out = "tensor parallel " + str(ranks()) + ": " + str(rank_config_.num_heads)
                    + " of " + str(cfg_.num_heads) + " query heads, "
                    + str(rank_config_.num_kv_heads) + " of " + str(cfg_.num_kv_heads)
                    + " kv heads";
  if (kv_layout_ == kv_head_layout::replicated)
    out += " (replicated " + str(ranks() / cfg_.num_kv_heads) + "x)";
  out += ", " + str(rank_config_.intermediate_size) + " of " + str(cfg_.intermediate_size)
         + " intermediate per rank";
  return out;
}

namespace {

/// The slices of one rank and their views (stable addresses: deques).
struct shard_storage {
  std::deque<std::vector<std::byte>> data;
  std::deque<tensor_view> views;

  const tensor_view* add(const tensor_view& like, std::vector<int64_t> shape,
                         std::vector<std::byte> bytes) {
    tensor_view& v = views.emplace_back();
    v.name = like.name;
    v.type = like.type;
    v.shape = std::move(shape);
    v.file = like.file;
    auto& d = data.emplace_back(std::move(bytes));
    v.data = d.data();
    v.nbytes = d.size();
    return &v;
  }

  /// Rows x cols of the row-major 2-D `w`, in its own type.
  const tensor_view* slice(const tensor_view& w, index_range rows, index_range cols) {
    const size_t es = dtype_size(w.type), in = size_t(w.shape.at(1));
    std::vector<std::byte> out(size_t(rows.size()) * size_t(cols.size()) * es);
    std::byte* at = out.data();
    for (int64_t r = rows.begin; r < rows.end; ++r) {
      std::memcpy(at, w.data + (size_t(r) * in + size_t(cols.begin)) * es,
                  size_t(cols.size()) * es);
      at += size_t(cols.size()) * es;
    }
    return add(w, {rows.size(), cols.size()}, std::move(out));
  }

  /// Elements `range` of the 1-D `b`; null for a null `b`.
  const tensor_view* slice(const tensor_view* b, index_range range) {
    if (!b)
      return nullptr;
    const size_t es = dtype_size(b->type);
    std::vector<std::byte> out(size_t(range.size()) * es);
    std::memcpy(out.data(), b->data + size_t(range.begin) * es, out.size());
    return add(*b, {range.size()}, std::move(out));
  }

  /// Elements `range` of the 1-D I32 `g` (a g_idx), each minus `first`:
  /// the groups renumbered from the slice's first.
  const tensor_view* slice_groups(const tensor_view& g, index_range range, int64_t first) {
    std::vector<std::byte> out(size_t(range.size()) * 4);
    for (int64_t i = 0; i < range.size(); ++i) {
      int32_t v;
      std::memcpy(&v, g.data + size_t(range.begin + i) * 4, 4);
      v -= int32_t(first);
      std::memcpy(out.data() + size_t(i) * 4, &v, 4);
    }
    return add(g, {range.size()}, std::move(out));
  }

  /// Outputs `rows` and inputs `cols` of the 4-bit projection `q`, as the
  /// same layout: GPTQ packs 8 inputs a word ([in / 8, out]), AWQ 8 outputs
  /// ([in, out / 8]); zeros pack 8 outputs a word ([groups, out / 8]),
  /// scales not ([groups, out]). The plan keeps both ranges whole words and
  /// an input slice whole groups, so every cut falls between words and
  /// groups and AWQ's interleave (within a word) is untouched.
  quantized_linear slice(const quantization_config& qc, const quantized_linear& q,
                         index_range rows, index_range cols) {
    const int64_t gs = qc.group_size < 0 ? q.in_features : qc.group_size;
    const index_range groups{cols.begin / gs, (cols.end + gs - 1) / gs};
    const index_range words{rows.begin / 8, rows.end / 8};
    quantized_linear r;
    r.qweight = qc.method == quant_method::gptq
                  ? slice(*q.qweight, {cols.begin / 8, cols.end / 8}, rows)
                  : slice(*q.qweight, cols, words);
    r.qzeros = slice(*q.qzeros, groups, words);
    r.scales = slice(*q.scales, groups, rows);
    r.g_idx = q.g_idx ? slice_groups(*q.g_idx, cols, groups.begin) : nullptr;
    r.in_features = cols.size();
    r.out_features = rows.size();
    return r;
  }

  /// A zero tensor shaped as `b` (null for a null `b`).
  const tensor_view* zeros(const tensor_view* b) {
    if (!b)
      return nullptr;
    return add(*b, b->shape, std::vector<std::byte>(b->nbytes));
  }
};

} // namespace

std::shared_ptr<const model_folder> shard_model(std::shared_ptr<const model_folder> full,
                                                const tensor_parallel_plan& plan, int32_t rank) {
  if (!full)
    throw std::invalid_argument("shard_model: no model");
  if (rank < 0 || rank >= plan.ranks())
    throw std::invalid_argument("shard_model: rank " + str(rank) + " of "
                                + str(plan.ranks()));
  auto shard = std::make_shared<model_folder>();
  auto storage = std::make_shared<shard_storage>();
  shard->dir = full->dir;
  shard->config = plan.rank_config();
  shard->weights.type = full->weights.type;
  shard->weights.quantized = full->weights.quantized;
  shard->quantized_at_load = full->quantized_at_load;
  shard->weights.embed = full->weights.embed;
  shard->weights.final_norm = full->weights.final_norm;
  shard->weights.lm_head = full->weights.lm_head;
  const rank_shard& s = plan.shard(rank);
  for (const layer_weights& w : full->weights.layers) {
    layer_weights& mine = shard->weights.layers.emplace_back();
    mine.attn_norm = w.attn_norm;
    mine.mlp_norm = w.mlp_norm;
    for (projection p : {projection::q, projection::k, projection::v, projection::o,
                         projection::gate, projection::up, projection::down}) {
      if (const quantized_linear& q = w.quantized[size_t(p)]; q.present())
        mine.quantized[size_t(p)] =
          storage->slice(*full->config.quantization, q, s.rows(p), s.cols(p));
      else
        mine.weight(p) = storage->slice(*w.weight(p), s.rows(p), s.cols(p));
    }
    mine.q_bias = storage->slice(w.q_bias, s.rows(projection::q));
    mine.k_bias = storage->slice(w.k_bias, s.rows(projection::k));
    mine.v_bias = storage->slice(w.v_bias, s.rows(projection::v));
    mine.o_bias = rank == plan.bias_rank() ? w.o_bias : storage->zeros(w.o_bias);
  }
  shard->held.push_back(full);
  shard->held.push_back(storage);
  return shard;
}

} // namespace metronome
