// Paged decode attention (with and without split-K) and the flash-style
// prefill attention against ref::attend, over random pages, GQA ratios 1 to 8,
// odd lengths, page boundaries, chunked prefill from cached pages, sliding
// windows and batches of mixed lengths; both kernel generations.

#include <cmath>

#include <set>

#include "gpu/decode_attention_layout.hpp"
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

/// ref::attend for every token and head of the step, over the bf16 cache or
/// the values its fp8 form stands for.
std::vector<float> reference(const attn_case& c, const test::paged_kv& kv,
                             const std::vector<float>& q, bool fp8 = false) {
  const int32_t d = c.head_dim, group = c.heads / c.kv_heads;
  const float scale = 1.0f / std::sqrt(float(d));
  std::vector<float> out(q.size());
  for (int32_t s = 0; s < kv.num_seqs(); ++s) {
    const int32_t len = kv.seq_len(s);
    for (int32_t g = 0; g < c.kv_heads; ++g) {
      std::vector<float> keys(size_t(len) * d), values(size_t(len) * d);
      for (int32_t j = 0; j < len; ++j)
        for (int32_t e = 0; e < d; ++e) {
          keys[size_t(j) * d + e] = fp8 ? kv.k8_at(s, j, g, e) : kv.k_at(s, j, g, e);
          values[size_t(j) * d + e] = fp8 ? kv.v8_at(s, j, g, e) : kv.v_at(s, j, g, e);
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

/// One decode case's inputs: random pages and q (bf16 values), the
/// reference output and the kernel's shape.
struct decode_inputs {
  test::paged_kv kv;
  size_t qn;
  std::vector<float> q;
  dev_array<bf16> d_q;
  std::vector<float> want;
  gpu::attention_shape sh;

  decode_inputs(std::mt19937_64& rng, const attn_case& c)
    : kv(rng, c.kv_heads, c.head_dim, c.page_size, c.seqs, 3, true),
      qn(size_t(kv.num_tokens()) * c.heads * c.head_dim),
      q(test::from_bf16(test::to_bf16(test::random_floats(rng, qn, -1, 1)))),
      d_q(test::upload_bf16(q)), want(reference(c, kv, q)),
      sh{c.heads, c.kv_heads, c.head_dim, c.window, 1.0f / std::sqrt(float(c.head_dim))} {
  }
};

// The launcher's split rule (host arithmetic: runs without a device too).
// About two blocks an SM, but a grid that overshoots the blocks the SMs hold
// at once leaves a second wave of a few blocks that costs a whole block's
// time, so the splits stop at one wave.
TEST(gpu_attention, decode_splits_aim_at_two_blocks_an_sm_within_one_wave) {
  gpu::attention_shape sh{32, 8, 128, 0, 1.0f};
  for (int32_t per_sm : {1, 2, 4})
    for (int32_t sms : {8, 78, 132})
      for (int32_t seqs = 1; seqs <= 256; ++seqs) {
        SCOPED_TRACE(std::to_string(seqs) + " sequences, " + std::to_string(sms) + " SMs of "
                     + std::to_string(per_sm) + " blocks");
        const int32_t splits = gpu::decode_attention_splits(sh, seqs, sms, per_sm);
        const int32_t blocks = seqs * sh.kv_heads;
        const int32_t wanted = std::min(64, (2 * sms + blocks - 1) / blocks);
        ASSERT_GE(splits, 1);
        ASSERT_LE(splits, wanted);
        if (splits > 1) {
          EXPECT_LE(splits * blocks, per_sm * sms); // no second wave
        }
        if (splits < wanted) {
          EXPECT_GT((splits + 1) * blocks, per_sm * sms); // as many as one wave holds
        }
      }
  // Worked values on the H200 (132 SMs). head_dim 128 (2 blocks an SM): 33
  // splits for one sequence (264 blocks), 4 for 8 (256), 1 from 17 on (2 at
  // 32 before: 512 blocks). head_dim 64 (4 blocks an SM): 5 for 8 (320), 2
  // for 24 (384), as before.
  EXPECT_EQ(gpu::decode_attention_splits(sh, 1, 132, 2), 33);
  EXPECT_EQ(gpu::decode_attention_splits(sh, 8, 132, 2), 4);
  EXPECT_EQ(gpu::decode_attention_splits(sh, 32, 132, 2), 1);
  EXPECT_EQ(gpu::decode_attention_splits(sh, 8, 132, 4), 5);
  EXPECT_EQ(gpu::decode_attention_splits(sh, 24, 132, 4), 2);
}

// Two warps a block where the grid needs more than one wave of 4-warp blocks
// and at least twice the waves of 2-warp blocks (twice as many an SM), four
// otherwise; forced either way by METRONOME_KERNELS=awarps
// (active_kernels().attention_warps).
TEST(gpu_attention, decode_warps_halve_where_that_halves_the_waves) {
  gpu::attention_shape sh{32, 8, 128, 0, 1.0f};
  const int saved = gpu::active_kernels().attention_warps;
  gpu::active_kernels().attention_warps = 0;
  for (int32_t per_sm : {1, 2, 3, 4})
    for (int32_t sms : {8, 132})
      for (int32_t seqs = 1; seqs <= 512; ++seqs) {
        const int32_t splits = gpu::decode_attention_splits(sh, seqs, sms, per_sm);
        const int32_t blocks = seqs * sh.kv_heads * splits;
        const int32_t slots = per_sm * sms;
        const int32_t waves4 = (blocks + slots - 1) / slots;
        const int32_t waves2 = (blocks + 2 * slots - 1) / (2 * slots);
        const int32_t warps = gpu::decode_attention_warps(sh, seqs, splits, sms, per_sm);
        SCOPED_TRACE(std::to_string(seqs) + " sequences, " + std::to_string(sms) + " SMs of "
                     + std::to_string(per_sm) + " blocks");
        if (blocks <= slots) {
          EXPECT_EQ(warps, 4); // one wave either way: keep the loads in flight
        } else if (blocks <= 2 * slots) {
          EXPECT_EQ(warps, 2); // one wave instead of two
        } else {
          EXPECT_EQ(warps, 2 * waves2 <= waves4 ? 2 : 4);
        }
      }
  // The H200's shapes (132 SMs). 8B (head_dim 128, 2 blocks an SM): from 34
  // sequences (272 blocks on 264 slots) to 66 (528), then 4 at 96 (768
  // blocks: 3 waves against 2 of twice the time), 2 at 128 (1,024: 4
  // against 2). 1B (head_dim 64, 4 an SM): from 67 sequences on to 132.
  EXPECT_EQ(gpu::decode_attention_warps(sh, 33, 1, 132, 2), 4);
  EXPECT_EQ(gpu::decode_attention_warps(sh, 34, 1, 132, 2), 2);
  EXPECT_EQ(gpu::decode_attention_warps(sh, 64, 1, 132, 2), 2);
  EXPECT_EQ(gpu::decode_attention_warps(sh, 96, 1, 132, 2), 4);
  EXPECT_EQ(gpu::decode_attention_warps(sh, 128, 1, 132, 2), 2);
  EXPECT_EQ(gpu::decode_attention_warps(sh, 1, 33, 132, 2), 4);
  EXPECT_EQ(gpu::decode_attention_warps(sh, 64, 1, 132, 4), 4);
  EXPECT_EQ(gpu::decode_attention_warps(sh, 67, 1, 132, 4), 2);
  EXPECT_EQ(gpu::decode_attention_warps(sh, 128, 1, 132, 4), 2);
  // The 8B shape with the fp8 cache (its kernel: 160 registers, 3 blocks an
  // SM): 4 warps at 48 sequences (384 blocks, one wave of 396 slots), 2 at
  // 64 (512), 4 at 128 (1,024: 3 waves against 2 of twice the time), each
  // the fastest in a kernel sweep on the H200 (42.0, 58.5, 99.0 us).
  EXPECT_EQ(gpu::decode_attention_warps(sh, 48, 1, 132, 3), 4);
  EXPECT_EQ(gpu::decode_attention_warps(sh, 64, 1, 132, 3), 2);
  EXPECT_EQ(gpu::decode_attention_warps(sh, 128, 1, 132, 3), 4);
  gpu::active_kernels().attention_warps = 4;
  EXPECT_EQ(gpu::decode_attention_warps(sh, 64, 1, 132, 2), 4);
  gpu::active_kernels().attention_warps = 2;
  EXPECT_EQ(gpu::decode_attention_warps(sh, 1, 33, 132, 2), 2);
  gpu::active_kernels().attention_warps = saved;
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
    {28, 4, 128, 16, 0, {{1023, 1}, {17, 1}}},
    {28, 4, 128, 32, 333, {{1500, 1}, {40, 1}}},
    {64, 8, 64, 16, 0, {{4100, 1}}},
  };
  if (test::quick_mode())
    cases.resize(3);
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c));
    decode_inputs in(rng, c);
    auto& kv = in.kv;
    const size_t qn = in.qn;
    auto& d_q = in.d_q;
    const auto& want = in.want;
    const auto& sh = in.sh;
    for (int gen : {2, 1}) {
      test::kernel_generation_scope scope(gen);
      for (int32_t splits : {1, 3, gpu::decode_attention_splits(sh, kv.num_seqs(), 132, 2), 64})
        for (int32_t warps : {4, 2}) {
          if (gen == 1 && warps == 2)
            continue; // the first generation has one form
          SCOPED_TRACE("generation " + std::to_string(gen) + " splits " + std::to_string(splits)
                       + " warps " + std::to_string(warps));
          dev_array<float> part_o(size_t(kv.num_seqs()) * c.heads * splits * c.head_dim);
          dev_array<float> part_ml(size_t(kv.num_seqs()) * c.heads * splits * 2);
          dev_array<int32_t> counters(std::vector<int32_t>(size_t(kv.num_seqs()) * c.heads, 0));
          dev_array<bf16> out(qn);
          gpu::launch_decode_attention(sh, d_q.get(), kv.view(), kv.batch(), splits, warps,
                                       part_o.get(), part_ml.get(), counters.get(), out.get(),
                                       nullptr);
          test::sync_check();
          EXPECT_LT(test::relative_error(test::download_bf16(out), want), 5e-3);
          // The merging block leaves every counter at zero for the next launch.
          for (auto v : counters.download())
            ASSERT_EQ(v, 0);
        }
    }
  }
}

