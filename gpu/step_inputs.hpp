#pragma once
// The plain host structs a step's inputs are made of: what the runner hands
// the engine (engine_chunk, page_update) and the records the packer writes
// for the kernels (prefill_item, penalty_entry). No CUDA headers: the step
// packer and its host tests use them on machines without the toolkit, and
// the kernels read prefill_item and penalty_entry with this same layout.

#include <cstdint>
#include <span>

namespace metronome::gpu {

/// Work item of the prefill kernel: sequence and first query row of a tile.
struct prefill_item {
  int32_t seq = 0; // < 0: a padding item (its block returns at once)
  int32_t row = 0; // offset of the tile within the sequence's rows
};

/// One penalty entry: a distinct token of one row's prompt or output.
struct penalty_entry {
  int32_t row = 0;
  int32_t token = 0;
  int32_t output_count = 0; // times sampled so far
  int32_t repetition = 0;   // 1: apply the repetition penalty
};

/// One sequence's share of a step, as the runner describes it.
struct engine_chunk {
  int32_t slot = 0;
  int32_t start_pos = 0;                // tokens already cached
  std::span<const int32_t> tokens;      // tokens to compute; -1: fed (below)
  /// For a token of -1: the row of the previous step's sampled ids to read
  /// it from on the device (that step must be the last one launched).
  int32_t fed_row = -1;
  bool sample = false;                  // the chunk completes the sequence's tokens
  // Sampling (when sample).
  float temperature = 1.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  int32_t top_k = 0;
  /// sampling_params::logprobs: -1 none, else alternatives to report.
  int32_t logprobs = -1;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  uint64_t seed = 0;
  int32_t sample_step = 0;               // index in the random stream
  std::span<const penalty_entry> penalties; // row field ignored (set by the engine)
};

/// A page-table update: slot's entry `index` becomes `page`.
struct page_update {
  int32_t slot = 0;
  int32_t index = 0;
  int32_t page = 0;
};

} // namespace metronome::gpu
