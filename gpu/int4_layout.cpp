#include "gpu/int4_layout.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "model/model_error.hpp"
#include "model/parallel.hpp"

namespace metronome::gpu {

namespace {

uint16_t half_at(const tensor_view& t, int64_t index) {
  uint16_t v;
  std::memcpy(&v, t.data + size_t(index) * 2, 2);
  return v;
}

} // namespace

float half_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const int32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(mant), -24); // zero or subnormal
  } else if (exp == 31) {
    f = mant ? std::nanf("") : INFINITY;
  } else {
    const uint32_t bits = (uint32_t(exp - 15 + 127) << 23) | (mant << 13);
    std::memcpy(&f, &bits, 4);
  }
  return sign ? -f : f;
}

bool int4_kernels_take(int64_t cols, int32_t group_size) {
  if (cols <= 0 || cols % 32 != 0)
    return false;
  return group_size < 0 || group_size % 32 == 0;
}

int4_layout repack_int4(const quantization_config& cfg, const quantized_linear& p) {
  const int64_t in = p.in_features, out = p.out_features;
  const int64_t groups = cfg.num_groups(in);
  const int32_t gs = cfg.group_size < 0 ? int32_t(in) : cfg.group_size;
  if (p.scales->type != dtype::f16)
    throw model_error(p.scales->file, p.scales->name, "scales must be F16");
  int4_layout m;
  m.rows = out;
  m.cols = in;
  m.group_size = gs;

  // The group of each input row; act-order sorts rows by group, and each
  // group must then be a run of gs rows (the last may be shorter).
  std::vector<int32_t> group(static_cast<size_t>(in));
  for (int64_t i = 0; i < in; ++i)
    group[size_t(i)] = p.g_idx ? int32_t(packed_word(*p.g_idx, i)) : int32_t(i / gs);
  bool in_order = true;
  for (int64_t i = 0; i < in && in_order; ++i)
    in_order = group[size_t(i)] == int32_t(i / gs);
  std::vector<int32_t> order; // stored column j is input order[j]
  if (!in_order) {
    order.resize(size_t(in));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return group[size_t(a)] < group[size_t(b)]; });
    for (int64_t j = 0; j < in; ++j)
      if (group[size_t(order[size_t(j)])] != int32_t(j / gs))
        throw model_error(p.g_idx->file, p.g_idx->name,
                          "act-order groups are not runs of " + std::to_string(gs)
                            + " rows once sorted (group " + std::to_string(j / gs) + " holds "
                            + (group[size_t(order[size_t(j)])] > int32_t(j / gs) ? "fewer"
                                                                                 : "more")
                            + "): the CUDA runner cannot serve this layout");
    m.perm = order;
  }

  // Tiles of output rows, read in the checkpoint's own order into one
  // nibble per byte, then packed along the stored columns.
  const bool gptq = cfg.method == quant_method::gptq;
  const int64_t zero_words = out / 8, row_words = in / 8;
  constexpr int64_t tile = 64;
  m.q.assign(size_t(out * row_words), 0u);
  m.scale_zero.assign(size_t(out * groups), 0u);
  parallel_for(0, (out + tile - 1) / tile, 1, [&](int64_t lo, int64_t hi) {
    std::vector<uint8_t> nib(size_t(tile * in));
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t o0 = t * tile, o1 = std::min(out, o0 + tile);
      if (gptq) {
        for (int64_t iw = 0; iw < row_words; ++iw)
          for (int64_t o = o0; o < o1; ++o) {
            const uint32_t wd = packed_word(*p.qweight, iw * out + o);
            for (int e = 0; e < 8; ++e)
              nib[size_t((o - o0) * in + 8 * iw + e)] = uint8_t(packed_nibble(wd, e));
          }
      } else {
        for (int64_t i = 0; i < in; ++i)
          for (int64_t c = o0 / 8; c < o1 / 8; ++c) {
            const uint32_t wd = packed_word(*p.qweight, i * zero_words + c);
            for (int j = 0; j < 8; ++j)
              nib[size_t((8 * c + j - o0) * in + i)] = uint8_t(packed_nibble(wd, awq_reverse[j]));
          }
      }
      for (int64_t o = o0; o < o1; ++o) {
        const uint8_t* src = nib.data() + (o - o0) * in;
        uint32_t* qrow = m.q.data() + o * row_words;
        for (int64_t j = 0; j < in; ++j) {
          const int64_t i = m.perm.empty() ? j : m.perm[size_t(j)];
          qrow[j / 8] |= uint32_t(src[i]) << (4 * (j % 8));
        }
        const int k_out = gptq ? int(o % 8) : awq_reverse[o % 8];
        for (int64_t g = 0; g < groups; ++g) {
          uint32_t zero = packed_nibble(packed_word(*p.qzeros, g * zero_words + o / 8), k_out);
          if (gptq)
            zero += 1; // v1 stores zero - 1 (docs/quantization.md)
          m.scale_zero[size_t(o * groups + g)] = uint32_t(half_at(*p.scales, g * out + o))
                                                 | (zero << 16);
        }
      }
    }
  });
  return m;
}

std::optional<int4_layout> stack_int4(std::vector<int4_layout> parts, std::string* why) {
  auto refuse = [&](const std::string& reason) -> std::optional<int4_layout> {
    if (why)
      *why = reason;
    return std::nullopt;
  };
  if (parts.empty())
    return refuse("nothing to stack");
  int4_layout s;
  s.cols = parts.front().cols;
  s.group_size = parts.front().group_size;
  s.perm = parts.front().perm;
  for (const auto& p : parts) {
    if (p.cols != s.cols || p.group_size != s.group_size)
      return refuse("their inputs or group sizes differ");
    if (p.perm != s.perm)
      return refuse("their act-order input permutations (g_idx) differ");
  }
  for (auto& p : parts) {
    s.rows += p.rows;
    s.q.insert(s.q.end(), p.q.begin(), p.q.end());
    s.scale_zero.insert(s.scale_zero.end(), p.scale_zero.begin(), p.scale_zero.end());
    p = int4_layout{};
  }
  return s;
}

void dequantize(const int4_layout& m, float* w) {
  const int64_t groups = m.groups(), row_words = m.cols / 8;
  parallel_for(0, m.rows, 8, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      float* row = w + r * m.cols;
      for (int64_t j = 0; j < m.cols; ++j) {
        const uint32_t sz = m.scale_zero[size_t(r * groups + j / m.group_size)];
        const float scale = half_bits_to_float(uint16_t(sz & 0xFFFFu));
        const int32_t zero = int32_t((sz >> 16) & 0xFFu);
        const int32_t q = int32_t(packed_nibble(m.q[size_t(r * row_words + j / 8)], int(j % 8)));
        const int64_t i = m.perm.empty() ? j : m.perm[size_t(j)];
        row[i] = scale * float(q - zero);
      }
    }
  });
}

} // namespace metronome::gpu
