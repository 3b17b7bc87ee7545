#pragma once
// The step packer: turns one step's chunks and page updates into the
// host-side arrays its kernels read (token ids, positions, sequence slots,
// query offsets, sampling rows, page-table updates, prefill tiles, the decode
// attention's work list), at offsets fixed by the step's capacities.
//
// Design note. A step's inputs travel to the device in one copy of one block
// whose layout (step_layout) depends only on capacities (tokens, sequences,
// updates, penalties, items, one-token rows), never on the step's contents:
// a captured graph reads its inputs at fixed addresses, so any step that
// fits its capacities can be packed into its block and replayed. Rows past
// a step's chunks become padding: a dummy token at position 0 of the
// scratch slot (a page-table row no sequence owns), sampled greedily and
// never read. The packer is host arithmetic only (no CUDA runtime calls,
// no CUDA headers), so it builds without the toolkit and its unit tests run
// on any machine; the decode attention's work-list rule, which lives with
// the kernels, reaches it as a work_list_rule.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "gpu/step_inputs.hpp"

namespace metronome::gpu {

/// Offsets (bytes, 16-byte aligned) of the per-step arrays of one input
/// block for given capacities.
struct step_layout {
  int32_t tokens = 0, seqs = 0, updates = 0, penalties = 0, items = 0;
  /// Of items, those a step is expected to fill (a mixed graph's capacity
  /// has room for more; its padding items return at once).
  int32_t busy_items = 0;
  /// One-token chunks of a step with prompt chunks (0 otherwise): their
  /// attention runs in the decode kernel over the `single_*` arrays.
  int32_t singles = 0;
  /// Items of the decode attention's work lists (balanced splits) over the
  /// batch (a decode step's) and over the singles; 0: none.
  int32_t work_items = 0, single_work_items = 0;
  size_t work = 0, single_work = 0;
  size_t header = 0, ids = 0, positions = 0, token_seq = 0;
  size_t seq_slot = 0, seq_q_start = 0, seq_len = 0, sample_src = 0;
  size_t single_slot = 0, single_q_start = 0, single_len = 0;
  size_t temperature = 0, top_p = 0, min_p = 0, top_k = 0, seed = 0, step = 0;
  size_t repetition = 0, frequency = 0, presence = 0, logprobs = 0;
  size_t update_data = 0, item_data = 0;
  size_t bytes = 0;
};

/// The decode attention's work-list rule (kernels.hpp:
/// decode_attention_work_items, decode_attention_work) bound to the model's
/// attention shape and the device: the engine supplies it, tests fake it.
struct work_list_rule {
  /// Items of the list for a batch of `seqs` one-token rows (0: no list).
  std::function<int32_t(int32_t seqs)> items;
  /// Fills work[items] for the KV lengths seq_len[seqs].
  std::function<void(const int32_t* seq_len, int32_t seqs, int32_t* work, int32_t items)> fill;
};

/// What the packer knows of the engine. Each field is set as the engine's
/// memory plan decides it, before the first layout or pack that reads it.
struct step_packer_shape {
  /// Tokens a KV page.
  int32_t page_size = 16;
  /// Page-table entries one step's block holds.
  int32_t update_capacity = 0;
  /// The page-table row of padding rows (max_seqs: no sequence owns it).
  int32_t scratch_slot = 0;
  /// Page-table entries a sequence: a mixed layout holds up to this many
  /// cached pages of a newly admitted sequence.
  int32_t page_stride = 1;
};

class step_packer {
public:
  /// Most prompt chunks a mixed graph's layout holds.
  static constexpr int32_t mixed_max_chunks = 4;

  explicit step_packer(work_list_rule rule) : rule_(std::move(rule)) {
  }

  /// Set by the engine while it plans its memory (constructor thread).
  step_packer_shape shape;

  /// The layout of a block with these capacities. The decode attention's
  /// work list is laid out for a decode step (tokens == seqs, no singles,
  /// no items) and for the singles. Any thread; no side effects.
  step_layout layout(int32_t tokens, int32_t seqs, int32_t updates, int32_t penalties,
                     int32_t items, int32_t singles = 0) const;

  /// Page-table updates a decode step of `batch` rows carries in its block.
  static int32_t decode_updates(int32_t batch) {
    return 4 * batch + 16;
  }

  /// The layout of a decode step (and its graph) of `batch` rows.
  step_layout decode_layout(int32_t batch) const {
    return layout(batch, batch, decode_updates(batch), 0, 0);
  }

  /// The layout of the mixed graph for `singles` one-token rows and `prompt`
  /// prompt rows cut into tiles of `tile` rows (prefill_tile_rows()): room
  /// for mixed_max_chunks chunks, one padding sequence, and the page updates
  /// of its decodes, chunks and one admitted prefix.
  step_layout mixed_layout(int32_t singles, int32_t prompt, int32_t tile) const;

  /// Packs the step into the block at `base` (host memory of l.bytes) with
  /// layout l; sequences past the chunks (up to l.seqs) become padding
  /// rows. With `mixed` (a mixed graph's layout) the padding is instead:
  /// one-token rows up to l.singles, empty prompt chunks, then one sequence
  /// holding the prompt rows left, and sampling rows up to l.seqs - 1;
  /// items past the step's are padding items. Writes only the arrays of l;
  /// the executor's thread, before the block's copy is enqueued.
  void pack(unsigned char* base, const step_layout& l, std::span<const engine_chunk> chunks,
            std::span<const page_update> updates, std::span<const prefill_item> items,
            int32_t num_penalties, bool mixed = false) const;

  /// Replaces `items` with the prefill tiles of the chunks of more than one
  /// token (`tile` rows each), longest-ending first (the tile's last key
  /// position decides its work); returns the one-token chunks, which attend
  /// in the decode kernel instead.
  static int32_t cut_prefill_items(std::span<const engine_chunk> chunks, int32_t tile,
                                   std::vector<prefill_item>& items);

  /// Writes the sampled chunks' penalty entries to `out`, each with its
  /// sampling row (the sampled chunks counted in order).
  static void pack_penalties(std::span<const engine_chunk> chunks, penalty_entry* out);

  /// Bytes of a block of page updates of its own (apply_page_updates): a
  /// 16-byte header holding the count, then (slot, index, page) triples.
  static size_t page_update_block_bytes(size_t updates) {
    return 16 + updates * 12;
  }

  /// Writes such a block to `out`.
  static void pack_page_updates(std::span<const page_update> updates, int32_t* out);

  /// The padded decode batch sizes to capture: 1, 2, 4, 8, then steps of 8,
  /// the last one max_batch.
  static std::vector<int32_t> decode_sizes(int32_t max_batch);

  /// The (one-token rows, prompt rows) sizes of the mixed graphs, ascending
  /// by one-token rows, then prompt rows.
  static std::vector<std::pair<int32_t, int32_t>> mixed_sizes(int32_t max_batch,
                                                              int32_t max_tokens);

private:
  work_list_rule rule_;
};

} // namespace metronome::gpu
