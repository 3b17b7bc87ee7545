#include "model/rtn_quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include <sys/mman.h>
#include <unistd.h>

#include "model/dtype.hpp"
#include "model/model_error.hpp"
#include "model/model_weights.hpp"
#include "model/parallel.hpp"

namespace metronome {

namespace {

/// fp16's 1.0: the scale of a group whose range is 0.
constexpr uint16_t f16_one = 0x3C00;

/// Round to nearest, ties to even, of |x| < 2^22 (std::nearbyint's result
/// in the default rounding mode, without a libm call per element): adding
/// 1.5 * 2^23 leaves no fraction bits, subtracting it back is exact. Here
/// |x| <= 30: w / scale with scale >= range / 30 (an fp16 scale rounded to
/// within half its value), or with scale 1 below fp16's range.
inline float round_even(float x) {
  constexpr float magic = 12582912.0f; // 1.5 * 2^23
  return (x + magic) - magic;
}

/// Group size in rows for `in` input rows (-1: all of them).
int64_t group_rows(const quantization_config& cfg, int64_t in) {
  return cfg.group_size < 0 ? in : cfg.group_size;
}

void check_shape(const quantization_config& cfg, int64_t out, int64_t in,
                 const std::string& name, const std::string& file) {
  if (cfg.bits != 4)
    throw model_error(file, name, "RTN quantization writes 4 bits, not " + std::to_string(cfg.bits));
  if (cfg.group_size == 0 || cfg.group_size < -1)
    throw model_error(file, name, "RTN quantization: bad group size "
                                    + std::to_string(cfg.group_size));
  const std::string shape = " (this projection: out " + std::to_string(out) + " x in "
                            + std::to_string(in) + ")";
  if (out <= 0 || in <= 0 || out % 8 != 0)
    throw model_error(file, name, "int4 quantization needs out_features that are a multiple of "
                                  "8 (the 8 nibbles of a packed word)" + shape);
  if (in % 8 != 0)
    throw model_error(file, name, "int4 quantization needs in_features that are a multiple of 8"
                                  + shape);
  if (cfg.group_size > 0 && in % cfg.group_size != 0)
    throw model_error(file, name, "int4 quantization with group size "
                                    + std::to_string(cfg.group_size)
                                    + " needs in_features that are a multiple of it" + shape);
}

/// Quantizes output columns [8c, 8c + 8) into `p` (the 8 columns a packed
/// word along out holds); `row(o, dst)` writes row o of W (fp32). Scratch:
/// `q` 8 x in codes, `z` 8 x groups zeros, `buf` one row.
template <class RowFn>
void quantize_block(const quantization_config& cfg, int64_t c, int64_t out, int64_t in,
                    const RowFn& row, const std::string& name, const std::string& file,
                    packed_linear& p, std::vector<uint8_t>& q, std::vector<uint8_t>& z,
                    std::vector<float>& buf) {
  const bool gptq = cfg.method == quant_method::gptq;
  const int64_t gs = group_rows(cfg, in), groups = in / gs, words = out / 8;
  for (int j = 0; j < 8; ++j) {
    const int64_t o = 8 * c + j;
    row(o, buf.data());
    uint8_t* qr = q.data() + size_t(j) * size_t(in);
    for (int64_t t = 0; t < groups; ++t) {
      const float* w = buf.data() + t * gs;
      uint8_t* qg = qr + t * gs;
      // The range includes 0 (AWQ); NaN and infinities are refused.
      // In 8 lanes (gs is a multiple of 8), which the compiler vectorises;
      // probe turns NaN once any w is not finite.
      float lo8[8] = {}, hi8[8] = {}, probe8[8] = {};
      for (int64_t i = 0; i < gs; i += 8)
        for (int k = 0; k < 8; ++k) {
          const float x = w[i + k];
          lo8[k] = x < lo8[k] ? x : lo8[k];
          hi8[k] = x > hi8[k] ? x : hi8[k];
          probe8[k] += x * 0.0f;
        }
      float lo = 0.0f, hi = 0.0f, probe = 0.0f;
      for (int k = 0; k < 8; ++k) {
        lo = std::min(lo, lo8[k]);
        hi = std::max(hi, hi8[k]);
        probe += probe8[k];
      }
      if (!std::isfinite(probe))
        for (int64_t i = 0; i < gs; ++i)
          if (!std::isfinite(w[i]))
            throw model_error(file, name, "weight [" + std::to_string(o) + ", "
                                            + std::to_string(t * gs + i)
                                            + "] is not finite: cannot quantize it");
      const float amax = std::max(hi, -lo);
      const float want = gptq ? (2.0f * amax) / 15.0f : (hi - lo) / 15.0f;
      uint16_t s16 = f32_to_f16(want);
      if (f16_to_f32(s16) == 0.0f)
        s16 = f16_one;
      const float s = f16_to_f32(s16);
      if (!std::isfinite(s))
        throw model_error(file, name, "group " + std::to_string(t) + " of output "
                                        + std::to_string(o) + " spans "
                                        + std::to_string(hi - lo)
                                        + ": its scale overflows fp16");
      int32_t zero = 8;
      if (!gptq)
        zero = std::clamp(int32_t(round_even(-lo / s)), 0, 15);
      const float zf = float(zero);
#pragma omp simd
      for (int64_t i = 0; i < gs; ++i) {
        float v = round_even(w[i] / s) + zf;
        v = v < 0.0f ? 0.0f : v;
        v = v > 15.0f ? 15.0f : v;
        qg[i] = uint8_t(v);
      }
      p.scales[size_t(t * out + o)] = s16;
      z[size_t(j) * size_t(groups) + size_t(t)] = uint8_t(zero);
    }
  }
  if (gptq) {
    for (int j = 0; j < 8; ++j) {
      const int64_t o = 8 * c + j;
      const uint8_t* qr = q.data() + size_t(j) * size_t(in);
      for (int64_t r = 0; r < in / 8; ++r) {
        uint32_t wd = 0;
        for (int k = 0; k < 8; ++k)
          wd |= uint32_t(qr[8 * r + k]) << (4 * k);
        p.qweight[size_t(r * out + o)] = int32_t(wd);
      }
    }
    for (int64_t t = 0; t < groups; ++t)
      p.qzeros[size_t(t * words + c)] = int32_t(0x77777777u);
    return;
  }
  for (int64_t t = 0; t < groups; ++t) {
    uint32_t zw = 0;
    for (int j = 0; j < 8; ++j)
      zw |= uint32_t(z[size_t(j) * size_t(groups) + size_t(t)]) << (4 * awq_reverse[j]);
    p.qzeros[size_t(t * words + c)] = int32_t(zw);
  }
  for (int64_t i = 0; i < in; ++i) {
    uint32_t wd = 0;
    for (int j = 0; j < 8; ++j)
      wd |= uint32_t(q[size_t(j) * size_t(in) + size_t(i)]) << (4 * awq_reverse[j]);
    p.qweight[size_t(i * words + c)] = int32_t(wd);
  }
}

tensor_view make_view(const std::string& name, dtype t, std::vector<int64_t> shape,
                      const void* data, size_t bytes, const std::string& file) {
  tensor_view v;
  v.name = name;
  v.type = t;
  v.shape = std::move(shape);
  v.data = static_cast<const std::byte*>(data);
  v.nbytes = bytes;
  v.file = file;
  return v;
}

template <class RowFn>
std::unique_ptr<packed_linear> quantize(const quantization_config& cfg, int64_t out, int64_t in,
                                        const RowFn& row, const std::string& name,
                                        const std::string& prefix, const std::string& file) {
  check_shape(cfg, out, in, name, file);
  const bool gptq = cfg.method == quant_method::gptq;
  const int64_t gs = group_rows(cfg, in), groups = in / gs;
  auto p = std::make_unique<packed_linear>();
  p->qweight.assign(size_t(in * out / 8), 0);
  p->qzeros.assign(size_t(groups * out / 8), 0);
  p->scales.assign(size_t(groups * out), 0);
  if (gptq) {
    p->g_idx.resize(size_t(in));
    for (int64_t i = 0; i < in; ++i)
      p->g_idx[size_t(i)] = int32_t(i / gs);
  }
  parallel_for(0, out / 8, 1, [&](int64_t c0, int64_t c1) {
    std::vector<uint8_t> q(size_t(8 * in));
    std::vector<uint8_t> z(size_t(8 * groups));
    std::vector<float> buf(static_cast<size_t>(in));
    for (int64_t c = c0; c < c1; ++c)
      quantize_block(cfg, c, out, in, row, name, file, *p, q, z, buf);
  });
  const auto shapes = expected_shapes(cfg, in, out);
  p->qweight_view = make_view(prefix + "qweight", dtype::i32, shapes.qweight, p->qweight.data(),
                              p->qweight.size() * 4, file);
  p->qzeros_view = make_view(prefix + "qzeros", dtype::i32, shapes.qzeros, p->qzeros.data(),
                             p->qzeros.size() * 4, file);
  p->scales_view = make_view(prefix + "scales", dtype::f16, shapes.scales, p->scales.data(),
                             p->scales.size() * 2, file);
  p->linear.qweight = &p->qweight_view;
  p->linear.qzeros = &p->qzeros_view;
  p->linear.scales = &p->scales_view;
  if (gptq) {
    p->g_idx_view = make_view(prefix + "g_idx", dtype::i32, shapes.g_idx, p->g_idx.data(),
                              p->g_idx.size() * 4, file);
    p->linear.g_idx = &p->g_idx_view;
  }
  p->linear.in_features = in;
  p->linear.out_features = out;
  return p;
}

/// Drops the resident pages of a mapped tensor (the whole pages inside it):
/// a private read-only file mapping refaults them from the file if read
/// again, so this only frees memory.
void release_pages(const tensor_view& t) {
  const auto page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const auto begin = (uintptr_t(t.data) + page - 1) / page * page;
  const auto end = (uintptr_t(t.data) + t.nbytes) / page * page;
  if (end > begin)
    ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

} // namespace

quantization_config rtn_config(quant_method method, int32_t group_size) {
  quantization_config c;
  c.method = method;
  c.bits = 4;
  c.group_size = group_size;
  c.sym = method == quant_method::gptq;
  c.desc_act = false;
  return c;
}

quantization_config rtn_int4_config() {
  return rtn_config(quant_method::awq, 128);
}

std::unique_ptr<packed_linear> rtn_quantize(const quantization_config& cfg,
                                            const tensor_view& weight, const std::string& prefix,
                                            const std::string& file) {
  if (weight.shape.size() != 2)
    throw model_error(weight.file, weight.name,
                      "int4 quantization needs a 2-D weight, got " + weight.shape_string());
  if (!is_float(weight.type))
    throw model_error(weight.file, weight.name, "int4 quantization needs a float weight, got "
                                                  + std::string(dtype_name(weight.type)));
  const int64_t out = weight.shape[0], in = weight.shape[1];
  const size_t esz = dtype_size(weight.type);
  const tensor_view* w = &weight;
  auto row = [w, in, esz](int64_t o, float* dst) {
    to_f32(w->type, w->data + size_t(o) * size_t(in) * esz, dst, size_t(in));
  };
  return quantize(cfg, out, in, row, weight.name, prefix, file);
}

std::unique_ptr<packed_linear> rtn_quantize(const quantization_config& cfg, const float* w,
                                            int64_t out, int64_t in, const std::string& name,
                                            const std::string& prefix, const std::string& file) {
  auto row = [w, in](int64_t o, float* dst) {
    std::memcpy(dst, w + o * in, size_t(in) * sizeof(float));
  };
  return quantize(cfg, out, in, row, name, prefix, file);
}

void quantize_projections(model_folder& m, const quantization_config& cfg) {
  const std::string config_file = (m.dir / "config.json").string();
  if (m.config.quantization || m.weights.quantized)
    throw model_error(config_file, "quantization_config",
                      "--quantize int4 (model.quantize) needs a float checkpoint, but this one is "
                      "already quantized ("
                        + (m.config.quantization ? m.config.quantization->describe()
                                                 : std::string("4-bit tensors"))
                        + ")");
  if (cfg.group_size <= 0)
    throw std::invalid_argument("quantize_projections: group size "
                                + std::to_string(cfg.group_size) + " (must be positive)");
  static constexpr const char* names[num_projections] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  // Every shape first: a refusal must not leave a half-quantized model.
  for (const auto& layer : m.weights.layers)
    for (int p = 0; p < num_projections; ++p) {
      const tensor_view* w = layer.weight(projection(p));
      const int64_t out = w->shape.at(0), in = w->shape.at(1);
      if (in % cfg.group_size != 0)
        throw model_error(w->file, w->name,
                          "--quantize int4 needs in_features that are a multiple of the group "
                          "size " + std::to_string(cfg.group_size) + ", but this projection has "
                            + std::to_string(in) + " (out " + std::to_string(out) + " x in "
                            + std::to_string(in) + ")");
      if (out % 8 != 0)
        throw model_error(w->file, w->name,
                          "--quantize int4 needs out_features that are a multiple of 8, but "
                          "this projection has "
                            + std::to_string(out) + " (out " + std::to_string(out) + " x in "
                            + std::to_string(in) + ")");
    }
  for (size_t l = 0; l < m.weights.layers.size(); ++l) {
    auto& layer = m.weights.layers[l];
    for (int p = 0; p < num_projections; ++p) {
      const tensor_view* w = layer.weight(projection(p));
      const std::string prefix = "model.layers." + std::to_string(l) + "." + names[p] + ".";
      auto packed = rtn_quantize(cfg, *w, prefix, w->file);
      check_group_index(cfg, packed->linear);
      layer.quantized[size_t(p)] = packed->linear;
      layer.weight(projection(p)) = nullptr;
      release_pages(*w);
      m.owned_projections.push_back(std::shared_ptr<const packed_linear>(std::move(packed)));
    }
  }
  m.weights.quantized = !m.weights.layers.empty();
  m.config.quantization = cfg;
  m.quantized_at_load = true;
}

} // namespace metronome
