#pragma once
// The CPU reference engine: a Llama-family forward pass in fp32 over a paged
// KV cache, for any mix of prompt chunks and single-token decodes in one call.
//
// Design note. A call receives, per sequence, the tokens to process, how many
// tokens of that sequence the cache already holds (start_pos) and its page
// table. All tokens of all sequences go through the projections together (one
// pass over each weight matrix per call); keys and values are rotated and
// written into the sequence's pages before attention, so a chunk attends to
// its own earlier tokens and to everything cached before it. Only the last
// token of each sequence reaches the final norm and the LM head. Every output
// element is computed by code that does not depend on the batch, so a
// sequence gets bit-identical logits alone or batched with others.
//
// KV element types (set_kv_dtype). The cache stays fp32; with fp8 or
// fp8_e5m2 each row is rounded, when it is written, to what the format would
// store and read back (value -> bytes -> value), so attention reads the
// rounded keys and values of every earlier position, its own included, as a
// kernel reading the bytes would. fp8 (e4m3): one scale per row, its own
// largest |value| / 448 (ref::round_rows_to_e4m3). fp8_e5m2 (the reference of
// that format and of gpu/kv_e5m2.cuh): per sequence, layer, K or V and kv head,
// one scale per window of kv_e5m2_window (256) positions, fixed when the
// window's first row is written from the largest |value| of that row and of
// the kv_e5m2_history (3) windows before it as stored (e5m2_window_scale,
// model/dtype.hpp), then each value rounded to e5m2 with it, saturating
// (ref::round_to_e5m2). The CPU keeps the scale beside each row
// (cpu_kv_cache::row_scales), where a GPU would keep one per window; a row
// after a window's first reads the scale stored with that first row.
// The scales depend only on the sequence's tokens up to each position, so
// chunking, batching and page placement still change nothing, and a page
// shared by prefix reuse reads the same for every sequence. Values that
// saturate or are not finite are counted per sequence
// (forward_input::kv_overflow). A sequence marked full_precision (the
// overflow supervision's re-materialisation, model/step_plan.hpp) is written
// unrounded whatever the element type, so one cache holds both precisions.
//
// 4-bit weights (GPTQ, AWQ): the engine dequantizes each quantized
// projection to fp32 once, when it is made (w = scale * (q - zero), exact),
// and runs the same float path on them; the model folder keeps its mapped
// 4-bit tensors untouched.

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "model/cpu_ops.hpp"
#include "model/dtype.hpp"
#include "model/model_weights.hpp"

namespace metronome {

/// Page-organised key/value memory of the CPU engine, fp32.
/// Layout: [layer][page][k or v][slot][kv_head][head_dim].
class cpu_kv_cache {
public:
  cpu_kv_cache(const model_config& cfg, int32_t num_pages, int32_t page_size);

  int32_t num_pages() const {
    return num_pages_;
  }

  int32_t page_size() const {
    return page_size_;
  }

  /// Bytes held.
  size_t bytes() const {
    return data_.size() * sizeof(float);
  }

  /// Bytes one token occupies across all layers.
  size_t bytes_per_token() const {
    return size_t(layers_) * 2 * size_t(slot_floats_) * sizeof(float);
  }

  /// Keys (which = 0) or values (which = 1) of one slot, all kv heads.
  float* slot(int32_t layer, int32_t page, int32_t which, int32_t slot) {
    return data_.data() + slot_index(layer, page, which, slot) * size_t(slot_floats_);
  }

  /// Makes room for row_scales (fp8_e5m2), all 1 until written; a no-op
  /// after the first call.
  void enable_row_scales();

  /// The scales with which the keys (which = 0) or values (which = 1) of one
  /// slot were rounded, one per kv head (fp8_e5m2); enable_row_scales first.
  float* row_scales(int32_t layer, int32_t page, int32_t which, int32_t slot) {
    return scales_.data() + slot_index(layer, page, which, slot) * size_t(kv_heads_);
  }

private:
  size_t slot_index(int32_t layer, int32_t page, int32_t which, int32_t slot) const {
    return ((size_t(layer) * size_t(num_pages_) + size_t(page)) * 2 + size_t(which))
             * size_t(page_size_)
           + size_t(slot);
  }

