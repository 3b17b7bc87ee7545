#pragma once
// The weights of a Llama-family decoder, bound by name to tensors of a
// tensor_store and checked against the config: every tensor present, none
// unexpected, each of the right shape, the float ones all of one dtype.
// With a `quantization_config`, a projection stored as `P.qweight` (with
// `P.qzeros`, `P.scales` and for GPTQ `P.g_idx`) is bound as a
// quantized_linear instead of `P.weight`; one stored as `P.weight` stays
// plain (modules left unconverted).

#include <filesystem>
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "model/model_config.hpp"
#include "model/quantized_linear.hpp"
#include "model/safetensors.hpp"
#include "model/weight_quantization.hpp"

namespace metronome {

struct packed_linear;

/// The seven linear projections of a decoder layer, in the order of
/// layer_weights::quantized.
enum class projection : uint8_t { q, k, v, o, gate, up, down };
inline constexpr int num_projections = 7;

/// Views of one decoder layer's tensors. Bias pointers are null when absent;
/// a projection's float weight pointer (q ... down) is null where it is
/// stored quantized, and its entry of `quantized` says so.
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
  /// The 4-bit form of each projection, indexed by `projection`;
  /// quantized_linear::present() is false where it is plain.
  std::array<quantized_linear, num_projections> quantized{};

  /// The float weight slot of `p` (q ... down).
  const tensor_view*& weight(projection p);
  const tensor_view* weight(projection p) const;
};

/// Views of all tensors of a model; lm_head aliases embed when tied.
struct model_weights {
  dtype type = dtype::bf16;
  const tensor_view* embed = nullptr;
  const tensor_view* final_norm = nullptr;
  const tensor_view* lm_head = nullptr;
  std::vector<layer_weights> layers;
  /// Whether any projection is stored quantized (config.quantization says how).
  bool quantized = false;

  /// Binds and validates. Throws model_error naming the file and tensor for a
  /// missing or unexpected tensor, a wrong shape or dtype, mixed float
  /// dtypes, a 4-bit tensor without a quantization_config, or a g_idx that
  /// contradicts it.
  static model_weights bind(const model_config& cfg, const tensor_store& store);
};

/// How a folder is loaded (model.quantize, --quantize).
struct model_load_options {
  /// int4: quantize a float checkpoint's projections at load
  /// (quantize_projections, model/rtn_quantize.hpp).
  weight_quantization quantize = weight_quantization::none;
  /// The layout int4 packs into, group 128: awq (asymmetric, what `serve`
  /// and `generate` use: rtn_int4_config) or gptq (v1, symmetric, zero 8:
  /// rtn_config(gptq)); `metronome eval-quality` measures both.
  quant_method int4_layout = quant_method::awq;
};

/// An opened Hugging Face model folder: config, mapped weights, bound views.
/// Immutable after open; share it between threads through shared_ptr.
struct model_folder {
  std::filesystem::path dir;
  model_config config;
  std::unique_ptr<tensor_store> store;
  model_weights weights;
  /// The projections quantized at load (--quantize int4), which
  /// weights.layers[l].quantized point into; empty otherwise.
  std::vector<std::shared_ptr<const packed_linear>> owned_projections;
  /// What else `weights` points into: a tensor-parallel rank's slices and
  /// the whole folder they were cut from (shard_model); empty otherwise.
  std::vector<std::shared_ptr<const void>> held;
  /// Whether config.quantization and the 4-bit projections were made at
  /// load from a float checkpoint (false: stored so, or none).
  bool quantized_at_load = false;

  /// What the weights are, for the start-up line and logs: "bf16",
  /// "int4 (awq, 4 bits, group 128; bf16 embeddings and LM head)", or with
  /// --quantize int4 "int4 (RTN at load: awq, 4 bits, group 128; ...)".
  std::string weights_description() const;

  /// Opens `dir`: reads config.json, maps the safetensors and binds them;
  /// with options.quantize int4, then quantizes the projections
  /// (quantize_projections). Throws model_error naming the file and field
  /// or tensor on any problem.
  static std::shared_ptr<const model_folder> open(const std::filesystem::path& dir,
                                                  const model_load_options& options = {});
};

} // namespace metronome
