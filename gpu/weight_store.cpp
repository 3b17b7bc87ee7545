#include "gpu/weight_store.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "gpu/int4_layout.hpp"

namespace metronome::gpu {

namespace {

constexpr size_t align_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

/// The four matrices of a layer as the forward pass multiplies them, and
/// the checkpoint's projections each one stacks.
enum class fused : uint8_t { qkv, o, gate_up, down };
constexpr std::array<fused, 4> all_fused = {fused::qkv, fused::o, fused::gate_up, fused::down};

std::vector<projection> parts_of(fused f) {
  switch (f) {
    case fused::qkv: return {projection::q, projection::k, projection::v};
    case fused::o: return {projection::o};
    case fused::gate_up: return {projection::gate, projection::up};
    case fused::down: break;
  }
  return {projection::down};
}

const char* name_of(fused f) {
  switch (f) {
    case fused::qkv: return "qkv";
    case fused::o: return "o";
    case fused::gate_up: return "gate_up";
    case fused::down: break;
  }
  return "down";
}

/// How one fused matrix is stored: bf16, or 4 bits (with its shape) where
/// every part is stored in 4 bits and the kernels take them as one stack.
struct matrix_plan {
  bool int4 = false;
  bool any_quantized = false;
  int64_t rows = 0, cols = 0, groups = 0;
  bool perm = false;
  std::string why; // why a matrix with 4-bit parts stays bf16
  size_t off = 0, off_sz = 0, off_perm = 0;
};

matrix_plan plan_matrix(const model_config& c, const metronome::layer_weights& lw, fused f) {
  matrix_plan m;
  const auto parts = parts_of(f);
  int32_t quantized = 0;
  for (projection p : parts) {
    const auto& ql = lw.quantized[size_t(p)];
    if (!ql.present())
      continue;
    ++quantized;
    m.rows += ql.out_features;
    m.cols = ql.in_features;
  }
  m.any_quantized = quantized > 0;
  if (quantized == 0)
    return m;
  const quantization_config& qc = *c.quantization;
  if (quantized != int32_t(parts.size())) {
    m.why = "some of its parts are stored in float";
    return m;
  }
  if (!int4_kernels_take(m.cols, qc.group_size)) {
    m.why = std::to_string(m.cols) + " inputs in groups of " + std::to_string(qc.group_size)
            + " are off the 4-bit kernels' grid (multiples of 32)";
    return m;
  }
  // One act-order permutation for all parts: equal g_idx (the permutation
  // is a function of it).
  const tensor_view* first = lw.quantized[size_t(parts.front())].g_idx;
  for (projection p : parts) {
    const tensor_view* g = lw.quantized[size_t(p)].g_idx;
    if ((g == nullptr) != (first == nullptr)
        || (g && (g->nbytes != first->nbytes || std::memcmp(g->data, first->data, g->nbytes))))
      m.why = "their act-order input permutations (g_idx) differ";
  }
  if (!m.why.empty())
    return m;
  bool in_order = true;
  if (first) {
    const int64_t gs = qc.group_size < 0 ? m.cols : qc.group_size;
    for (int64_t i = 0; i < m.cols && in_order; ++i) {
      int32_t g;
      std::memcpy(&g, first->data + size_t(i) * 4, 4);
      in_order = g == int32_t(i / gs);
    }
  }
  m.int4 = true;
  m.groups = qc.num_groups(m.cols);
  m.perm = !in_order;
  return m;
}

} // namespace

weight_store::weight_store(const model_folder& model, cudaStream_t stream, cudaEvent_t done) {
  const auto& c = model.config;
  const auto& w = model.weights;
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), f = c.intermediate_size;
  const int64_t v = c.vocab_size, qkv = q + 2 * kv;