// The work list of balanced splits (host arithmetic: runs without a device).
// Each sequence's items are contiguous and numbered, large batches of equal
// contexts keep one split a sequence (the device rule's), and a long
// context is cut so that no item holds much more than its share of the keys.
TEST(gpu_attention, decode_work_lists_balance_long_contexts_over_items) {
  gpu::attention_shape sh{32, 8, 128, 0, 1.0f};
  EXPECT_EQ(gpu::decode_attention_work_items(sh, 8, 132, 2), 0) << "small batches: device rule";
  auto list = [&](const std::vector<int32_t>& lens) {
    const int32_t n = int32_t(lens.size());
    const int32_t items = gpu::decode_attention_work_items(sh, n, 132, 2);
    EXPECT_GT(items, 0);
    std::vector<int32_t> work(size_t(items), 7);
    const int32_t used = gpu::decode_attention_work(sh, lens.data(), n, 132, 2, work.data(), items);
    std::vector<int32_t> splits(size_t(n), 0);
    int32_t prev_seq = -1, expect_split = 0;
    for (int32_t i = 0; i < items; ++i) {
      const int32_t w = work[size_t(i)];
      if (i >= used) {
        EXPECT_EQ(w, -1) << "item " << i;
        continue;
      }
      const int32_t b = w >> 16, count = (w >> 8) & 0xff, split = w & 0xff;
      if (b != prev_seq) {
        EXPECT_EQ(b, prev_seq + 1) << "sequences in order, none left out";
        expect_split = 0;
        prev_seq = b;
      }
      EXPECT_EQ(split, expect_split++);
      EXPECT_LT(split, count);
      splits[size_t(b)] = count;
    }
    EXPECT_EQ(prev_seq, n - 1);
    for (int32_t b = 0; b < n; ++b)
      EXPECT_GT(splits[size_t(b)], 0) << "sequence " << b << " has no item";
    return splits;
  };
  for (auto s : list(std::vector<int32_t>(64, 1024)))
    EXPECT_EQ(s, 1);
  for (auto s : list(std::vector<int32_t>(32, 2048)))
    EXPECT_EQ(s, 1) << "one wave already: no second";
  std::vector<int32_t> skewed(60, 512);
  skewed.insert(skewed.end(), 4, 8704);
  const auto sk = list(skewed);
  int64_t total = 0, items_used = 0;
  for (size_t b = 0; b < skewed.size(); ++b) {
    total += skewed[b];
    items_used += sk[b];
  }
  double worst = 0;
  for (size_t b = 0; b < skewed.size(); ++b)
    worst = std::max(worst, double(skewed[b]) / sk[b]);
  EXPECT_GE(sk.back(), 6) << "a long context is cut";
  EXPECT_EQ(sk.front(), 1);
  EXPECT_LE(worst, 2.0 * double(total) / double(items_used)) << "no item holds far more keys";
  // Past the most splits a sequence may have: capped, still valid.
  std::vector<int32_t> extreme(15, 1);
  extreme.push_back(1 << 20);
  EXPECT_EQ(list(extreme).back(), gpu::decode_attention_work_splits());
}

