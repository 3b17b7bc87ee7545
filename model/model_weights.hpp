#pragma once
// The weights of a Llama-family decoder, bound by name to tensors of a
// tensor_store and checked against the config: every tensor present, none
// unexpected, each of the right shape, all of one dtype.

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "model/model_config.hpp"
#include "model/safetensors.hpp"

namespace metronome {

/// Views of one decoder layer's tensors. Bias pointers are null when absent.
struct layer_weights {
  const tensor_view* attn_norm = nullptr;
  const tensor_view* q = nullptr;
  const tensor_view* k = nullptr;
  const tensor_view* v = nullptr;
  const tensor_view* q_bias = nullptr;
  const tensor_view* k_bias = nullptr;
  const tensor_view* v_bias = nullptr;
  const tensor_view* o = nullptr;
  const tensor_view* o_bias = nullptr;
  const tensor_view* mlp_norm = nullptr;
  const tensor_view* gate = nullptr;
  const tensor_view* up = nullptr;
  const tensor_view* down = nullptr;
};

/// Views of all tensors of a model; lm_head aliases embed when tied.
struct model_weights {
  dtype type = dtype::bf16;
  const tensor_view* embed = nullptr;
  const tensor_view* final_norm = nullptr;
  const tensor_view* lm_head = nullptr;
  std::vector<layer_weights> layers;

  /// Binds and validates. Throws model_error naming the file and tensor for a
  /// missing or unexpected tensor, a wrong shape or a mixed dtype.
  static model_weights bind(const model_config& cfg, const tensor_store& store);
};

/// An opened Hugging Face model folder: config, mapped weights, bound views.
/// Immutable after open; share it between threads through shared_ptr.
struct model_folder {
  std::filesystem::path dir;
  model_config config;
  std::unique_ptr<tensor_store> store;
  model_weights weights;

  /// Opens `dir`: reads config.json, maps the safetensors and binds them.
  /// Throws model_error naming the file and field or tensor on any problem.
  static std::shared_ptr<const model_folder> open(const std::filesystem::path& dir);
};

} // namespace metronome
