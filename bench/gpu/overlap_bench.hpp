#pragma once
// gpu_bench --overlap: can decode steps keep their pace while prompts are
// computed beside them? Two runners of one model share the device, each on
// its own thread: a decode runner stepping a batch of long-running
// sequences, and a prompt runner computing prompts chunk after chunk. Per
// split of the SMs (green contexts: the first D SMs decode, the rest
// prompts; or both on every SM, two plain streams) it measures the decode
// step alone and beside prompts, the prompt chunk alone and its rate beside
// decodes, and, on the decode runner, the serial engine's answer: one mixed
// step carrying the decodes and the whole chunk (what fcfs runs).
// docs/scheduling.md, "Spatial sharing", reads the figures.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace metronome {
struct model_folder;
}

namespace metronome::bench {

struct overlap_options {
  /// SMs of the decode runner's share, one measurement each; 0: both
  /// runners on every SM (two streams, no partition).
  std::vector<int32_t> decode_sms = {0, 64, 88, 104};
  /// Prompt chunk sizes (tokens a prompt step computes).
  std::vector<int32_t> chunks = {512, 2048};
  int32_t decode_batch = 64;
  /// Each decoding sequence's context when the measurement starts.
  int32_t context = 1024;
  /// Measured decode steps per phase.
  int32_t steps = 60;
};

/// Runs the measurement on device 0 (two copies of the weights: the device
/// needs room for both) and appends one row per split and chunk to `rows`
/// ({"split", "chunk", "decode_alone_ms", "decode_beside_p50_ms",
/// "decode_beside_p95_ms", "prompt_alone_ms", "prompt_beside_tok_s",
/// "serial_mixed_ms", ...}); prints a table. The calling thread waits;
/// each runner lives on a thread of its own.
void overlap_bench(const std::shared_ptr<const model_folder>& model,
                   const overlap_options& options, nlohmann::json& rows);

/// Parses "0,64,88" (SM counts, 0 = no partition); empty on malformed input.
std::vector<int32_t> parse_int_list(const std::string& text);

} // namespace metronome::bench