// Listed batches (balanced splits) against the reference: large batches of
// mixed lengths, a few long, on both cache layouts' shapes and a window.
TEST(gpu_attention, decode_with_a_work_list_matches_reference) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("decode_attention_work");
  auto batch = [](std::vector<int32_t> longs, int32_t shorts) {
    std::vector<std::pair<int32_t, int32_t>> s;
    for (int32_t i = 0; i < shorts; ++i)
      s.push_back({3 + 37 * i % 211, 1});
    for (auto l : longs)
      s.push_back({l, 1});
    return s;
  };
  std::vector<attn_case> cases = {
    {32, 8, 128, 16, 0, batch({9000, 2500}, 18)},
    {16, 2, 64, 16, 0, batch({4000}, 20)},
    {28, 4, 128, 32, 333, batch({1500, 700}, 16)},
    {4, 2, 16, 16, 0, batch({}, 17)},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c));
    decode_inputs in(rng, c);
    auto& kv = in.kv;
    const size_t qn = in.qn;
    auto& d_q = in.d_q;
    const auto& want = in.want;
    const auto& sh = in.sh;
    const int32_t n = kv.num_seqs();
    std::vector<int32_t> lens;
    for (int32_t s = 0; s < n; ++s)
      lens.push_back(kv.seq_len(s));
    const int32_t items = gpu::decode_attention_work_items(sh, n, 132, 2);
    ASSERT_GT(items, 0);
    std::vector<int32_t> work(static_cast<size_t>(items), 0);
    gpu::decode_attention_work(sh, lens.data(), n, 132, 2, work.data(), items);
    int32_t most = 0;
    for (int32_t i = 0; i < items; ++i)
      most = std::max(most, work[size_t(i)] < 0 ? 0 : (work[size_t(i)] >> 8) & 0xff);
    if (c.head_dim >= 64)
      EXPECT_GT(most, 1) << "the case should split a long context";
    dev_array<int32_t> d_work(work);
    auto b = kv.batch();
    b.work = d_work.get();
    b.work_items = items;
    const int32_t splits = gpu::decode_attention_work_splits();
    for (int32_t warps : {4, 2}) {
      SCOPED_TRACE("warps " + std::to_string(warps));
      dev_array<float> part_o(size_t(n) * c.heads * splits * c.head_dim);
      dev_array<float> part_ml(size_t(n) * c.heads * splits * 2);
      dev_array<int32_t> counters(std::vector<int32_t>(size_t(n) * c.heads, 0));
      dev_array<bf16> out(qn);
      gpu::launch_decode_attention(sh, d_q.get(), kv.view(), b, splits, warps, part_o.get(),
                                   part_ml.get(), counters.get(), out.get(), nullptr);
      test::sync_check();
      EXPECT_LT(test::relative_error(test::download_bf16(out), want), 5e-3);
      for (auto v : counters.download())
        ASSERT_EQ(v, 0);
    }
  }
}

// The lanes' share of a row in the decode attention (host arithmetic, so CI
// checks it): for each head dim and both layouts (bf16's, and the fp8 cache's
// 16-byte runs), the 4 lanes of a K row and the 8 of a V row hold every dim
// exactly once; a lane's runs are contiguous and the lanes' runs of one load
// sit side by side (whole sectors a load instruction); the fp8 layout's runs
// are 16 bytes where a row has room for them; and the fused RoPE finds each
// dim's partner (d + D/2 mod D) where the kernel looks for it: in the same
// lane's other run, or in lane t ^ 2.
template <int D, bool WIDE>
void check_decode_layout() {
  using C = gpu::decode_layout::tc_cfg<D, WIDE>;
  SCOPED_TRACE("head_dim " + std::to_string(D) + (WIDE ? " fp8 layout" : " bf16 layout"));
  std::multiset<int> k_dims, v_dims;
  for (int t = 0; t < 4; ++t)
    for (int w = 0; w < C::kw; ++w) {
      k_dims.insert({C::k_elem(t, w), C::k_elem(t, w) + 1});
      if (w % C::kcw != 0) {
        EXPECT_EQ(C::k_elem(t, w), C::k_elem(t, w - 1) + 2); // within a run
      }
      if (t > 0 && w % C::kcw == 0) {
        EXPECT_EQ(C::k_elem(t, w), C::k_elem(t - 1, w) + C::k_run); // side by side
      }
    }
  for (int g = 0; g < 8; ++g)
    for (int w = 0; w < C::vw; ++w) {
      v_dims.insert({C::v_dim(g, w), C::v_dim(g, w) + 1});
      if (w % C::vcw != 0) {
        EXPECT_EQ(C::v_dim(g, w), C::v_dim(g, w - 1) + 2);
      }
      if (g > 0 && w % C::vcw == 0) {
        EXPECT_EQ(C::v_dim(g, w), C::v_dim(g - 1, w) + C::v_run);
      }
    }
  std::multiset<int> all;
  for (int d = 0; d < D; ++d)
    all.insert(d);
  EXPECT_EQ(k_dims, all);
  EXPECT_EQ(v_dims, all);
  const int elem_bytes = WIDE ? 1 : 2;
  EXPECT_EQ(C::k_run * elem_bytes, std::min(16, D / 4 * elem_bytes));
  EXPECT_EQ(C::v_run * elem_bytes, std::min(16, D / 8 * elem_bytes));
  const int chunks = C::kw / C::kcw;
  for (int t = 0; t < 4; ++t)
    for (int w = 0; w < C::kw; ++w) {
      const int partner = (C::k_elem(t, w) + D / 2) % D;
      if (chunks > 1) {
        EXPECT_EQ(C::k_elem(t, ((w / C::kcw) ^ (chunks / 2)) * C::kcw + w % C::kcw), partner);
      } else {
        EXPECT_EQ(C::k_elem(t ^ 2, w), partner);
      }
    }
}

