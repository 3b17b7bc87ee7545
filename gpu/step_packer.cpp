#include "gpu/step_packer.hpp"

#include <algorithm>
#include <cstring>

namespace metronome::gpu {

namespace {

constexpr size_t align16(size_t v) {
  return (v + 15) / 16 * 16;
}

} // namespace

step_layout step_packer::layout(int32_t tokens, int32_t seqs, int32_t updates,
                                int32_t penalties, int32_t items, int32_t singles) const {
  step_layout l;
  l.singles = singles;
  l.tokens = tokens;
  l.seqs = seqs;
  l.updates = updates;
  l.penalties = penalties;
  l.items = items;
  l.busy_items = items;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    off = align16(off);
    const size_t at = off;
    off += bytes;
    return at;
  };
  const size_t t = size_t(tokens), b = size_t(seqs);
  l.header = take(16);
  l.ids = take(t * 4);
  l.positions = take(t * 4);
  l.token_seq = take(t * 4);
  l.seq_slot = take(b * 4);
  l.seq_q_start = take((b + 1) * 4);
  l.seq_len = take(b * 4);
  l.sample_src = take(b * 4);
  l.temperature = take(b * 4);
  l.top_p = take(b * 4);
  l.min_p = take(b * 4);
  l.top_k = take(b * 4);
  l.seed = take(b * 8);
  l.step = take(b * 4);
  l.repetition = take(b * 4);
  l.frequency = take(b * 4);
  l.presence = take(b * 4);
  l.logprobs = take(b * 4);
  l.update_data = take(size_t(updates) * 12);
  l.item_data = take(size_t(items) * sizeof(prefill_item));
  const size_t s = size_t(singles);
  l.single_slot = take(s * 4);
  l.single_q_start = take(s * 4);
  l.single_len = take(s * 4);
  // Work lists where the decode attention reads them: over a decode step's
  // batch (every row one token), and over a prompt step's singles.
  if (tokens == seqs && singles == 0 && items == 0)
    l.work_items = rule_.items(seqs);
  l.single_work_items = rule_.items(singles);
  l.work = take(size_t(l.work_items) * 4);
  l.single_work = take(size_t(l.single_work_items) * 4);
  l.bytes = align16(off);
  return l;
}

step_layout step_packer::mixed_layout(int32_t singles, int32_t prompt, int32_t tile) const {
  const int32_t items = (prompt + tile - 1) / tile + mixed_max_chunks;
  // New pages: at most one per decode, a chunk's own plus one, and the
  // cached pages a newly admitted sequence starts on (a prefix of up to
  // 1,024 pages; 12 bytes each in the step's copy).
  const int32_t base = singles + prompt / shape.page_size + 2 * mixed_max_chunks + 16;
  const int32_t updates =
    base + std::max(0, std::min({shape.page_stride, 1024, shape.update_capacity - base}));
  step_layout l = layout(singles + prompt, singles + mixed_max_chunks + 1, updates, 0, items,
                         singles);
  l.busy_items = (prompt + tile - 1) / tile;
  return l;
}

