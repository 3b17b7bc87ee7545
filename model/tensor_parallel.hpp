#pragma once
// How one model is split over N ranks (GPUs) for tensor parallelism
// (--tensor-parallel N, issue 38): which rows and columns of each
// projection every rank holds, and where the ranks all-reduce.
//
// Design note. Each decoder block pairs a column-parallel projection with a
// row-parallel one. q/k/v (and gate/up) are split by output rows, so each
// rank computes whole attention heads (whole intermediate features) from the
// full, replicated hidden state, with no communication. o_proj (down_proj)
// is then split by input columns, matching exactly the slice the rank just
// produced, so each rank yields a partial sum of the full hidden-size
// output. One all-reduce (sum) per half-block turns the partials into the
// output of the unsharded projection: two per layer, after o_proj and after
// down_proj; nothing else moves. Splitting the other way round (row then
// column) would need a gather between the pair. Embeddings, norms and the
// LM head are replicated: every rank computes the same residual stream,
// norms and logits, which costs a little memory and keeps sampling local.
//
// Ranges index the float weights as the CPU engine and Hugging Face store
// them: row-major [out_features, in_features]; a projection's rows are its
// outputs, its columns its inputs. q's rows are head-major (head h owns rows
// [h * head_dim, (h + 1) * head_dim)), as are k's, v's and o's columns.
//
// Key/value heads. With N dividing num_key_value_heads each rank holds
// num_key_value_heads / N of them and the query heads that use them. With N
// a multiple of num_key_value_heads (more ranks than kv heads) each rank's
// query heads all use one kv head, which that rank holds: the kv heads are
// replicated N / num_key_value_heads times (in weights and in the KV cache).
// Any other N is refused.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model_config.hpp"
#include "model/model_weights.hpp"

namespace metronome {

/// A half-open range [begin, end) of rows or columns.
struct index_range {
  int64_t begin = 0;
  int64_t end = 0;

  int64_t size() const {
    return end - begin;
  }

  friend bool operator==(const index_range&, const index_range&) = default;
};

/// How a projection's weight is split over the ranks.
enum class split_kind : uint8_t {
  /// By output rows: each rank computes a slice of the outputs from the
  /// full input (q, k, v, gate, up). A bias is sliced with the rows.
  column_parallel,
  /// By input columns: each rank computes a partial sum of all outputs from
  /// its slice of the input (o, down). A bias is added once, by the rank
  /// bias_rank(), so the all-reduce counts it once.
  row_parallel,
};

/// The split of `p`: column-parallel for q, k, v, gate, up; row-parallel for
/// o and down.
split_kind split_of(projection p);

/// Where key/value heads live.
enum class kv_head_layout : uint8_t {
  /// N divides num_key_value_heads: each kv head on exactly one rank.
  split,
  /// N is a multiple of num_key_value_heads: each rank holds the one kv
  /// head its query heads use; each kv head lives on N / num_kv_heads ranks.
  replicated,
};

/// A point in a decoder layer where the ranks sum their partial outputs
/// ([tokens, hidden_size] each) before the residual add.
enum class all_reduce_point : uint8_t {
  /// After o_proj, before the attention block's residual add.
  after_o_proj,
  /// After down_proj, before the MLP block's residual add.
  after_down_proj,
};

/// What one rank holds of every decoder layer (the same for all layers).
struct rank_shard {
  int32_t rank = 0;
  /// Query heads of this rank, as indices of the model's heads.
  index_range q_heads;
  /// Key/value heads of this rank, as indices of the model's kv heads; under
  /// kv_head_layout::replicated one head, shared with other ranks.
  index_range kv_heads;
  /// Slice of the intermediate (MLP) features.
  index_range intermediate;