TEST(gpu_attention, the_decode_lanes_hold_every_dim_once_in_whole_runs) {
  check_decode_layout<16, false>();
  check_decode_layout<32, false>();
  check_decode_layout<64, false>();
  check_decode_layout<128, false>();
  check_decode_layout<16, true>();
  check_decode_layout<32, true>();
  check_decode_layout<64, true>();
  check_decode_layout<128, true>();
  // The fp8 layout at head dim 128: lane t's K dims 16 t + 64 i + 0..15, lane
  // g's V dims 16 g + 0..15 (decode_attention.cu's fp8 note).
  using W = gpu::decode_layout::tc_cfg<128, true>;
  EXPECT_EQ(W::k_elem(1, 8), 64 + 16);
  EXPECT_EQ(W::v_dim(3, 7), 48 + 14);
}

// The fp8 cache (kv_view::k8): the kernel against the reference over the
// values the cache stands for, at the same tolerance as the bf16 cache (what
// the MMAs add is the same), and the quantisation's own error against the
// bf16 cache it was made from, which is what a user of the fp8 form gives up.
TEST(gpu_attention, decode_reads_the_fp8_cache) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("decode_attention_fp8");
  std::vector<attn_case> cases = {
    {32, 8, 128, 16, 0, {{1023, 1}, {0, 1}, {15, 1}, {300, 1}}},
    {32, 8, 64, 16, 0, {{127, 1}, {4100, 1}}},
    {4, 2, 16, 16, 0, {{4, 1}, {15, 1}, {16, 1}}},
    {8, 8, 32, 16, 16, {{40, 1}, {9, 1}}},
    {28, 4, 128, 7, 333, {{1500, 1}, {40, 1}}},
    {12, 2, 128, 16, 0, {{33, 1}, {20000, 1}}},
    // Pages of 32 and 48 tokens: a step of 16 keys in one page takes one
    // page-table read (a shift, then a division), with a window cutting steps.
    {16, 4, 128, 32, 100, {{700, 1}, {33, 1}}},
    {8, 2, 64, 48, 0, {{500, 1}, {47, 1}, {96, 1}}},
  };
  if (test::quick_mode())
    cases.resize(2);
  test::kernel_generation_scope scope(2);
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c));
    test::paged_kv kv(rng, c.kv_heads, c.head_dim, c.page_size, c.seqs, 3, true);
    kv.make_fp8();
    const size_t qn = size_t(kv.num_tokens()) * c.heads * c.head_dim;
    auto q = test::from_bf16(test::to_bf16(test::random_floats(rng, qn, -1, 1)));
    auto d_q = test::upload_bf16(q);
    const auto want = reference(c, kv, q, true);
    const auto want_bf16 = reference(c, kv, q, false);
    gpu::attention_shape sh{c.heads, c.kv_heads, c.head_dim, c.window,
                            1.0f / std::sqrt(float(c.head_dim))};
    for (int32_t splits : {1, 3, gpu::decode_attention_splits(sh, kv.num_seqs(), 132, 2), 64})
      for (int32_t warps : {4, 2}) {
        SCOPED_TRACE("splits " + std::to_string(splits) + " warps " + std::to_string(warps));
        dev_array<float> part_o(size_t(kv.num_seqs()) * c.heads * splits * c.head_dim);
        dev_array<float> part_ml(size_t(kv.num_seqs()) * c.heads * splits * 2);
        dev_array<int32_t> counters(std::vector<int32_t>(size_t(kv.num_seqs()) * c.heads, 0));
        dev_array<bf16> out(qn);
        gpu::launch_decode_attention(sh, d_q.get(), kv.view8(), kv.batch(), splits, warps,
                                     part_o.get(), part_ml.get(), counters.get(), out.get(),
                                     nullptr);
        test::sync_check();
        const auto got = test::download_bf16(out);
        EXPECT_LT(test::relative_error(got, want), 5e-3);
        // e4m3 keeps 3 mantissa bits: about 2-3% of the output's size here.
        const double quantised = test::relative_error(got, want_bf16);
        EXPECT_LT(quantised, 0.06);
        EXPECT_GT(quantised, 1e-3); // the bytes were read, not the bf16 pools
        for (auto v : counters.download())
          ASSERT_EQ(v, 0);
      }
  }
  // The first generation has no fp8 form: a clear error, not a wrong read.
  test::kernel_generation_scope v1(1);
  test::paged_kv kv(rng, 2, 64, 16, {{10, 1}}, 1, true);
  kv.make_fp8();
  gpu::attention_shape sh{4, 2, 64, 0, 0.125f};
  dev_array<bf16> q(size_t(4) * 64), out(size_t(4) * 64);
  EXPECT_THROW(gpu::launch_decode_attention(sh, q.get(), kv.view8(), kv.batch(), 1, 4, nullptr,
                                            nullptr, nullptr, out.get(), nullptr),
               gpu::cuda_error);
}

