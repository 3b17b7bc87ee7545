// Paged decode attention (with and without split-K) and the flash-style
// prefill attention against ref::attend, over random pages, GQA ratios 1 to 8,
// odd lengths, page boundaries, chunked prefill from cached pages, sliding
// windows and batches of mixed lengths.

#include <cmath>

#include "model/cpu_ops.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/paged_kv.hpp"

namespace metronome {
namespace {

using gpu::bf16;
using test::dev_array;

struct attn_case {
  int32_t heads, kv_heads, head_dim, page_size, window;
  std::vector<std::pair<int32_t, int32_t>> seqs; // (cached before, tokens now)
};

std::string name_of(const attn_case& c) {
  std::string s = "heads " + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " d "
                  + std::to_string(c.head_dim) + " page " + std::to_string(c.page_size)
                  + " window " + std::to_string(c.window) + " seqs";
  for (auto [a, b] : c.seqs)
    s += " (" + std::to_string(a) + "+" + std::to_string(b) + ")";
  return s;
}

/// ref::attend for every token and head of the step.
std::vector<float> reference(const attn_case& c, const test::paged_kv& kv,
                             const std::vector<float>& q) {
  const int32_t d = c.head_dim, group = c.heads / c.kv_heads;
  const float scale = 1.0f / std::sqrt(float(d));
  std::vector<float> out(q.size());
  for (int32_t s = 0; s < kv.num_seqs(); ++s) {
    const int32_t len = kv.seq_len(s);
    for (int32_t g = 0; g < c.kv_heads; ++g) {
      std::vector<float> keys(size_t(len) * d), values(size_t(len) * d);
      for (int32_t j = 0; j < len; ++j)
        for (int32_t e = 0; e < d; ++e) {
          keys[size_t(j) * d + e] = kv.k_at(s, j, g, e);
          values[size_t(j) * d + e] = kv.v_at(s, j, g, e);
        }
      std::vector<float> scores(static_cast<size_t>(len), 0.0f);
      for (int32_t t = kv.q_start(s); t < kv.q_start(s + 1); ++t) {
        const int32_t pos = kv.position(t);
        const int64_t first = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
        for (int32_t h = g * group; h < (g + 1) * group; ++h) {
          const size_t off = (size_t(t) * c.heads + h) * d;
          ref::attend(
            q.data() + off, d, first, pos, scale,
            [&](int64_t j) { return keys.data() + j * d; },
            [&](int64_t j) { return values.data() + j * d; }, scores.data(), out.data() + off);
        }
      }
    }
  }
  for (auto& x : out)
    x = test::round_bf16(x);
  return out;
}

TEST(gpu_attention, decode_matches_reference_with_and_without_splits) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("decode_attention");
  std::vector<attn_case> cases = {
    {4, 2, 16, 16, 0, {{4, 1}, {15, 1}, {16, 1}, {0, 1}}},
    {4, 1, 16, 16, 16, {{40, 1}, {15, 1}, {16, 1}}},
    {32, 8, 64, 16, 0, {{127, 1}, {1000, 1}}},
    {32, 8, 128, 16, 0, {{4095, 1}}},
    {32, 8, 128, 16, 0, {{20000, 1}, {129, 1}, {300, 1}}},
    {32, 32, 128, 16, 0, {{63, 1}, {64, 1}, {300, 1}}},
    {32, 16, 128, 7, 100, {{513, 1}, {6, 1}}},
    {16, 2, 64, 16, 0, {{77, 1}, {2, 1}, {129, 1}}},
    {12, 2, 128, 16, 0, {{33, 1}}},
    {8, 1, 256, 16, 0, {{70, 1}}},
    {4, 4, 32, 16, 0, {{9, 1}}},
  };
  if (test::quick_mode())
    cases.resize(3);
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c));
    test::paged_kv kv(rng, c.kv_heads, c.head_dim, c.page_size, c.seqs, 3, true);
    const size_t qn = size_t(kv.num_tokens()) * c.heads * c.head_dim;
    auto q = test::from_bf16(test::to_bf16(test::random_floats(rng, qn, -1, 1)));
    auto d_q = test::upload_bf16(q);
    const auto want = reference(c, kv, q);
    gpu::attention_shape sh{c.heads, c.kv_heads, c.head_dim, c.window,
                            1.0f / std::sqrt(float(c.head_dim))};
    for (int32_t splits : {1, 3, gpu::decode_attention_splits(sh, kv.num_seqs(), 132), 64}) {
      dev_array<float> part_o(size_t(kv.num_seqs()) * c.heads * splits * c.head_dim);
      dev_array<float> part_ml(size_t(kv.num_seqs()) * c.heads * splits * 2);
      dev_array<int32_t> counters(std::vector<int32_t>(size_t(kv.num_seqs()) * c.heads, 0));
      dev_array<bf16> out(qn);
      gpu::launch_decode_attention(sh, d_q.get(), kv.view(), kv.batch(), splits, part_o.get(),
                                   part_ml.get(), counters.get(), out.get(), nullptr);
      test::sync_check();
      EXPECT_LT(test::relative_error(test::download_bf16(out), want), 5e-3) << "splits " << splits;
      // The merging block leaves every counter at zero for the next launch.
      for (auto v : counters.download())
        ASSERT_EQ(v, 0) << "splits " << splits;
    }
  }
}

TEST(gpu_attention, prefill_matches_reference_for_chunks_over_cached_pages) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("prefill_attention");
  std::vector<attn_case> cases = {
    {4, 2, 16, 16, 0, {{0, 5}, {0, 13}, {0, 29}}},
    {4, 1, 16, 16, 16, {{0, 40}, {20, 7}}},
    {32, 8, 64, 16, 0, {{0, 64}, {0, 65}, {37, 1}, {100, 200}}},
    {32, 8, 128, 16, 0, {{0, 130}, {1000, 64}}},
    {32, 32, 128, 7, 0, {{5, 63}, {0, 1}}},
    {32, 16, 128, 16, 100, {{150, 90}, {0, 170}}},
    {16, 2, 64, 16, 0, {{64, 64}, {3, 3}}},
    {8, 1, 256, 16, 0, {{10, 70}}},
    {8, 8, 32, 16, 0, {{0, 33}}},
  };
  if (test::quick_mode())
    cases.resize(3);
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c));
    test::paged_kv kv(rng, c.kv_heads, c.head_dim, c.page_size, c.seqs, 2, true);
    const size_t qn = size_t(kv.num_tokens()) * c.heads * c.head_dim;
    auto q = test::from_bf16(test::to_bf16(test::random_floats(rng, qn, -1, 1)));
    auto d_q = test::upload_bf16(q);
    const auto want = reference(c, kv, q);
    std::vector<gpu::prefill_item> items;
    for (int32_t s = 0; s < kv.num_seqs(); ++s)
      for (int32_t r = 0; r < c.seqs[size_t(s)].second; r += gpu::prefill_tile)
        items.push_back({s, r});
    std::reverse(items.begin(), items.end());
    dev_array<gpu::prefill_item> d_items(items);
    dev_array<bf16> out(qn);
    gpu::attention_shape sh{c.heads, c.kv_heads, c.head_dim, c.window,
                            1.0f / std::sqrt(float(c.head_dim))};
    gpu::launch_prefill_attention(sh, d_q.get(), kv.view(), kv.batch(), d_items.get(),
                                  int32_t(items.size()), out.get(), nullptr);
    test::sync_check();
    EXPECT_LT(test::relative_error(test::download_bf16(out), want), 1e-2);
  }
}

} // namespace
} // namespace metronome
