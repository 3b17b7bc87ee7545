// The step packer against hand-derived input blocks: every expected array
// below is worked out from the layout rules (16-byte aligned arrays in a
// fixed order) and the padding rules of gpu/step_packer.hpp, not read back
// from the packer.

#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/step_packer.hpp"

namespace metronome::gpu {
namespace {

/// A work-list rule that is easy to check: a list of seqs + 1 items from 2
/// sequences on; the list holds each sequence's KV length, then -7.
work_list_rule fake_rule() {
  return {[](int32_t seqs) { return seqs >= 2 ? seqs + 1 : 0; },
          [](const int32_t* seq_len, int32_t seqs, int32_t* work, int32_t items) {
            for (int32_t i = 0; i < items; ++i)
              work[i] = i < seqs ? seq_len[i] : -7;
          }};
}

/// A block to pack into, pre-filled with a marker byte so that what the
/// packer leaves alone shows.
struct block {
  explicit block(const step_layout& l) : bytes(l.bytes, 0xAB) {
  }
  std::vector<unsigned char> bytes;
  unsigned char* data() {
    return bytes.data();
  }
  template <class T>
  std::vector<T> read(size_t off, size_t n) const {
    std::vector<T> out(n);
    std::memcpy(out.data(), bytes.data() + off, n * sizeof(T));
    return out;
  }
};

TEST(step_packer, lays_the_arrays_out_16_byte_aligned_in_a_fixed_order) {
  const step_packer p(fake_rule());
  // 3 tokens, 2 sequences, 1 update: int32 arrays of 3 take 12 bytes (then
  // 16), of 2 take 8 (then 16), q_start's 3 take 12, the seeds 16.
  const step_layout l = p.layout(3, 2, 1, 0, 0);
  EXPECT_EQ(l.header, 0u);
  EXPECT_EQ(l.ids, 16u);
  EXPECT_EQ(l.positions, 32u);
  EXPECT_EQ(l.token_seq, 48u);
  EXPECT_EQ(l.seq_slot, 64u);
  EXPECT_EQ(l.seq_q_start, 80u);
  EXPECT_EQ(l.seq_len, 96u);
  EXPECT_EQ(l.sample_src, 112u);
  EXPECT_EQ(l.temperature, 128u);
  EXPECT_EQ(l.top_p, 144u);
  EXPECT_EQ(l.min_p, 160u);
  EXPECT_EQ(l.top_k, 176u);
  EXPECT_EQ(l.seed, 192u);
  EXPECT_EQ(l.step, 208u);
  EXPECT_EQ(l.repetition, 224u);
  EXPECT_EQ(l.frequency, 240u);
  EXPECT_EQ(l.presence, 256u);
  EXPECT_EQ(l.logprobs, 272u);
  EXPECT_EQ(l.update_data, 288u);
  EXPECT_EQ(l.item_data, 304u); // 12 bytes of updates, aligned up
  EXPECT_EQ(l.bytes, 304u);     // nothing after: no items, singles or lists
  // Not a decode step (3 tokens over 2 sequences): no work list.
  EXPECT_EQ(l.work_items, 0);
  EXPECT_EQ(l.single_work_items, 0);
}

TEST(step_packer, packs_a_decode_step_with_a_fed_token_and_a_padding_row) {
  step_packer p(fake_rule());
  p.shape.scratch_slot = 9;
  const int32_t t0[] = {42};
  const int32_t t1[] = {-1};
  engine_chunk c0;
  c0.slot = 5;
  c0.start_pos = 7;
  c0.tokens = t0;
  c0.sample = true;
  c0.temperature = 0.5f;
  c0.top_p = 0.9f;
  c0.min_p = 0.1f;
  c0.top_k = 40;
  c0.logprobs = 2;
  c0.repetition_penalty = 1.1f;
  c0.frequency_penalty = 0.2f;
  c0.presence_penalty = 0.3f;
  c0.seed = 99;
  c0.sample_step = 3;
  engine_chunk c1;
  c1.slot = 2;
  c1.start_pos = 0;
  c1.tokens = t1;
  c1.fed_row = 4; // the previous step's sampled row 4
  c1.sample = true;
  const engine_chunk chunks[] = {c0, c1};
  const page_update updates[] = {{5, 1, 17}};

  // Two decodes padded to a graph of 3: 4 x 3 + 16 updates, and a work
  // list of 4 items (the fake rule's 3 + 1).
  const step_layout l = p.decode_layout(3);
  EXPECT_EQ(l.tokens, 3);
  EXPECT_EQ(l.seqs, 3);
  EXPECT_EQ(l.updates, 28);
  EXPECT_EQ(l.work_items, 4);
  block b(l);
  p.pack(b.data(), l, chunks, updates, {}, 0);

  EXPECT_EQ(b.read<int32_t>(l.header, 2), (std::vector<int32_t>{1, 0}));
  // The fed token: -1 - fed_row. The padding row: token 0 at position 0.
  EXPECT_EQ(b.read<int32_t>(l.ids, 3), (std::vector<int32_t>{42, -5, 0}));
  EXPECT_EQ(b.read<int32_t>(l.positions, 3), (std::vector<int32_t>{7, 0, 0}));
  EXPECT_EQ(b.read<int32_t>(l.token_seq, 3), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(b.read<int32_t>(l.seq_slot, 3), (std::vector<int32_t>{5, 2, 9}));
  EXPECT_EQ(b.read<int32_t>(l.seq_q_start, 4), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(b.read<int32_t>(l.seq_len, 3), (std::vector<int32_t>{8, 1, 1}));
  EXPECT_EQ(b.read<int32_t>(l.sample_src, 3), (std::vector<int32_t>{0, 1, 2}));
  // The padding row samples greedily (temperature 0), neutral otherwise.
  EXPECT_EQ(b.read<float>(l.temperature, 3), (std::vector<float>{0.5f, 1.0f, 0.0f}));
  EXPECT_EQ(b.read<float>(l.top_p, 3), (std::vector<float>{0.9f, 1.0f, 1.0f}));
  EXPECT_EQ(b.read<float>(l.min_p, 3), (std::vector<float>{0.1f, 0.0f, 0.0f}));
  EXPECT_EQ(b.read<int32_t>(l.top_k, 3), (std::vector<int32_t>{40, 0, 0}));
  EXPECT_EQ(b.read<uint64_t>(l.seed, 3), (std::vector<uint64_t>{99, 0, 0}));
  EXPECT_EQ(b.read<int32_t>(l.step, 3), (std::vector<int32_t>{3, 0, 0}));
  EXPECT_EQ(b.read<float>(l.repetition, 3), (std::vector<float>{1.1f, 1.0f, 1.0f}));
  EXPECT_EQ(b.read<float>(l.frequency, 3), (std::vector<float>{0.2f, 0.0f, 0.0f}));
  EXPECT_EQ(b.read<float>(l.presence, 3), (std::vector<float>{0.3f, 0.0f, 0.0f}));
  EXPECT_EQ(b.read<int32_t>(l.logprobs, 3), (std::vector<int32_t>{2, -1, -1}));
  EXPECT_EQ(b.read<int32_t>(l.update_data, 3), (std::vector<int32_t>{5, 1, 17}));
  // The work list over the KV lengths (8, 1, 1), its spare item -7.
  EXPECT_EQ(b.read<int32_t>(l.work, 4), (std::vector<int32_t>{8, 1, 1, -7}));
  // Update room past the step's one stays as it was.
  EXPECT_EQ(b.read<unsigned char>(l.update_data + 12, 1)[0], 0xAB);
}

TEST(step_packer, pads_a_mixed_graph_step_to_its_capacities) {
  step_packer p(fake_rule());
  p.shape.page_size = 16;
  p.shape.update_capacity = 100;
  p.shape.page_stride = 4;
  p.shape.scratch_slot = 9;
  // 2 singles, 32 prompt rows, tiles of 16: 2 + 4 items; updates 2 + 32/16
  // + 2 x 4 + 16 = 28 plus the page stride (4); 2 + 4 + 1 sequences.
  const step_layout l = p.mixed_layout(2, 32, 16);
  EXPECT_EQ(l.tokens, 34);
  EXPECT_EQ(l.seqs, 7);
  EXPECT_EQ(l.updates, 32);
  EXPECT_EQ(l.items, 6);
  EXPECT_EQ(l.busy_items, 2);
  EXPECT_EQ(l.singles, 2);
  EXPECT_EQ(l.work_items, 0);        // not a decode step
  EXPECT_EQ(l.single_work_items, 3); // the fake rule over 2 singles

  // One decode (slot 1 at position 10) and one prompt chunk of 5 tokens.
  const int32_t t0[] = {5};
  const int32_t t1[] = {1, 2, 3, 4, 5};
  engine_chunk c0;
  c0.slot = 1;
  c0.start_pos = 10;
  c0.tokens = t0;
  c0.sample = true;
  engine_chunk c1;
  c1.slot = 3;
  c1.start_pos = 0;
  c1.tokens = t1;
  c1.sample = true;
  const engine_chunk chunks[] = {c0, c1};
  std::vector<prefill_item> items;
  EXPECT_EQ(step_packer::cut_prefill_items(chunks, 16, items), 1);
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].seq, 1);
  EXPECT_EQ(items[0].row, 0);

  block b(l);
  p.pack(b.data(), l, chunks, {}, items, 0, true);
  // Rows: the decode (0), the chunk (1-5), one padding single (6), then the
  // 27 prompt rows left in the last sequence (6).
  std::vector<int32_t> ids = {5, 1, 2, 3, 4, 5, 0}, positions = {10, 0, 1, 2, 3, 4, 0},
                       token_seq = {0, 1, 1, 1, 1, 1, 2};
  for (int32_t r = 7; r < 34; ++r) {
    ids.push_back(0);
    positions.push_back(0);
    token_seq.push_back(6);
  }
  EXPECT_EQ(b.read<int32_t>(l.ids, 34), ids);
  EXPECT_EQ(b.read<int32_t>(l.positions, 34), positions);
  EXPECT_EQ(b.read<int32_t>(l.token_seq, 34), token_seq);
  // Sequences: decode, chunk, padding single, three empty chunks, the rest.
  EXPECT_EQ(b.read<int32_t>(l.seq_slot, 7), (std::vector<int32_t>{1, 3, 9, 9, 9, 9, 9}));
  EXPECT_EQ(b.read<int32_t>(l.seq_len, 7), (std::vector<int32_t>{11, 5, 1, 0, 0, 0, 1}));
  EXPECT_EQ(b.read<int32_t>(l.seq_q_start, 8),
            (std::vector<int32_t>{0, 1, 6, 7, 7, 7, 7, 34}));
  EXPECT_EQ(b.read<int32_t>(l.single_slot, 2), (std::vector<int32_t>{1, 9}));
  EXPECT_EQ(b.read<int32_t>(l.single_q_start, 2), (std::vector<int32_t>{0, 6}));
  EXPECT_EQ(b.read<int32_t>(l.single_len, 2), (std::vector<int32_t>{11, 1}));
  // Sampling rows up to seqs - 1: the two chunks' last rows, the padding
  // single's row, then row 0.
  EXPECT_EQ(b.read<int32_t>(l.sample_src, 6), (std::vector<int32_t>{0, 5, 6, 0, 0, 0}));
  EXPECT_EQ(b.read<float>(l.temperature, 6),
            (std::vector<float>{1.0f, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f}));
  EXPECT_EQ(b.read<int32_t>(l.logprobs, 6), (std::vector<int32_t>{-1, -1, -1, -1, -1, -1}));
  // The singles' work list over their KV lengths.
  EXPECT_EQ(b.read<int32_t>(l.single_work, 3), (std::vector<int32_t>{11, 1, -7}));
  // The step's item, then padding items (seq -1).
  const auto it = b.read<prefill_item>(l.item_data, 6);
  EXPECT_EQ(it[0].seq, 1);
  EXPECT_EQ(it[0].row, 0);
  for (size_t i = 1; i < 6; ++i) {
    EXPECT_EQ(it[i].seq, -1) << i;
    EXPECT_EQ(it[i].row, 0) << i;
  }
  EXPECT_EQ(b.read<int32_t>(l.header, 2), (std::vector<int32_t>{0, 0}));
}

TEST(step_packer, cuts_prompt_chunks_into_tiles_longest_ending_first) {
  const int32_t a[40] = {}, single[1] = {7}, c[20] = {};
  engine_chunk A, B, C;
  A.start_pos = 0;
  A.tokens = a; // tiles at rows 0, 16, 32 end at keys 16, 32, 40
  B.start_pos = 3;
  B.tokens = single;
  C.start_pos = 100;
  C.tokens = c; // tiles at rows 0, 16 end at keys 116, 120
  const engine_chunk chunks[] = {A, B, C};
  std::vector<prefill_item> items = {{5, 5}}; // replaced
  EXPECT_EQ(step_packer::cut_prefill_items(chunks, 16, items), 1);
  const std::vector<std::pair<int32_t, int32_t>> want = {{2, 16}, {2, 0}, {0, 32}, {0, 16},
                                                         {0, 0}};
  ASSERT_EQ(items.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(items[i].seq, want[i].first) << i;
    EXPECT_EQ(items[i].row, want[i].second) << i;
  }
}

TEST(step_packer, numbers_penalty_rows_by_sampled_chunk) {
  const int32_t t[] = {1};
  const penalty_entry p0[] = {{99, 5, 1, 1}};
  const penalty_entry p1[] = {{99, 6, 0, 0}};
  const penalty_entry p2[] = {{99, 7, 2, 0}, {99, 8, 0, 1}};
  engine_chunk c0, c1, c2;
  c0.tokens = c1.tokens = c2.tokens = t;
  c0.sample = true;
  c0.penalties = p0;
  c1.sample = false; // not sampled: its entries stay behind
  c1.penalties = p1;
  c2.sample = true;
  c2.penalties = p2;
  const engine_chunk chunks[] = {c0, c1, c2};
  penalty_entry out[4] = {};
  out[3].token = -3;
  step_packer::pack_penalties(chunks, out);
  EXPECT_EQ(out[0].row, 0);
  EXPECT_EQ(out[0].token, 5);
  EXPECT_EQ(out[0].output_count, 1);
  EXPECT_EQ(out[0].repetition, 1);
  EXPECT_EQ(out[1].row, 1);
  EXPECT_EQ(out[1].token, 7);
  EXPECT_EQ(out[1].output_count, 2);
  EXPECT_EQ(out[2].row, 1);
  EXPECT_EQ(out[2].token, 8);
  EXPECT_EQ(out[2].repetition, 1);
  EXPECT_EQ(out[3].token, -3); // nothing past the three entries
}

TEST(step_packer, writes_a_page_update_block_with_its_count_in_a_16_byte_header) {
  const page_update updates[] = {{1, 2, 3}, {4, 5, 6}};
  EXPECT_EQ(step_packer::page_update_block_bytes(2), 40u);
  std::vector<int32_t> out(10, -9);
  step_packer::pack_page_updates(updates, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{2, -9, -9, -9, 1, 2, 3, 4, 5, 6}));
}

TEST(step_packer, decode_sizes_double_to_8_then_step_by_8_ending_at_max_batch) {
  EXPECT_EQ(step_packer::decode_sizes(1), (std::vector<int32_t>{1}));
  EXPECT_EQ(step_packer::decode_sizes(3), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(step_packer::decode_sizes(8), (std::vector<int32_t>{1, 2, 4, 8}));
  EXPECT_EQ(step_packer::decode_sizes(20), (std::vector<int32_t>{1, 2, 4, 8, 16, 20}));
  EXPECT_EQ(step_packer::decode_sizes(24), (std::vector<int32_t>{1, 2, 4, 8, 16, 24}));
}

TEST(step_packer, mixed_sizes_fit_the_batch_beside_four_chunks_and_the_tokens) {
  // max_batch 20 leaves 16 singles beside 4 chunks; 64 tokens in all.
  const std::vector<std::pair<int32_t, int32_t>> want = {
    {0, 16}, {0, 32}, {0, 64}, {8, 16}, {8, 32}, {16, 16}, {16, 32}};
  EXPECT_EQ(step_packer::mixed_sizes(20, 64), want);
  // A batch of at most 4 leaves no singles: prompt-only graphs.
  EXPECT_EQ(step_packer::mixed_sizes(4, 32),
            (std::vector<std::pair<int32_t, int32_t>>{{0, 16}, {0, 32}}));
}

} // namespace
} // namespace metronome::gpu