// The GEMV path's fp8 writer: with kv.stage, the decode attention's block
// that holds each sequence's current token quantises that token's rotated k
// and v rows from the stage into the cache (the same bytes and scales as the
// host's f32_to_e4m3 of the same floats), touches no other row, and attends
// over what it wrote.
TEST(gpu_attention, decode_quantises_the_staged_rows_into_the_fp8_cache) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("decode_attention_stage_fp8");
  std::vector<attn_case> cases = {
    {32, 8, 128, 16, 0, {{127, 1}, {0, 1}, {1000, 1}, {15, 1}}},
    {32, 8, 64, 16, 0, {{63, 1}, {4100, 1}}},
    {4, 2, 16, 16, 0, {{4, 1}, {16, 1}, {0, 1}}},
    {28, 4, 128, 7, 333, {{1500, 1}, {40, 1}}},
  };
  if (test::quick_mode())
    cases.resize(2);
  test::kernel_generation_scope scope(2);
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c));
    const auto rng_kv = rng;
    test::paged_kv probe(rng, c.kv_heads, c.head_dim, c.page_size, c.seqs, 3, true);
    const int32_t tokens = probe.num_tokens();
    const size_t row = size_t(c.kv_heads) * c.head_dim;
    auto stage = test::random_floats(rng, size_t(tokens) * 2 * row, -3, 3);
    dev_array<float> d_stage(stage);
    const size_t qn = size_t(tokens) * c.heads * c.head_dim;
    auto q = test::from_bf16(test::to_bf16(test::random_floats(rng, qn, -1, 1)));
    auto d_q = test::upload_bf16(q);
    gpu::attention_shape sh{c.heads, c.kv_heads, c.head_dim, c.window,
                            1.0f / std::sqrt(float(c.head_dim))};
    dev_array<float> po(size_t(tokens) * c.heads * 64 * c.head_dim), pml(size_t(tokens) * c.heads * 128);
    dev_array<int32_t> counters(std::vector<int32_t>(size_t(tokens) * c.heads, 0));
    for (int32_t splits : {1, 3, gpu::decode_attention_splits(sh, tokens, 132, 2), 64})
      for (int32_t warps : {4, 2}) {
        SCOPED_TRACE("splits " + std::to_string(splits) + " warps " + std::to_string(warps));
        auto rng_b = rng_kv;
        test::paged_kv kv(rng_b, c.kv_heads, c.head_dim, c.page_size, c.seqs, 3, true);
        kv.make_fp8();
        auto rng_c = rng_kv;
        test::paged_kv untouched(rng_c, c.kv_heads, c.head_dim, c.page_size, c.seqs, 3, true);
        untouched.make_fp8();
        gpu::kv_view view = kv.view8();
        view.stage = d_stage.get();
        dev_array<bf16> out(qn);
        gpu::launch_decode_attention(sh, d_q.get(), view, kv.batch(), splits, warps, po.get(),
                                     pml.get(), counters.get(), out.get(), nullptr);
        test::sync_check();
        kv.download8();
        EXPECT_TRUE(kv.same_fp8_outside_step(untouched));
        for (int32_t t = 0; t < tokens; ++t)
          for (int32_t h = 0; h < c.kv_heads; ++h)
            for (int32_t which = 0; which < 2; ++which) {
              std::vector<float> want(stage.begin() + int64_t((size_t(t) * 2 + size_t(which)) * row + size_t(h) * c.head_dim),
                                      stage.begin() + int64_t((size_t(t) * 2 + size_t(which)) * row + size_t(h + 1) * c.head_dim));
              ref::round_rows_to_e4m3(want.data(), 1, c.head_dim);
              for (int32_t e = 0; e < c.head_dim; ++e) {
                const float got = which == 0 ? kv.k8_at(kv.seq_of(t), kv.position(t), h, e)
                                             : kv.v8_at(kv.seq_of(t), kv.position(t), h, e);
                ASSERT_EQ(got, want[size_t(e)])
                  << (which ? "v" : "k") << " of token " << t << " head " << h << " dim " << e;
              }
            }
        EXPECT_LT(test::relative_error(test::download_bf16(out), reference(c, kv, q, true)), 5e-3);
        for (auto v : counters.download())
          ASSERT_EQ(v, 0);
      }
  }
}

