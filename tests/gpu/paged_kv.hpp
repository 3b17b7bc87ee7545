#pragma once
// A paged KV cache on the device for kernel tests: random, non-contiguous
// pages per sequence, sequence slots spread over the page table, unused table
// entries -1 (a kernel that reads one faults), pools poisoned, and optionally
// the cached positions filled with random values mirrored on the host.

#include <algorithm>
#include <numeric>

#include "model/dtype.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace metronome::test {

class paged_kv {
public:
  /// seqs: (start_pos, tokens) per sequence; this step's tokens follow
  /// start_pos. fill: write random K/V for every position < start + tokens.
  paged_kv(std::mt19937_64& rng, int32_t kv_heads, int32_t head_dim, int32_t page_size,
           std::vector<std::pair<int32_t, int32_t>> seqs, int32_t slot_spread, bool fill)
    : kv_heads_(kv_heads), head_dim_(head_dim), page_size_(page_size), seqs_(std::move(seqs)) {
    int32_t total_pages = 0;
    for (const auto& [start, n] : seqs_) {
      stride_ = std::max(stride_, (start + n + page_size - 1) / page_size);
      total_pages += (start + n + page_size - 1) / page_size;
    }
    total_pages += 3; // pages nobody owns
    std::vector<int32_t> order(static_cast<size_t>(total_pages), 0);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const int32_t slots = int32_t(seqs_.size()) * slot_spread + 1;
    table_.assign(size_t(slots) * stride_, -1);
    size_t next = 0;
    for (size_t s = 0; s < seqs_.size(); ++s) {
      slot_.push_back(int32_t(s) * slot_spread + (slot_spread > 1 ? 1 : 0));
      const auto [start, n] = seqs_[s];
      for (int32_t p = 0; p < (start + n + page_size - 1) / page_size; ++p)
        table_[size_t(slot_.back()) * stride_ + p] = order[next++];
      q_start_.push_back(int32_t(positions_.size()));
      seq_len_.push_back(start + n);
      for (int32_t i = 0; i < n; ++i) {
        positions_.push_back(start + i);
        token_seq_.push_back(int32_t(s));
      }
    }
    q_start_.push_back(int32_t(positions_.size()));
    pages_ = total_pages;
    const size_t elems = size_t(pages_) * kv_heads * page_size * head_dim;
    k_bits_.assign(elems, 0xffff);
    v_bits_.assign(elems, 0xffff);
    if (fill) {
      std::uniform_real_distribution<float> d(-1.0f, 1.0f);
      for (size_t s = 0; s < seqs_.size(); ++s)
        for (int32_t pos = 0; pos < seq_len_[s]; ++pos)
          for (int32_t h = 0; h < kv_heads; ++h)
            for (int32_t e = 0; e < head_dim; ++e) {
              k_bits_[index(int32_t(s), pos, h, e)] = f32_to_bf16(d(rng));
              v_bits_[index(int32_t(s), pos, h, e)] = f32_to_bf16(d(rng));
            }
    }
    k_ = std::make_unique<dev_array<gpu::bf16>>(elems);
    v_ = std::make_unique<dev_array<gpu::bf16>>(elems);
    METRONOME_CUDA(cudaMemcpy(k_->get(), k_bits_.data(), elems * 2, cudaMemcpyHostToDevice));
    METRONOME_CUDA(cudaMemcpy(v_->get(), v_bits_.data(), elems * 2, cudaMemcpyHostToDevice));
    d_table_ = std::make_unique<dev_array<int32_t>>(table_);
    d_positions_ = std::make_unique<dev_array<int32_t>>(positions_);
    d_token_seq_ = std::make_unique<dev_array<int32_t>>(token_seq_);
    d_slot_ = std::make_unique<dev_array<int32_t>>(slot_);
    d_q_start_ = std::make_unique<dev_array<int32_t>>(q_start_);
    d_seq_len_ = std::make_unique<dev_array<int32_t>>(seq_len_);
  }