  // One allocation; every tensor at a 256-byte boundary.
  size_t total = 0;
  auto reserve_bytes = [&](size_t bytes) {
    const size_t off = total;
    total = align_up(total + bytes, 256);
    return off;
  };
  auto reserve = [&](int64_t elements) { return reserve_bytes(size_t(elements) * 2); };
  struct offsets {
    size_t attn_norm, qkv_bias, o_bias, mlp_norm;
    std::array<matrix_plan, 4> m;
  };
  const int64_t rows_of[4] = {qkv, h, 2 * f, h};
  const int64_t cols_of[4] = {h, q, h, f};
  std::vector<offsets> offs;
  const size_t embed_off = reserve(v * h);
  size_t staging_bytes = 0; // the largest tensor that needs a conversion
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const auto& lw = w.layers[size_t(l)];
    offsets o{};
    o.attn_norm = reserve(h);
    o.qkv_bias = c.qkv_bias ? reserve(qkv) : 0;
    o.o_bias = c.o_bias ? reserve(h) : 0;
    o.mlp_norm = reserve(h);
    for (fused fm : all_fused) {
      const size_t i = size_t(fm);
      matrix_plan m = plan_matrix(c, lw, fm);
      if (m.int4) {
        m.off = reserve_bytes(size_t(m.rows * (m.cols / 8)) * 4);
        m.off_sz = reserve_bytes(size_t(m.rows * m.groups) * 4);
        m.off_perm = m.perm ? reserve_bytes(size_t(m.cols) * 4) : 0;
        has_int4_ = true;
        largest_int4_ = std::max(largest_int4_, m.rows * m.cols);
      } else {
        m.off = reserve(rows_of[i] * cols_of[i]);
        if (m.any_quantized) {
          int4_fallbacks_.push_back("layer " + std::to_string(l) + " " + name_of(fm) + ": "
                                    + m.why);
          for (projection p : parts_of(fm))
            if (lw.quantized[size_t(p)].present())
              staging_bytes = std::max(staging_bytes,
                                       size_t(lw.quantized[size_t(p)].out_features
                                              * lw.quantized[size_t(p)].in_features)
                                         * 4);
        }
      }
      o.m[i] = std::move(m);
    }
    offs.push_back(std::move(o));
  }
  const size_t final_norm_off = reserve(h);
  const size_t lm_head_off = c.tie_word_embeddings ? embed_off : reserve(v * h);
  weights_ = device_buffer(total);
  auto* base = weights_.get<unsigned char>();

  // Non-bf16 weights go through a device staging buffer and a conversion.
  // (The bound views, not the folder's store: a tensor-parallel rank's
  // folder holds slices that no store lists.)
  auto stage_for = [&](const tensor_view* t) {
    if (t && t->type != dtype::bf16 && is_float(t->type))
      staging_bytes = std::max(staging_bytes, t->nbytes);
  };
  for (const tensor_view* t : {w.embed, w.final_norm, w.lm_head})
    stage_for(t);
  for (const auto& lw : w.layers)
    for (const tensor_view* t : {lw.attn_norm, lw.q, lw.k, lw.v, lw.q_bias, lw.k_bias, lw.v_bias,
                                 lw.o, lw.o_bias, lw.mlp_norm, lw.gate, lw.up, lw.down})
      stage_for(t);
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
  auto wait = [&](const char* what) {
    METRONOME_CUDA(cudaEventRecord(done, stream));
    wait_event(done, 600.0, what);
  };
  auto copy = [&](const void* src, size_t bytes, size_t dst_off) {
    METRONOME_CUDA(
      cudaMemcpyAsync(base + dst_off, src, bytes, cudaMemcpyHostToDevice, stream));
  };
  const quantization_config* qc = c.quantization ? &*c.quantization : nullptr;
  upload(w.embed, embed_off);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const auto& lw = w.layers[size_t(l)];
    const auto& o = offs[size_t(l)];
    upload(lw.attn_norm, o.attn_norm);
    if (c.qkv_bias) {
      upload(lw.q_bias, o.qkv_bias);
      upload(lw.k_bias, o.qkv_bias + size_t(q) * 2);
      upload(lw.v_bias, o.qkv_bias + size_t(q + kv) * 2);
    }
    if (c.o_bias)
      upload(lw.o_bias, o.o_bias);
    upload(lw.mlp_norm, o.mlp_norm);
    // Host copies that must live until this layer's copies are done.
    std::vector<int4_layout> held;
    std::vector<std::vector<float>> dequantized;
    for (fused fm : all_fused) {
      const matrix_plan& m = o.m[size_t(fm)];
      if (m.int4) {
        std::vector<int4_layout> parts;
        for (projection p : parts_of(fm))
          parts.push_back(repack_int4(*qc, lw.quantized[size_t(p)]));
        std::string why;
        auto stacked = stack_int4(std::move(parts), &why);
        if (!stacked)
          throw std::logic_error("weight_store: layer " + std::to_string(l) + " "
                                 + name_of(fm) + " was planned in 4 bits but " + why);
        copy(stacked->q.data(), stacked->q.size() * 4, m.off);
        copy(stacked->scale_zero.data(), stacked->scale_zero.size() * 4, m.off_sz);
        if (m.perm)
          copy(stacked->perm.data(), stacked->perm.size() * 4, m.off_perm);
        held.push_back(std::move(*stacked));
        continue;
      }
      // bf16: the parts side by side along rows, 4-bit ones dequantized
      // exactly on the host (one at a time: the staging buffer is reused).
      size_t at = m.off;
      for (projection p : parts_of(fm)) {
        const auto& ql = lw.quantized[size_t(p)];
        if (!ql.present()) {
          const tensor_view* t = lw.weight(p);
          upload(t, at);
          at += size_t(t->numel()) * 2;
          continue;
        }
        auto& d = dequantized.emplace_back(size_t(ql.out_features * ql.in_features));
        dequantize(*qc, ql, d.data());
        tensor_view t;
        t.type = dtype::f32;
        t.shape = {ql.out_features, ql.in_features};
        t.data = reinterpret_cast<const std::byte*>(d.data());
        t.nbytes = d.size() * 4;
        upload(&t, at);
        at += d.size() * 2;
      }
    }
    // The staging buffer is reused tensor by tensor, and the host copies
    // die with this iteration: wait per layer.
    if (staging_bytes > 0 || !held.empty())
      wait("weight upload");
  }
  upload(w.final_norm, final_norm_off);
  if (!c.tie_word_embeddings)
    upload(w.lm_head, lm_head_off);
  wait("weight upload");

  auto at = [&](size_t off) { return reinterpret_cast<const bf16*>(base + off); };
  auto int4_at = [&](const matrix_plan& m) {
    int4_weights r;
    r.q = reinterpret_cast<const uint32_t*>(base + m.off);
    r.sz = reinterpret_cast<const uint32_t*>(base + m.off_sz);
    r.perm = m.perm ? reinterpret_cast<const int32_t*>(base + m.off_perm) : nullptr;
    r.group_size = qc->group_size < 0 ? int32_t(m.cols) : qc->group_size;
    r.groups = int32_t(m.groups);
    return r;
  };
  embed_ = at(embed_off);
  final_norm_ = at(final_norm_off);
  lm_head_ = at(lm_head_off);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const auto& o = offs[size_t(l)];
    layer_weights L;
    L.attn_norm = at(o.attn_norm);
    L.qkv_bias = c.qkv_bias ? at(o.qkv_bias) : nullptr;
    L.o_bias = c.o_bias ? at(o.o_bias) : nullptr;
    L.mlp_norm = at(o.mlp_norm);
    const bf16** dense[4] = {&L.qkv, &L.o, &L.gate_up, &L.down};
    int4_weights* packed[4] = {&L.qkv4, &L.o4, &L.gate_up4, &L.down4};
    for (fused fm : all_fused) {
      const matrix_plan& m = o.m[size_t(fm)];
      if (m.int4)
        *packed[size_t(fm)] = int4_at(m);
      else
        *dense[size_t(fm)] = at(m.off);
    }
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