// The fp8 cache's writers: rope_kv_write (prefill and unfused steps) and the
// fused-RoPE decode attention. The block holding a token's row rotates its
// k, takes each row's scale from its largest |value| and writes the bytes:
// within e4m3's rounding of the rows rope_kv_write writes to the bf16 cache,
// the same bytes from both writers, q the same bits as the bf16 kernel's, no
// other row touched; the fused kernel attends over what it wrote (against the
// reference over the downloaded fp8 cache).
TEST(gpu_attention, decode_with_fused_rope_writes_and_reads_the_fp8_cache) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("decode_attention_rope_fp8");
  std::vector<attn_case> cases = {
    {32, 8, 128, 16, 0, {{127, 1}, {0, 1}, {1000, 1}, {15, 1}}},
    {32, 8, 64, 16, 0, {{63, 1}, {4100, 1}}},
    {28, 4, 128, 7, 333, {{1500, 1}, {40, 1}, {6, 1}}},
    {4, 2, 16, 16, 0, {{4, 1}, {16, 1}, {0, 1}}},
  };
  if (test::quick_mode())
    cases.resize(2);
  test::kernel_generation_scope scope(2);
  gpu::active_kernels().decode_rope = 2;
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c));
    const auto rng_kv = rng;
    test::paged_kv kv_a(rng, c.kv_heads, c.head_dim, c.page_size, c.seqs, 3, true);
    const int32_t width = (c.heads + 2 * c.kv_heads) * c.head_dim;
    const int32_t tokens = kv_a.num_tokens();
    const auto qkv_f = test::random_floats(rng, size_t(tokens) * width, -2, 2);
    auto d_qkv = test::upload_bf16(qkv_f);
    std::vector<float> inv(size_t(c.head_dim / 2));
    for (size_t i = 0; i < inv.size(); ++i)
      inv[i] = float(std::pow(500000.0, -2.0 * double(i) / c.head_dim));
    dev_array<float> d_inv(inv);
    gpu::attention_shape sh{c.heads, c.kv_heads, c.head_dim, c.window,
                            1.0f / std::sqrt(float(c.head_dim))};
    const size_t qn = size_t(tokens) * c.heads * c.head_dim;
    // The bf16 rows and rotated q rope_kv_write makes.
    dev_array<bf16> d_q(qn);
    gpu::launch_rope_kv_write(d_qkv.get(), nullptr, d_inv.get(), kv_a.batch(), kv_a.view(),
                              c.heads, d_q.get(), nullptr);
    test::sync_check();
    kv_a.download();
    const auto q = test::download_bf16(d_q);
    // rope_kv_write into the fp8 form of the same initial cache.
    auto rng_w = rng_kv;
    test::paged_kv kv_w(rng_w, c.kv_heads, c.head_dim, c.page_size, c.seqs, 3, true);
    kv_w.make_fp8();
    {
      auto rng_c = rng_kv;
      test::paged_kv kv_c(rng_c, c.kv_heads, c.head_dim, c.page_size, c.seqs, 3, true);
      kv_c.make_fp8();
      dev_array<bf16> d_q8(qn);
      gpu::launch_rope_kv_write(d_qkv.get(), nullptr, d_inv.get(), kv_w.batch(), kv_w.view8(),
                                c.heads, d_q8.get(), nullptr);
      test::sync_check();
      kv_w.download8();
      EXPECT_TRUE(kv_w.same_fp8_outside_step(kv_c));
      EXPECT_EQ(test::download_bf16(d_q8), q);
    }
    dev_array<float> po(size_t(tokens) * c.heads * 64 * c.head_dim), pml(size_t(tokens) * c.heads * 128);
    dev_array<int32_t> counters(std::vector<int32_t>(size_t(tokens) * c.heads, 0));
    const int32_t auto_splits = gpu::decode_attention_splits(sh, kv_a.num_seqs(), 132, 2);
    for (int32_t splits : {1, 3, auto_splits, 64})
      for (int32_t warps : {4, 2}) {
        SCOPED_TRACE("splits " + std::to_string(splits) + " warps " + std::to_string(warps));
        auto rng_b = rng_kv;
        test::paged_kv kv_b(rng_b, c.kv_heads, c.head_dim, c.page_size, c.seqs, 3, true);
        kv_b.make_fp8();
        auto rng_c = rng_kv; // the untouched fp8 form, for the rows nobody may write
        test::paged_kv kv_c(rng_c, c.kv_heads, c.head_dim, c.page_size, c.seqs, 3, true);
        kv_c.make_fp8();
        dev_array<bf16> out(qn);
        const gpu::rope_input rope{d_qkv.get(), nullptr, d_inv.get()};
        gpu::launch_decode_attention_rope(sh, rope, kv_b.view8(), kv_b.batch(), splits, warps,
                                          po.get(), pml.get(), counters.get(), out.get(),
                                          nullptr);
        test::sync_check();
        kv_b.download8();
        EXPECT_TRUE(kv_b.same_fp8_outside_step(kv_c));
        // Each written value within e4m3's rounding of the bf16 row: half a
        // step of 3 mantissa bits (1/16 of the value), a subnormal step near
        // zero, and the bf16 row's own rounding.
        int32_t checked = 0;
        for (int32_t t = 0; t < tokens; ++t)
          for (int32_t h = 0; h < c.kv_heads; ++h) {
            const int32_t s = kv_a.seq_of(t), pos = kv_a.position(t);
            float ak = 0.0f, av = 0.0f;
            for (int32_t e = 0; e < c.head_dim; ++e) {
              ak = std::max(ak, std::fabs(kv_a.k_at(s, pos, h, e)));
              av = std::max(av, std::fabs(kv_a.v_at(s, pos, h, e)));
            }
            for (int32_t e = 0; e < c.head_dim; ++e) {
              const float k = kv_a.k_at(s, pos, h, e), v = kv_a.v_at(s, pos, h, e);
              ASSERT_NEAR(kv_b.k8_at(s, pos, h, e), k,
                          std::fabs(k) * (1.0f / 16 + 1.0f / 128) + ak * 0x1p-18f)
                << "k of token " << t << " head " << h << " dim " << e;
              ASSERT_NEAR(kv_b.v8_at(s, pos, h, e), v,
                          std::fabs(v) * (1.0f / 16 + 1.0f / 128) + av * 0x1p-18f)
                << "v of token " << t << " head " << h << " dim " << e;
              ++checked;
            }
          }
        EXPECT_EQ(checked, tokens * c.kv_heads * c.head_dim);
        EXPECT_TRUE(kv_b.same_fp8(kv_w)); // both writers, the same bytes and scales
        const auto want = reference(c, kv_b, q, true);
        EXPECT_LT(test::relative_error(test::download_bf16(out), want), 5e-3);
        for (auto v : counters.download())
          ASSERT_EQ(v, 0);
      }
  }
}

// The prefill kernel over `view` (kv's bf16 or fp8 pools): every tile of
// every sequence's new rows, in reverse order, and its output; with splits
// > 1 each tile's keys split over that many blocks and merged by the second
// launch. The output starts as NaN, so a row that no launch wrote fails.
std::vector<float> run_prefill(const attn_case& c, test::paged_kv& kv, const gpu::kv_view& view,
                               const dev_array<bf16>& d_q, size_t qn, int32_t splits = 1) {
  std::vector<gpu::prefill_item> items;
  for (int32_t s = 0; s < kv.num_seqs(); ++s)
    for (int32_t r = 0; r < c.seqs[size_t(s)].second; r += gpu::prefill_tile_rows())
      items.push_back({s, r});
  std::reverse(items.begin(), items.end());
  dev_array<gpu::prefill_item> d_items(items);
  dev_array<bf16> out(qn);
  gpu::attention_shape sh{c.heads, c.kv_heads, c.head_dim, c.window,
                          1.0f / std::sqrt(float(c.head_dim))};
  const size_t cells = items.size() * size_t(c.heads);
  dev_array<float> po(cells * size_t(splits) * 128 * size_t(c.head_dim));
  dev_array<float> pml(cells * size_t(splits) * 128 * 2);
  gpu::prefill_split split;
  if (splits > 1)
    split = {po.get(), pml.get(), splits};
  gpu::launch_prefill_attention(sh, d_q.get(), view, kv.batch(), d_items.get(),
                                int32_t(items.size()), out.get(), nullptr, split);
  test::sync_check();
  return test::download_bf16(out);
}