  int32_t num_tokens() const {
    return int32_t(positions_.size());
  }
  int32_t num_seqs() const {
    return int32_t(seqs_.size());
  }
  int32_t position(int32_t t) const {
    return positions_[size_t(t)];
  }
  int32_t seq_of(int32_t t) const {
    return token_seq_[size_t(t)];
  }
  int32_t seq_len(int32_t s) const {
    return seq_len_[size_t(s)];
  }
  int32_t q_start(int32_t s) const {
    return q_start_[size_t(s)];
  }

  gpu::batch_view batch() const {
    gpu::batch_view b;
    b.num_tokens = num_tokens();
    b.num_seqs = num_seqs();
    b.positions = d_positions_->get();
    b.token_seq = d_token_seq_->get();
    b.seq_slot = d_slot_->get();
    b.seq_q_start = d_q_start_->get();
    b.seq_len = d_seq_len_->get();
    return b;
  }

  gpu::kv_view view() const {
    gpu::kv_view v;
    v.k = k_->get();
    v.v = v_->get();
    v.page_table = d_table_->get();
    v.page_table_stride = stride_;
    v.page_size = page_size_;
    v.kv_heads = kv_heads_;
    v.head_dim = head_dim_;
    return v;
  }

  /// Reads the device pools back (after a kernel wrote them).
  void download() {
    METRONOME_CUDA(cudaDeviceSynchronize());
    METRONOME_CUDA(
      cudaMemcpy(k_bits_.data(), k_->get(), k_bits_.size() * 2, cudaMemcpyDeviceToHost));
    METRONOME_CUDA(
      cudaMemcpy(v_bits_.data(), v_->get(), v_bits_.size() * 2, cudaMemcpyDeviceToHost));
  }

  /// Makes the cache's fp8 form (kv_view::k8) from the bf16 pools as they
  /// are now: each row quantized with its own scale (largest |value| / 448,
  /// f32_to_e4m3 as the GPU's writer rounds). Rows holding poison stay
  /// poison: NaN bytes (0x7f) and NaN scales.
  void make_fp8() {
    const size_t rows = k_bits_.size() / size_t(head_dim_);
    k8_bits_.assign(k_bits_.size(), 0x7f);
    v8_bits_.assign(v_bits_.size(), 0x7f);
    k_scale_.assign(rows, std::nanf(""));
    v_scale_.assign(rows, std::nanf(""));
    auto quantize = [&](const std::vector<uint16_t>& src, std::vector<uint8_t>& dst,
                        std::vector<float>& scale) {
      for (size_t r = 0; r < rows; ++r) {
        const uint16_t* x = src.data() + r * size_t(head_dim_);
        if (x[0] == 0xffff)
          continue;
        float amax = 0.0f;
        for (int32_t e = 0; e < head_dim_; ++e)
          amax = std::max(amax, std::fabs(bf16_to_f32(x[e])));
        scale[r] = amax * (1.0f / 448.0f);
        const float inv = amax >= 0x1p-100f ? 448.0f / amax : 0.0f;
        for (int32_t e = 0; e < head_dim_; ++e)
          dst[r * size_t(head_dim_) + size_t(e)] = f32_to_e4m3(bf16_to_f32(x[e]) * inv);
      }
    };
    quantize(k_bits_, k8_bits_, k_scale_);
    quantize(v_bits_, v8_bits_, v_scale_);
    k8_ = std::make_unique<dev_array<uint8_t>>(k8_bits_);
    v8_ = std::make_unique<dev_array<uint8_t>>(v8_bits_);
    d_k_scale_ = std::make_unique<dev_array<float>>(k_scale_);
    d_v_scale_ = std::make_unique<dev_array<float>>(v_scale_);
  }

  /// view() with the fp8 form (after make_fp8()).
  gpu::kv_view view8() const {
    gpu::kv_view v = view();
    v.k8 = k8_->get();
    v.v8 = v8_->get();
    v.k_scale = d_k_scale_->get();
    v.v_scale = d_v_scale_->get();
    return v;
  }

  /// Reads the fp8 form back (after a kernel wrote it).
  void download8() {
    METRONOME_CUDA(cudaDeviceSynchronize());
    k8_bits_ = k8_->download();
    v8_bits_ = v8_->download();
    k_scale_ = d_k_scale_->download();
    v_scale_ = d_v_scale_->download();
  }