void step_packer::pack(unsigned char* base, const step_layout& l,
                       std::span<const engine_chunk> chunks, std::span<const page_update> updates,
                       std::span<const prefill_item> items, int32_t num_penalties,
                       bool mixed) const {
  const int32_t scratch = shape.scratch_slot;
  auto i32 = [&](size_t off) { return reinterpret_cast<int32_t*>(base + off); };
  auto f32 = [&](size_t off) { return reinterpret_cast<float*>(base + off); };
  int32_t* header = i32(l.header);
  header[0] = int32_t(updates.size());
  header[1] = num_penalties;
  int32_t* ids = i32(l.ids);
  int32_t* positions = i32(l.positions);
  int32_t* token_seq = i32(l.token_seq);
  int32_t* seq_slot = i32(l.seq_slot);
  int32_t* q_start = i32(l.seq_q_start);
  int32_t* seq_len = i32(l.seq_len);
  int32_t* sample_src = i32(l.sample_src);
  float* temperature = f32(l.temperature);
  float* top_p = f32(l.top_p);
  float* min_p = f32(l.min_p);
  int32_t* top_k = i32(l.top_k);
  auto* seed = reinterpret_cast<uint64_t*>(base + l.seed);
  int32_t* step = i32(l.step);
  float* repetition = f32(l.repetition);
  float* frequency = f32(l.frequency);
  float* presence = f32(l.presence);
  int32_t* logprobs = i32(l.logprobs);

  int32_t* single_slot = i32(l.single_slot);
  int32_t* single_q_start = i32(l.single_q_start);
  int32_t* single_len = i32(l.single_len);

  int32_t row = 0, sampled = 0, single = 0;
  // A greedy sampling row that nobody reads, for padding.
  auto pad_sample = [&](int32_t src) {
    const int32_t r = sampled++;
    sample_src[r] = src;
    temperature[r] = 0.0f;
    top_p[r] = 1.0f;
    min_p[r] = 0.0f;
    top_k[r] = 0;
    seed[r] = 0;
    step[r] = 0;
    repetition[r] = 1.0f;
    frequency[r] = 0.0f;
    presence[r] = 0.0f;
    logprobs[r] = -1;
  };
  const int32_t real = mixed ? int32_t(chunks.size()) : l.seqs;
  for (int32_t c = 0; c < real; ++c) {
    q_start[c] = row;
    if (size_t(c) < chunks.size()) {
      const auto& ch = chunks[size_t(c)];
      const int32_t n = int32_t(ch.tokens.size());
      if (n == 1 && single < l.singles) {
        single_slot[single] = ch.slot;
        single_q_start[single] = row;
        single_len[single] = ch.start_pos + 1;
        ++single;
      }
      for (int32_t i = 0; i < n; ++i, ++row) {
        const int32_t token = ch.tokens[size_t(i)];
        // A fed token: -1 - its row in the previous step's sampled ids,
        // which the embedding gather reads on the device.
        ids[row] = token >= 0 ? token : -1 - ch.fed_row;
        positions[row] = ch.start_pos + i;
        token_seq[row] = c;
      }
      seq_slot[c] = ch.slot;
      seq_len[c] = ch.start_pos + n;
      if (ch.sample) {
        const int32_t r = sampled++;
        sample_src[r] = row - 1;
        temperature[r] = ch.temperature;
        top_p[r] = ch.top_p;
        min_p[r] = ch.min_p;
        top_k[r] = ch.top_k;
        seed[r] = ch.seed;
        step[r] = ch.sample_step;
        repetition[r] = ch.repetition_penalty;
        frequency[r] = ch.frequency_penalty;
        presence[r] = ch.presence_penalty;
        logprobs[r] = ch.logprobs;
      }
    } else {
      // A padding row: token 0 at position 0 of the scratch slot, greedy.
      ids[row] = 0;
      positions[row] = 0;
      token_seq[row] = c;
      ++row;
      seq_slot[c] = scratch;
      seq_len[c] = 1;
      pad_sample(row - 1);
    }
  }
  if (mixed) {
    // Padding of a mixed graph (mixed_layout): one-token rows in the
    // scratch slot up to its decode attention's count, empty prompt chunks,
    // then the prompt rows left in one sequence of the scratch slot (their
    // keys all go to its scratch row; no item reads them), and greedy
    // sampling rows up to its LM head's.
    int32_t c = real;
    for (; single < l.singles; ++single, ++c, ++row) {
      q_start[c] = row;
      ids[row] = 0;
      positions[row] = 0;
      token_seq[row] = c;
      seq_slot[c] = scratch;
      seq_len[c] = 1;
      single_slot[single] = scratch;
      single_q_start[single] = row;
      single_len[single] = 1;
      pad_sample(row);
    }
    for (; c < l.seqs - 1; ++c) {
      q_start[c] = row;
      seq_slot[c] = scratch;
      seq_len[c] = 0;
    }
    q_start[c] = row;
    seq_slot[c] = scratch;
    seq_len[c] = 1;
    for (; row < l.tokens; ++row) {
      ids[row] = 0;
      positions[row] = 0;
      token_seq[row] = c;
    }
    while (sampled < l.seqs - 1)
      pad_sample(0);
  }
  q_start[l.seqs] = row;
  int32_t* upd = i32(l.update_data);
  for (size_t i = 0; i < updates.size(); ++i) {
    upd[3 * i] = updates[i].slot;
    upd[3 * i + 1] = updates[i].index;
    upd[3 * i + 2] = updates[i].page;
  }
  if (l.work_items > 0)
    rule_.fill(seq_len, l.seqs, i32(l.work), l.work_items);
  if (l.single_work_items > 0)
    rule_.fill(i32(l.single_len), l.singles, i32(l.single_work), l.single_work_items);
  if (!items.empty())
    std::memcpy(base + l.item_data, items.data(), items.size() * sizeof(prefill_item));
  if (mixed) {
    auto* it = reinterpret_cast<prefill_item*>(base + l.item_data);
    for (size_t i = items.size(); i < size_t(l.items); ++i)
      it[i] = prefill_item{-1, 0};
  }
}

