#pragma once
// The weight store: the model's weights on one device, in one allocation,
// bf16, each tensor at a 256-byte boundary, with the RoPE inverse-frequency
// table.
//
// Design note. Weights are uploaded once, at start-up, on the engine's
// stream: bf16 tensors straight from the mapped safetensors, fp16 and fp32
// ones through a device staging buffer and a conversion kernel (a wait per
// layer, since the staging buffer is reused). q, k and v land side by side
// as one fused qkv matrix (and bias), gate and up as one gate_up matrix, so
// each projection is one GEMM. A tied LM head is the embedding table itself.
// After construction the store is read-only: the forward pass reads its
// pointers on the executor's thread.
//
// 4-bit checkpoints (GPTQ, AWQ) are repacked on the host into int4_layout
// (gpu/int4_layout.hpp), a fused projection's parts stacked. A projection
// the 4-bit kernels cannot take (an input count or group size off their
// grid, act-order parts with different permutations, parts left in float by
// the checkpoint) is dequantized on the host, exactly, and kept as bf16;
// int4_fallbacks() says which. Embeddings, norms and the LM head are bf16.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "gpu/device_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/model_weights.hpp"

namespace metronome::gpu {

/// One decoder layer's weights on the device (bias pointers null where the
/// model has none). Each projection is either bf16 (its pointer) or 4-bit
/// (its int4_weights, the pointer null).
struct layer_weights {
  const bf16* attn_norm = nullptr;
  const bf16* qkv = nullptr;      // [q + 2 kv][hidden]: q, k, v stacked
  const bf16* qkv_bias = nullptr; // [q + 2 kv]
  const bf16* o = nullptr;
  const bf16* o_bias = nullptr;
  const bf16* mlp_norm = nullptr;
  const bf16* gate_up = nullptr;  // [2 intermediate][hidden]: gate, then up
  const bf16* down = nullptr;
  int4_weights qkv4, o4, gate_up4, down4;
};

class weight_store {
public:
  /// Uploads `model`'s weights on `stream` and waits for them (`done` is an
  /// event the caller owns, recorded and waited on here). The engine's
  /// constructor thread; cuda_error on failure.
  weight_store(const model_folder& model, cudaStream_t stream, cudaEvent_t done);

  weight_store(const weight_store&) = delete;
  weight_store& operator=(const weight_store&) = delete;

  /// Layer i's weights (i < num_layers).
  const layer_weights& layer(int32_t i) const {
    return layers_[size_t(i)];
  }

  const std::vector<layer_weights>& layers() const {
    return layers_;
  }

  const bf16* embed() const {
    return embed_;
  }

  const bf16* final_norm() const {
    return final_norm_;
  }

  const bf16* lm_head() const {
    return lm_head_;
  }

  /// RoPE inverse frequencies [head_dim / 2] fp32.
  const float* inv_freq() const {
    return inv_freq_.get<float>();
  }

  /// Bytes of the weights' allocation (the memory plan's "weights").
  size_t bytes() const {
    return weights_.bytes();
  }

  /// Whether any projection is stored in 4 bits.
  bool has_int4() const {
    return has_int4_;
  }

  /// The most elements of any 4-bit projection (n x k): the bf16 scratch
  /// the cuBLAS and tensor-core paths dequantize into. 0 without 4 bits.
  int64_t largest_int4() const {
    return largest_int4_;
  }

  /// Projections of a 4-bit checkpoint kept as bf16, and why ("layer 0
  /// qkv: their act-order input permutations (g_idx) differ"); empty when
  /// every one is served in 4 bits.
  const std::vector<std::string>& int4_fallbacks() const {
    return int4_fallbacks_;
  }

private:
  device_buffer weights_;
  std::vector<layer_weights> layers_;
  const bf16* embed_ = nullptr;
  const bf16* final_norm_ = nullptr;
  const bf16* lm_head_ = nullptr;
  device_buffer inv_freq_;
  bool has_int4_ = false;
  int64_t largest_int4_ = 0;
  std::vector<std::string> int4_fallbacks_;
};

} // namespace metronome::gpu
