#pragma once
// Random-initialised model folders in exactly the Hugging Face layout, for
// tests (tiny presets) and benchmarks (the real shapes of Llama 3).
//
// Design note. Every weight element is a pure function of (seed, tensor name,
// element index) through a counter-based generator and exact float
// arithmetic, so the same seed gives byte-identical files on any machine and
// with any thread count. Scales keep activations in a realistic range at any
// depth: projections into the residual stream are scaled by 1/sqrt(2 layers),
// all others by 1/sqrt(fan_in); norm weights sit near 1.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "model/model_config.hpp"

namespace metronome {

/// The names of the built-in presets.
std::vector<std::string> model_presets();

/// The config of a preset; nullopt for an unknown name.
std::optional<model_config> preset_config(const std::string& name);

/// Settings of one make-model run.
struct make_model_options {
  model_config config;
  std::filesystem::path out_dir;
  /// A folder whose tokenizer.json (and tokenizer_config.json,
  /// special_tokens_map.json if present) are copied.
  std::optional<std::filesystem::path> tokenizer_dir;
  uint64_t seed = 0;
  dtype weight_type = dtype::bf16;
  /// Split model.safetensors into shards of at most this many bytes (with an
  /// index), as save_pretrained does; 0 = never.
  uint64_t max_shard_bytes = 5'000'000'000ull;
  /// Write the decoder projections in this 4-bit layout (rtn_config: AWQ
  /// or GPTQ v1, a group size), quantized by round to nearest
  /// (model/rtn_quantize.hpp) from the same random weights the float folder
  /// holds (drawn, rounded to weight_type, then quantized), with the
  /// matching `quantization_config` in config.json. Embeddings, norms,
  /// biases and the LM head stay in weight_type. Unset: all float.
  std::optional<quantization_config> quantize;
};

/// Writes config.json, generation_config.json, metronome.json (a description
/// saying the weights are random), the weights and the tokenizer
/// files into options.out_dir (created if needed). Throws model_error when the
/// tokenizer's ids do not fit the vocabulary, a projection's shape does not
/// fit options.quantize's layout (naming the tensor; nothing is written
/// then) or a file cannot be written.
void make_model(const make_model_options& options);

} // namespace metronome