int32_t step_packer::cut_prefill_items(std::span<const engine_chunk> chunks, int32_t tile,
                                       std::vector<prefill_item>& items) {
  items.clear();
  int32_t singles = 0;
  const int32_t n = int32_t(chunks.size());
  for (int32_t c = 0; c < n; ++c) {
    const int32_t len = int32_t(chunks[size_t(c)].tokens.size());
    if (len == 1) {
      ++singles; // the decode attention's (see forward_pass::enqueue_general)
      continue;
    }
    for (int32_t r = 0; r < len; r += tile)
      items.push_back({c, r});
  }
  // Longest first: the tile's last key position decides its work.
  std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
    auto end = [&](const prefill_item& it) {
      const auto& ch = chunks[size_t(it.seq)];
      return ch.start_pos + std::min<int32_t>(it.row + tile, int32_t(ch.tokens.size()));
    };
    return end(a) > end(b);
  });
  return singles;
}

void step_packer::pack_penalties(std::span<const engine_chunk> chunks, penalty_entry* out) {
  penalty_entry* e = out;
  int32_t row = 0;
  for (const auto& ch : chunks) {
    if (!ch.sample)
      continue;
    for (auto p : ch.penalties) {
      p.row = row;
      *e++ = p;
    }
    ++row;
  }
}

void step_packer::pack_page_updates(std::span<const page_update> updates, int32_t* out) {
  out[0] = int32_t(updates.size());
  for (size_t i = 0; i < updates.size(); ++i) {
    out[4 + 3 * i] = updates[i].slot;
    out[4 + 3 * i + 1] = updates[i].index;
    out[4 + 3 * i + 2] = updates[i].page;
  }
}

std::vector<int32_t> step_packer::decode_sizes(int32_t max_batch) {
  std::vector<int32_t> sizes;
  for (int32_t n = 1; n <= max_batch;) {
    sizes.push_back(n);
    const int32_t next = n < 8 ? n * 2 : n + 8;
    n = next > max_batch && n < max_batch ? max_batch : next;
  }
  return sizes;
}

std::vector<std::pair<int32_t, int32_t>> step_packer::mixed_sizes(int32_t max_batch,
                                                                  int32_t max_tokens) {
  std::vector<std::pair<int32_t, int32_t>> sizes;
  // One-token rows padded to these counts (the largest: what max_batch_size
  // leaves beside the chunks), prompt rows to these; a grid of 8 x 6 at the
  // server's defaults, each captured twice (per staging slot).
  // None (a small prefill alone) gets graphs of its own: padding rows would
  // cost it GEMM rows (a 128-token prefill with 8 took 5.67 ms against 5.41
  // uncaptured on the H200).
  std::vector<int32_t> singles = {0};
  const int32_t top = max_batch - mixed_max_chunks;
  for (int32_t s : {8, 16, 32, 48, 64, 96, 128})
    if (s < top)
      singles.push_back(s);
  if (top >= 1)
    singles.push_back(top);
  for (int32_t s : singles)
    for (int32_t p : {16, 32, 64, 128, 192, 256})
      if (s + p <= max_tokens)
        sizes.emplace_back(s, p);
  return sizes;
}

} // namespace metronome::gpu