// The cuBLAS decode path's fused kernel against the two kernels it replaces
// (launch_rope_kv_write, then launch_decode_attention) on identical caches:
// the same bits written to the same rows (nothing else touched), the same
// output to bf16 rounding, and that output against the reference over the
// cache it wrote.
TEST(gpu_attention, decode_with_fused_rope_matches_rope_then_decode) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("decode_attention_rope");
  struct rope_attn_case {
    attn_case a;
    bool bias;
  };
  std::vector<rope_attn_case> cases = {
    {{32, 8, 128, 16, 0, {{127, 1}, {0, 1}, {1000, 1}, {15, 1}}}, false},
    {{32, 8, 64, 16, 0, {{63, 1}, {4100, 1}}}, true},
    {{28, 4, 128, 7, 333, {{1500, 1}, {40, 1}, {6, 1}}}, true},
    {{4, 2, 16, 16, 0, {{4, 1}, {16, 1}, {0, 1}}}, true},
    {{8, 8, 32, 16, 16, {{40, 1}, {9, 1}}}, false},
    {{12, 2, 128, 16, 0, {{33, 1}, {20000, 1}}}, true},
  };
  if (test::quick_mode())
    cases.resize(2);
  // Whatever METRONOME_KERNELS says: this test is about the fused kernel.
  test::kernel_generation_scope scope(2);
  gpu::active_kernels().decode_rope = 2;
  for (const auto& rc : cases) {
    const attn_case& c = rc.a;
    SCOPED_TRACE(name_of(c) + (rc.bias ? " bias" : ""));
    const auto rng_kv = rng; // kv_b: a fresh copy of kv_a's initial cache for every launch
    test::paged_kv kv_a(rng, c.kv_heads, c.head_dim, c.page_size, c.seqs, 3, true);
    const int32_t width = (c.heads + 2 * c.kv_heads) * c.head_dim;
    const int32_t tokens = kv_a.num_tokens();
    const auto qkv_f = test::random_floats(rng, size_t(tokens) * width, -2, 2);
    auto d_qkv = test::upload_bf16(qkv_f);
    auto d_bias = test::upload_bf16(test::random_floats(rng, size_t(width), -0.5f, 0.5f));
    std::vector<float> inv(size_t(c.head_dim / 2));
    for (size_t i = 0; i < inv.size(); ++i)
      inv[i] = float(std::pow(500000.0, -2.0 * double(i) / c.head_dim));
    dev_array<float> d_inv(inv);
    const bf16* bias = rc.bias ? d_bias.get() : nullptr;
    gpu::attention_shape sh{c.heads, c.kv_heads, c.head_dim, c.window,
                            1.0f / std::sqrt(float(c.head_dim))};
    ASSERT_TRUE(gpu::decode_attention_fuses_rope(sh));
    const size_t qn = size_t(tokens) * c.heads * c.head_dim;

    // The two kernels, once (splits do not change what they write).
    dev_array<bf16> d_q(qn), out_a(qn);
    const int32_t auto_splits = gpu::decode_attention_splits(sh, kv_a.num_seqs(), 132, 2);
    dev_array<float> po(size_t(tokens) * c.heads * 64 * c.head_dim), pml(size_t(tokens) * c.heads * 128);
    dev_array<int32_t> counters(std::vector<int32_t>(size_t(tokens) * c.heads, 0));
    gpu::launch_rope_kv_write(d_qkv.get(), bias, d_inv.get(), kv_a.batch(), kv_a.view(), c.heads,
                              d_q.get(), nullptr);
    gpu::launch_decode_attention(sh, d_q.get(), kv_a.view(), kv_a.batch(), auto_splits, 4,
                                 po.get(), pml.get(), counters.get(), out_a.get(), nullptr);
    test::sync_check();
    kv_a.download();
    const auto got_a = test::download_bf16(out_a);
    const auto want = reference(c, kv_a, test::download_bf16(d_q));
    ASSERT_LT(test::relative_error(got_a, want), 5e-3);

    std::vector<float> got_auto; // the fused kernel at auto_splits, 4 warps
    for (int32_t splits : {1, 3, auto_splits, 64})
      for (int32_t warps : {4, 2}) {
        SCOPED_TRACE("splits " + std::to_string(splits) + " warps " + std::to_string(warps));
        // A fresh cache each time (the current rows hold stale random values),
        // so that every split count must write them itself, before reading.
        // Two warps (64 threads) write a 128-wide row in two passes.
        auto rng_b = rng_kv;
        test::paged_kv kv_b(rng_b, c.kv_heads, c.head_dim, c.page_size, c.seqs, 3, true);
        dev_array<bf16> out_b(qn);
        const gpu::rope_input rope{d_qkv.get(), bias, d_inv.get()};
        gpu::launch_decode_attention_rope(sh, rope, kv_b.view(), kv_b.batch(), splits, warps,
                                          po.get(), pml.get(), counters.get(), out_b.get(),
                                          nullptr);
        test::sync_check();
        kv_b.download();
        EXPECT_TRUE(kv_b.same_pools(kv_a));
        const auto got_b = test::download_bf16(out_b);
        EXPECT_LT(test::relative_error(got_b, got_a), 2e-3);
        EXPECT_LT(test::relative_error(got_b, want), 5e-3);
        for (auto v : counters.download())
          ASSERT_EQ(v, 0);
        if (splits == auto_splits && warps == 4)
          got_auto = got_b;
      }

    // The projection as split-K partials (rope_input::partials) whose fp32
    // sum is exactly the bf16 projection above (small dyadic offsets that
    // cancel): the same cache bits and the same output bits.
    for (int32_t parts : {1, 2, 3}) {
      SCOPED_TRACE("qkv partials " + std::to_string(parts));
      const size_t n = qkv_f.size();
      std::vector<float> p(size_t(parts) * n);
      for (size_t i = 0; i < n; ++i) {
        float first = test::round_bf16(qkv_f[i]);
        for (int32_t s = 1; s < parts; ++s) {
          const float r = float(int(rng() % 17) - 8) * (1.0f / 4096.0f);
          p[size_t(s) * n + i] = r;
          first -= r;
        }
        p[i] = first;
      }
      dev_array<float> d_parts(p);
      auto rng_b = rng_kv;
      test::paged_kv kv_b(rng_b, c.kv_heads, c.head_dim, c.page_size, c.seqs, 3, true);
      dev_array<bf16> out_b(qn);
      gpu::rope_input rope{nullptr, bias, d_inv.get()};
      rope.partials = d_parts.get();
      rope.splits = parts;
      rope.split_stride = int64_t(n);
      gpu::launch_decode_attention_rope(sh, rope, kv_b.view(), kv_b.batch(), auto_splits, 4,
                                        po.get(), pml.get(), counters.get(), out_b.get(),
                                        nullptr);
      test::sync_check();
      kv_b.download();
      EXPECT_TRUE(kv_b.same_pools(kv_a));
      EXPECT_EQ(test::download_bf16(out_b), got_auto);
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
    {32, 8, 128, 16, 0, {{0, 300}, {129, 128}}},
    {8, 2, 128, 16, 77, {{0, 257}}},
    {16, 4, 64, 16, 0, {{0, 384}}},
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
    for (int gen : {2, 1}) {
      test::kernel_generation_scope scope(gen);
      SCOPED_TRACE("generation " + std::to_string(gen));
      EXPECT_LT(test::relative_error(run_prefill(c, kv, kv.view(), d_q, qn), want), 1e-2);
    }
    // Keys split over blocks (the second generation), as a short chunk over
    // a long context runs.
    test::kernel_generation_scope scope(2);
    for (int32_t splits : {2, 3, gpu::prefill_max_splits}) {
      SCOPED_TRACE("splits " + std::to_string(splits));
      EXPECT_LT(test::relative_error(run_prefill(c, kv, kv.view(), d_q, qn, splits), want), 1e-2);
    }
  }
}