  /// The values the fp8 form stands for.
  float k8_at(int32_t seq, int32_t pos, int32_t h, int32_t e) const {
    const size_t i = index(seq, pos, h, e);
    return e4m3_to_f32(k8_bits_[i]) * k_scale_[i / size_t(head_dim_)];
  }
  float v8_at(int32_t seq, int32_t pos, int32_t h, int32_t e) const {
    const size_t i = index(seq, pos, h, e);
    return e4m3_to_f32(v8_bits_[i]) * v_scale_[i / size_t(head_dim_)];
  }

  /// Whether both fp8 forms hold the same bytes and scales everywhere except
  /// in the rows of this step's tokens (after download8()).
  bool same_fp8_outside_step(const paged_kv& o) const {
    std::vector<bool> step(k_scale_.size(), false);
    for (int32_t t = 0; t < num_tokens(); ++t)
      for (int32_t h = 0; h < kv_heads_; ++h)
        step[index(seq_of(t), position(t), h, 0) / size_t(head_dim_)] = true;
    for (size_t r = 0; r < step.size(); ++r) {
      if (step[r])
        continue;
      if (!same_scale(k_scale_[r], o.k_scale_[r]) || !same_scale(v_scale_[r], o.v_scale_[r]))
        return false;
      for (size_t e = r * size_t(head_dim_); e < (r + 1) * size_t(head_dim_); ++e)
        if (k8_bits_[e] != o.k8_bits_[e] || v8_bits_[e] != o.v8_bits_[e])
          return false;
    }
    return true;
  }

  /// Whether both fp8 forms hold the same bytes and scales everywhere
  /// (after download8()); NaN scales (poison) compare equal.
  bool same_fp8(const paged_kv& o) const {
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return std::equal(a.begin(), a.end(), b.begin(), b.end(), same_scale);
    };
    return k8_bits_ == o.k8_bits_ && v8_bits_ == o.v8_bits_ && same(k_scale_, o.k_scale_)
           && same(v_scale_, o.v_scale_);
  }

  float k_at(int32_t seq, int32_t pos, int32_t h, int32_t e) const {
    return bf16_to_f32(k_bits_[index(seq, pos, h, e)]);
  }
  float v_at(int32_t seq, int32_t pos, int32_t h, int32_t e) const {
    return bf16_to_f32(v_bits_[index(seq, pos, h, e)]);
  }

  /// Whether both caches hold the same bits in every pool element (after
  /// download()): the same rows written, with the same values.
  bool same_pools(const paged_kv& o) const {
    return k_bits_ == o.k_bits_ && v_bits_ == o.v_bits_;
  }

  /// Elements of K and V that are not poison.
  size_t count_written() const {
    size_t n = 0;
    for (auto b : k_bits_)
      n += b != 0xffff;
    for (auto b : v_bits_)
      n += b != 0xffff;
    return n;
  }

private:
  /// Two scales are the same when equal or both NaN (poison).
  static bool same_scale(float a, float b) {
    return (std::isnan(a) && std::isnan(b)) || a == b;
  }

  size_t index(int32_t seq, int32_t pos, int32_t h, int32_t e) const {
    const int32_t page = table_[size_t(slot_[size_t(seq)]) * stride_ + pos / page_size_];
    return ((size_t(page) * kv_heads_ + h) * page_size_ + pos % page_size_) * head_dim_ + e;
  }

  int32_t kv_heads_, head_dim_, page_size_;
  std::vector<std::pair<int32_t, int32_t>> seqs_;
  int32_t stride_ = 1, pages_ = 0;
  std::vector<int32_t> table_, slot_, q_start_, seq_len_, positions_, token_seq_;
  std::vector<uint16_t> k_bits_, v_bits_;
  std::unique_ptr<dev_array<gpu::bf16>> k_, v_;
  std::vector<uint8_t> k8_bits_, v8_bits_;
  std::vector<float> k_scale_, v_scale_;
  std::unique_ptr<dev_array<uint8_t>> k8_, v8_;
  std::unique_ptr<dev_array<float>> d_k_scale_, d_v_scale_;
  std::unique_ptr<dev_array<int32_t>> d_table_, d_positions_, d_token_seq_, d_slot_, d_q_start_,
    d_seq_len_;
};

} // namespace metronome::test
