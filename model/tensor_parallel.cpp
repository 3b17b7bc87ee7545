#include "model/tensor_parallel.hpp"

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

} // namespace metronome