  int32_t layers_, num_pages_, page_size_, kv_heads_;
  int64_t slot_floats_; // kv_heads * head_dim
  std::vector<float> data_;
  std::vector<float> scales_; // [layer][page][k or v][slot][kv_head], fp8_e5m2 only
};

/// One sequence's share of a forward call.
struct forward_input {
  /// Tokens to process, at positions start_pos, start_pos + 1, ...
  std::span<const int32_t> tokens;
  /// Tokens of this sequence already in the cache.
  int32_t start_pos = 0;
  /// Pages holding positions [0, start_pos + tokens.size()), in order.
  std::span<const int32_t> pages;
  /// fp8_e5m2 cache: where to add this sequence's values (over all layers,
  /// keys and values) that saturated or were not finite when written; the
  /// caller keeps one per sequence. Null: not counted. Untouched with the
  /// other element types.
  kv_overflow_count* kv_overflow = nullptr;
  /// Write this sequence's keys and values unrounded (fp32), whatever
  /// set_kv_dtype chose: a sequence the overflow supervision re-admitted in
  /// full precision (model/step_plan.hpp, kv_precision). Its pages must not
  /// be shared with sequences of the other precision (the scheduler's prefix
  /// hashes keep them apart).
  bool full_precision = false;
};

/// Computes logits with the model's weights on the CPU. Not thread-safe:
/// one caller at a time (the executor's thread); it parallelises inside.
class cpu_engine {
public:
  /// Allocates the KV cache: num_pages pages of page_size token slots, and
  /// dequantizes a quantized model's projections to fp32.
  cpu_engine(std::shared_ptr<const model_folder> model, int32_t num_pages, int32_t page_size);

  const model_config& config() const {
    return model_->config;
  }

  cpu_kv_cache& kv_cache() {
    return kv_;
  }

  const cpu_kv_cache& kv_cache() const {
    return kv_;
  }

  /// How the cache rounds each key and value row it writes, still holding
  /// floats (the design note above): bf16 (the default) keeps them as fp32,
  /// unrounded, whatever the GPU's bf16 cache does; fp8 rounds each row as
  /// the GPU's fp8 KV cache stores it (ref::round_rows_to_e4m3), the
  /// reference of kv_cache_dtype "fp8" in the GPU tests; fp8_e5m2 rounds
  /// with the window scales of that format (the reference of the GPU's).
  /// Set it before the first forward, on the caller's thread.
  void set_kv_dtype(kv_cache_dtype_kind dtype);

  /// set_kv_dtype(on ? fp8 : bf16).
  void set_kv_fp8(bool on) {
    set_kv_dtype(on ? kv_cache_dtype_kind::fp8 : kv_cache_dtype_kind::bf16);
  }

  /// The element type set_kv_dtype chose (bf16 until it is called).
  kv_cache_dtype_kind kv_dtype() const {
    return kv_dtype_;
  }

  /// Runs the model over `batch`, writes each sequence's keys and values into
  /// its pages and the logits of its last token into logits[i * vocab ...].
  /// Throws std::invalid_argument on an out-of-vocabulary token, an empty
  /// entry, or a page table too short for the positions.
  void forward(std::span<const forward_input> batch, std::span<float> logits);

private:
  void attention(int32_t layer, std::span<const forward_input> batch, const float* q,
                 float* out);

  /// fp8_e5m2: rounds the keys (which = 0) or values (which = 1) of `in`'s
  /// position `pos`, just written to the cache, with their window's scales
  /// (fixing them at a window's first position), records the scales beside
  /// the row and adds what saturated or was not finite to `count`.
  void round_e5m2_row(int32_t layer, const forward_input& in, int64_t pos, int32_t which,
                      kv_overflow_count& count);

  /// model_->weights, with each quantized projection replaced by a view of
  /// its dequantized fp32 weight in dequantized_.
  static model_weights working_weights(const model_folder& model,
                                       std::deque<std::vector<float>>& storage,
                                       std::deque<tensor_view>& views);

  std::shared_ptr<const model_folder> model_;
  std::deque<std::vector<float>> dequantized_;
  std::deque<tensor_view> dequantized_views_;
  model_weights weights_;
  cpu_kv_cache kv_;
  std::vector<float> inv_freq_;
  kv_cache_dtype_kind kv_dtype_ = kv_cache_dtype_kind::bf16;
};

} // namespace metronome