  /// The rows of `p`'s weight [out, in] this rank holds: a slice for
  /// column-parallel projections (q: q_heads * head_dim, k and v: kv_heads *
  /// head_dim, gate and up: intermediate), all hidden_size rows for o and
  /// down. A column-parallel bias is sliced with the same range.
  index_range rows(projection p) const;
  /// The columns of `p`'s weight this rank holds: all hidden_size columns
  /// for column-parallel projections, a slice for o (q_heads * head_dim) and
  /// down (intermediate).
  index_range cols(projection p) const;

private:
  friend class tensor_parallel_plan;
  int32_t head_dim_ = 0;
  int64_t hidden_ = 0;
};

/// The shard plan of one model over N ranks. Immutable; cheap to copy.
/// Built once at start-up, before any weight is loaded, so that a refusal
/// comes before memory is spent; the GPU engine slices its weights and
/// places its all-reduces by it, and the CPU reference (the tests) does the
/// same on the CPU.
class tensor_parallel_plan {
public:
  /// Plans `cfg` over `ranks` ranks. Throws model_error naming `file` and
  /// the config field that does not split: num_attention_heads not divisible
  /// by N; num_key_value_heads neither divisible by N nor dividing it;
  /// intermediate_size not divisible by N; with 4-bit weights, a split of
  /// o_proj's or down_proj's inputs that is not whole groups
  /// (quantization_config.group_size), a sliced dimension that is not whole
  /// int32 words of 8 values, or act-order (quantization_config.desc_act).
  /// N < 1 is refused naming --tensor-parallel. N = 1 is the unsharded
  /// model: one rank holding everything, and all-reduces of one (no-ops).
  tensor_parallel_plan(const model_config& cfg, int32_t ranks,
                       const std::string& file = "config.json");

  /// N.
  int32_t ranks() const {
    return int32_t(shards_.size());
  }

  /// Where the kv heads live (split when N = 1).
  kv_head_layout kv_layout() const {
    return kv_layout_;
  }

  /// What rank `r` (0 <= r < N) holds.
  const rank_shard& shard(int32_t r) const {
    return shards_.at(size_t(r));
  }

  /// The rank that adds the biases of row-parallel projections (o_proj's
  /// with attention_bias); the others add none. Always 0.
  int32_t bias_rank() const {
    return 0;
  }

  /// The all-reduces of every decoder layer, in the order they run.
  static const std::vector<all_reduce_point>& layer_all_reduces();

  /// The shape of one rank's share, as a model_config: num_heads,
  /// num_kv_heads and intermediate_size per rank, everything else (hidden
  /// size, head_dim, vocabulary, rope, norms) unchanged. A single-device
  /// engine's attention, KV cache and MLP sized by it do one rank's work;
  /// the same for every rank.
  const model_config& rank_config() const {
    return rank_config_;
  }

  /// One line for the start-up log, e.g. "tensor parallel 4: 8 of 32
  /// query heads, 1 of 2 kv heads (replicated 2x), 3584 of 14336
  /// intermediate per rank".
  std::string describe() const;

private:
  model_config cfg_;
  model_config rank_config_;
  kv_head_layout kv_layout_ = kv_head_layout::split;
  std::vector<rank_shard> shards_;
};

/// Rank `rank`'s share of `full` as a model folder of its own, for an
/// engine that serves one rank: its config is plan.rank_config(); q, k, v,
/// gate and up hold the rank's rows, o and down its columns, copied in the
/// checkpoint's own float type; q/k/v biases are sliced with their rows; o's
/// bias is the checkpoint's on plan.bias_rank() and zeros on the others (so
/// the all-reduce adds it once). Embeddings, norms and the LM head are the
/// full folder's own views: the result holds `full` alive. 4-bit
/// projections (GPTQ, AWQ, stored or quantized at load) are cut in their
/// own layout, along whole words and groups (the plan refuses a model
/// where that is not possible), with their scales, zeros and g_idx
/// (renumbered). Built on the host at start-up, once per rank, before its
/// weights go to its device.
std::shared_ptr<const model_folder> shard_model(std::shared_ptr<const model_folder> full,
                                                const tensor_parallel_plan& plan, int32_t rank);

} // namespace metronome
