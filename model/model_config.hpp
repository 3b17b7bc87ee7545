#pragma once
// config.json of a Hugging Face Llama-family folder, parsed into native types.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/dtype.hpp"
#include "model/quantization_config.hpp"

namespace metronome {

/// The decoder families Metronome serves; all share the Llama block layout.
enum class model_arch : uint8_t { llama, mistral, qwen2 };

/// The Hugging Face class name ("LlamaForCausalLM", ...).
std::string_view architecture_name(model_arch arch);

/// `rope_scaling` of type "llama3" (Llama 3.1 and later).
struct llama3_rope_scaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int32_t original_max_position_embeddings = 8192;
};

/// The shape and numerics of one model, as config.json states them.
struct model_config {
  model_arch arch = model_arch::llama;
  int32_t vocab_size = 0;
  int32_t hidden_size = 0;
  int32_t intermediate_size = 0;
  int32_t num_layers = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<llama3_rope_scaling> rope_scaling;
  bool tie_word_embeddings = false;
  /// Bias on q/k/v projections (Qwen2; Llama's `attention_bias`).
  bool qkv_bias = false;
  /// Bias on the output projection (Llama's `attention_bias` only).
  bool o_bias = false;
  /// Window of sliding-window attention: a query at position i sees keys at
  /// positions j with i - window < j <= i. Applies to layers marked in
  /// `layer_sliding`.
  std::optional<int32_t> sliding_window;
  /// One entry per layer: true where the layer uses the sliding window.
  std::vector<bool> layer_sliding;
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;
  /// `torch_dtype` (or `dtype`) as declared; the weights may differ.
  std::optional<dtype> declared_dtype;
  /// `quantization_config`: the 4-bit layout of the linear projections
  /// (docs/quantization.md); absent for a float checkpoint.
  std::optional<quantization_config> quantization;

  /// Query heads per key/value head.
  int32_t gqa_group() const {
    return num_heads / num_kv_heads;
  }

  /// Width of the q projection output (num_heads * head_dim).
  int32_t q_size() const {
    return num_heads * head_dim;
  }

  /// Width of the k or v projection output (num_kv_heads * head_dim).
  int32_t kv_size() const {
    return num_kv_heads * head_dim;
  }

  /// Whether layer `i` attends through the sliding window.
  bool is_sliding(int32_t layer) const {
    return sliding_window && layer_sliding.at(size_t(layer));
  }

  /// Parses a config.json document; `file` names it in errors.
  /// Throws model_error naming the field on missing, mistyped, out-of-range or
  /// unsupported values.
  static model_config from_json(const nlohmann::json& doc, const std::string& file);

  /// Reads and parses `path` (a config.json).
  static model_config load(const std::filesystem::path& path);

  /// The config.json a Hugging Face checkpoint of this shape carries.
  nlohmann::json to_json() const;
};

/// Rotary inverse frequencies (head_dim / 2 of them), with llama3 scaling
/// applied when configured, computed as Hugging Face computes them.
std::vector<float> rope_inv_freq(const model_config& cfg);

} // namespace metronome
