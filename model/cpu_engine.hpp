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
// 4-bit weights (GPTQ, AWQ): the engine dequantizes each quantized
// projection to fp32 once, when it is made (w = scale * (q - zero), exact),
// and runs the same float path on them; the model folder keeps its mapped
// 4-bit tensors untouched.

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

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
    return data_.data() + ((size_t(layer) * size_t(num_pages_) + size_t(page)) * 2 + size_t(which))
                            * size_t(page_size_) * size_t(slot_floats_)
           + size_t(slot) * size_t(slot_floats_);
  }

private:
  int32_t layers_, num_pages_, page_size_;
  int64_t slot_floats_; // kv_heads * head_dim
  std::vector<float> data_;
};

/// One sequence's share of a forward call.
struct forward_input {
  /// Tokens to process, at positions start_pos, start_pos + 1, ...
  std::span<const int32_t> tokens;
  /// Tokens of this sequence already in the cache.
  int32_t start_pos = 0;
  /// Pages holding positions [0, start_pos + tokens.size()), in order.
  std::span<const int32_t> pages;
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

  /// Whether the cache rounds each key and value row as the GPU's fp8 KV
  /// cache stores it (ref::round_rows_to_e4m3), still held as floats: the
  /// reference of kv_cache_dtype "fp8" in the GPU tests. Off by default; set
  /// it before the first forward, on the caller's thread.
  void set_kv_fp8(bool on) {
    kv_fp8_ = on;
  }

  /// Runs the model over `batch`, writes each sequence's keys and values into
  /// its pages and the logits of its last token into logits[i * vocab ...].
  /// Throws std::invalid_argument on an out-of-vocabulary token, an empty
  /// entry, or a page table too short for the positions.
  void forward(std::span<const forward_input> batch, std::span<float> logits);

private:
  void attention(int32_t layer, std::span<const forward_input> batch, const float* q,
                 float* out);

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
  bool kv_fp8_ = false;
};

} // namespace metronome
