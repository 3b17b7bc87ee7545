#include "gpu/weight_store.hpp"

#include <algorithm>

namespace metronome::gpu {

namespace {

constexpr size_t align_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

} // namespace

weight_store::weight_store(const model_folder& model, cudaStream_t stream, cudaEvent_t done) {
  const auto& c = model.config;
  const auto& w = model.weights;
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), f = c.intermediate_size;
  const int64_t v = c.vocab_size, qkv = q + 2 * kv;

  // One allocation; every tensor at a 256-byte boundary.
  size_t total = 0;
  auto reserve = [&](int64_t elements) {
    const size_t off = total;
    total = align_up(total + size_t(elements) * 2, 256);
    return off;
  };
  struct offsets {
    size_t attn_norm, qkv, qkv_bias, o, o_bias, mlp_norm, gate_up, down;
  };
  std::vector<offsets> offs;
  const size_t embed_off = reserve(v * h);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    offsets o{};
    o.attn_norm = reserve(h);
    o.qkv = reserve(qkv * h);
    o.qkv_bias = c.qkv_bias ? reserve(qkv) : 0;
    o.o = reserve(h * q);
    o.o_bias = c.o_bias ? reserve(h) : 0;
    o.mlp_norm = reserve(h);
    o.gate_up = reserve(2 * f * h);
    o.down = reserve(h * f);
    offs.push_back(o);
  }
  const size_t final_norm_off = reserve(h);
  const size_t lm_head_off = c.tie_word_embeddings ? embed_off : reserve(v * h);
  weights_ = device_buffer(total);
  auto* base = weights_.get<unsigned char>();

  // Non-bf16 weights go through a device staging buffer and a conversion.
  size_t staging_bytes = 0;
  for (const auto& [_, t] : model.store->tensors())
    if (t.type != dtype::bf16)
      staging_bytes = std::max(staging_bytes, t.nbytes);
  device_buffer staging(staging_bytes);

  auto upload = [&](const tensor_view* t, size_t dst_off) {
    auto* dst = reinterpret_cast<bf16*>(base + dst_off);
    if (t->type == dtype::bf16) {
      METRONOME_CUDA(cudaMemcpyAsync(dst, t->data, t->nbytes, cudaMemcpyHostToDevice, stream));
    } else {
      METRONOME_CUDA(
        cudaMemcpyAsync(staging.get(), t->data, t->nbytes, cudaMemcpyHostToDevice, stream));
      launch_to_bf16(staging.get(), t->type == dtype::f16, t->numel(), dst, stream);
    }
  };
  upload(w.embed, embed_off);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const auto& lw = w.layers[size_t(l)];
    const auto& o = offs[size_t(l)];
    upload(lw.attn_norm, o.attn_norm);
    upload(lw.q, o.qkv);
    upload(lw.k, o.qkv + size_t(q * h) * 2);
    upload(lw.v, o.qkv + size_t((q + kv) * h) * 2);
    if (c.qkv_bias) {
      upload(lw.q_bias, o.qkv_bias);
      upload(lw.k_bias, o.qkv_bias + size_t(q) * 2);
      upload(lw.v_bias, o.qkv_bias + size_t(q + kv) * 2);
    }
    upload(lw.o, o.o);
    if (c.o_bias)
      upload(lw.o_bias, o.o_bias);
    upload(lw.mlp_norm, o.mlp_norm);
    upload(lw.gate, o.gate_up);
    upload(lw.up, o.gate_up + size_t(f * h) * 2);
    upload(lw.down, o.down);
    // The staging buffer is reused tensor by tensor: wait per layer.
    if (staging_bytes > 0) {
      METRONOME_CUDA(cudaEventRecord(done, stream));
      wait_event(done, 600.0, "weight upload");
    }
  }
  upload(w.final_norm, final_norm_off);
  if (!c.tie_word_embeddings)
    upload(w.lm_head, lm_head_off);
  METRONOME_CUDA(cudaEventRecord(done, stream));
  wait_event(done, 600.0, "weight upload");

  auto at = [&](size_t off) { return reinterpret_cast<const bf16*>(base + off); };
  embed_ = at(embed_off);
  final_norm_ = at(final_norm_off);
  lm_head_ = at(lm_head_off);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const auto& o = offs[size_t(l)];
    layer_weights L;
    L.attn_norm = at(o.attn_norm);
    L.qkv = at(o.qkv);
    L.qkv_bias = c.qkv_bias ? at(o.qkv_bias) : nullptr;
    L.o = at(o.o);
    L.o_bias = c.o_bias ? at(o.o_bias) : nullptr;
    L.mlp_norm = at(o.mlp_norm);
    L.gate_up = at(o.gate_up);
    L.down = at(o.down);
    layers_.push_back(L);
  }

  auto inv = rope_inv_freq(c);
  inv_freq_ = device_buffer(inv.size() * sizeof(float));
  METRONOME_CUDA(cudaMemcpyAsync(inv_freq_.get(), inv.data(), inv.size() * sizeof(float),
                                 cudaMemcpyHostToDevice, stream));
  METRONOME_CUDA(cudaEventRecord(done, stream));
  wait_event(done, 60.0, "rope table upload");
}

} // namespace metronome::gpu
