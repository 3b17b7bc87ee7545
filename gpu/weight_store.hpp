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

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "gpu/device_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/model_weights.hpp"

namespace metronome::gpu {

/// One decoder layer's weights on the device (bias pointers null where the
/// model has none).
struct layer_weights {
  const bf16* attn_norm = nullptr;
  const bf16* qkv = nullptr;      // [q + 2 kv][hidden]: q, k, v stacked
  const bf16* qkv_bias = nullptr; // [q + 2 kv]
  const bf16* o = nullptr;
  const bf16* o_bias = nullptr;
  const bf16* mlp_norm = nullptr;
  const bf16* gate_up = nullptr;  // [2 intermediate][hidden]: gate, then up
  const bf16* down = nullptr;
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

private:
  device_buffer weights_;
  std::vector<layer_weights> layers_;
  const bf16* embed_ = nullptr;
  const bf16* final_norm_ = nullptr;
  const bf16* lm_head_ = nullptr;
  device_buffer inv_freq_;
};

} // namespace metronome::gpu