// A short chunk after a long cached context (a prefix-cache hit, a
// stall-free step's chunk): keys split over up to 8 blocks, against the
// reference and against the kernel unsplit.
TEST(gpu_attention, prefill_splits_long_contexts_over_blocks) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("prefill_attention_split");
  std::vector<attn_case> cases = {
    {32, 8, 128, 16, 0, {{4000, 100}}},
    {32, 8, 128, 16, 0, {{2000, 130}, {700, 1}}},
    {16, 4, 64, 16, 300, {{3000, 64}}},
    {8, 2, 256, 16, 0, {{1500, 20}}},
  };
  test::kernel_generation_scope scope(2);
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c));
    test::paged_kv kv(rng, c.kv_heads, c.head_dim, c.page_size, c.seqs, 2, true);
    const size_t qn = size_t(kv.num_tokens()) * c.heads * c.head_dim;
    auto q = test::from_bf16(test::to_bf16(test::random_floats(rng, qn, -1, 1)));
    auto d_q = test::upload_bf16(q);
    const auto want = reference(c, kv, q);
    const auto whole = run_prefill(c, kv, kv.view(), d_q, qn);
    EXPECT_LT(test::relative_error(whole, want), 1e-2);
    for (int32_t splits : {2, 5, gpu::prefill_max_splits}) {
      SCOPED_TRACE("splits " + std::to_string(splits));
      const auto got = run_prefill(c, kv, kv.view(), d_q, qn, splits);
      EXPECT_LT(test::relative_error(got, want), 1e-2);
      EXPECT_LT(test::relative_error(got, whole), 1e-2);
    }
    kv.make_fp8();
    const auto want8 = reference(c, kv, q, true);
    if (c.head_dim <= 128)
      EXPECT_LT(test::relative_error(run_prefill(c, kv, kv.view8(), d_q, qn, 4), want8), 1e-2);
  }
}

// The prefill kernel over the fp8 cache (chunks over cached pages, windows,
// page sizes that do not divide the tiles) against the reference over the
// values the cache stands for; the first generation and head_dim 256 refuse it.
TEST(gpu_attention, prefill_reads_the_fp8_cache) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("prefill_attention_fp8");
  std::vector<attn_case> cases = {
    {32, 8, 128, 16, 0, {{0, 130}, {1000, 64}}},
    {4, 1, 16, 16, 16, {{0, 40}, {20, 7}}},
    {32, 8, 64, 16, 0, {{0, 64}, {0, 65}, {37, 1}, {100, 200}}},
    {32, 16, 128, 7, 100, {{150, 90}, {0, 170}}},
    {8, 8, 32, 16, 0, {{0, 33}}},
    {32, 8, 128, 16, 0, {{0, 300}, {129, 128}}},
  };
  if (test::quick_mode())
    cases.resize(2);
  test::kernel_generation_scope scope(2);
  for (const auto& c : cases) {
    SCOPED_TRACE(name_of(c));
    test::paged_kv kv(rng, c.kv_heads, c.head_dim, c.page_size, c.seqs, 2, true);
    kv.make_fp8();
    const size_t qn = size_t(kv.num_tokens()) * c.heads * c.head_dim;
    auto q = test::from_bf16(test::to_bf16(test::random_floats(rng, qn, -1, 1)));
    auto d_q = test::upload_bf16(q);
    const auto want = reference(c, kv, q, true);
    const auto got = run_prefill(c, kv, kv.view8(), d_q, qn);
    EXPECT_LT(test::relative_error(run_prefill(c, kv, kv.view8(), d_q, qn, 3), want), 1e-2);
    EXPECT_LT(test::relative_error(got, want), 1e-2);
    EXPECT_GT(test::relative_error(got, reference(c, kv, q, false)), 1e-3);
  }
  test::paged_kv kv(rng, 1, 256, 16, {{0, 8}}, 1, true);
  kv.make_fp8();
  dev_array<gpu::prefill_item> one(std::vector<gpu::prefill_item>{{0, 0}});
  dev_array<bf16> q(size_t(8) * 256), out(size_t(8) * 256);
  EXPECT_THROW(gpu::launch_prefill_attention({1, 1, 256, 0, 0.0625f}, q.get(), kv.view8(),
                                             kv.batch(), one.get(), 1, out.get(), nullptr),
               gpu::cuda_error);
  test::kernel_generation_scope v1(1);
  test::paged_kv kv64(rng, 1, 64, 16, {{0, 8}}, 1, true);
  kv64.make_fp8();
  EXPECT_THROW(gpu::launch_prefill_attention({1, 1, 64, 0, 0.125f}, q.get(), kv64.view8(),
                                             kv64.batch(), one.get(), 1, out.get(), nullptr),
               gpu::cuda_error);
}

} // namespace
} // namespace metronome
