#pragma once
// The vocabulary between a scheduler and a model runner, as plain structs:
// what one engine step must compute and what it produced. The actor layer
// wraps these types as messages; nothing here knows about actors.
//
// Design note. A plan names sequences by id. A sequence is announced once
// (new_sequence, with its prompt and sampling settings); afterwards a plan
// only says how many of its tokens to compute this step and which KV pages
// were added for them. The runner keeps each sequence's tokens, including the
// ones it sampled, so a plan for step n + 1 can be made before step n's
// tokens are known: a decode chunk of one token always means "the token
// sampled last". A sequence leaves the runner when a plan lists it as
// released.
//
// KV precision. Each sequence's keys and values are written either in the
// cache's configured element type or in full precision (kv_precision). The
// overflow supervision (sched/kv_precision_controller.hpp, the
// kv_precision_supervisor actor) re-admits a sequence whose fp8_e5m2 keys or
// values overflowed with kv_precision::full, and admits new sequences so
// during a cool-down; the runner reports what overflowed per sequence in
// step_output::kv_overflows. The CPU runner honours the precision (full: its
// fp32 cache unrounded); the CUDA runner counts fp8_e5m2 overflows but keeps
// no full-precision pages beside its fp8 ones, so it refuses a full sequence
// (plan_error) and no supervisor runs there.

#include <cstdint>
#include <vector>

#include "model/sampling.hpp"

namespace metronome {

/// How a sequence's keys and values are written: in the KV cache's
/// configured element type (engine.kv_cache_dtype), or in full precision
/// (bf16 on a GPU; the CPU's fp32 cache unrounded).
enum class kv_precision : uint8_t { configured, full };

/// "configured" or "full".
constexpr const char* to_string(kv_precision p) {
  return p == kv_precision::full ? "full" : "configured";
}

/// A sequence the runner has not seen before.
struct new_sequence {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  sampling_params params;
  /// The seed of its random stream (params.seed or one drawn at admission).
  uint64_t seed = 0;
  /// How many tokens at the end of `prompt` the model generated earlier (a
  /// sequence re-admitted after preemption): they count for the penalties
  /// and advance the random stream, so preemption never changes the output.
  int32_t num_output = 0;
  /// Prefix caching: the first num_cached tokens of `prompt` are computed
  /// already, their keys and values in `cached_pages` (shared with other
  /// sequences: never written), which start the sequence's page table.
  /// num_cached is cached_pages.size() x page_size and below prompt.size().
  int32_t num_cached = 0;
  std::vector<int32_t> cached_pages;
  /// How its keys and values are written (the note above); its cached pages
  /// were written the same way (the prefix cache keeps the precisions apart).
  kv_precision precision = kv_precision::configured;
};

/// Work for one sequence in one step.
struct scheduled_chunk {
  uint64_t id = 0;
  /// Tokens to compute: part or all of the rest of the prompt, or 1 to decode.
  int32_t num_tokens = 0;
  /// KV pages appended to the sequence's page table before this step.
  std::vector<int32_t> new_pages;
};

/// One engine step.
struct step_plan {
  uint64_t step = 0;
  std::vector<new_sequence> added;
  std::vector<scheduled_chunk> chunks;
  /// Sequences to forget (finished, cancelled or failed), before the step.
  std::vector<uint64_t> released;
};

/// A token sampled for a sequence whose chunk reached the end of its tokens.
struct sampled_token {
  uint64_t id = 0;
  int32_t token = 0;
  /// Under the sampler's final distribution (after penalties and filters).
  float logprob = 0;
  /// Only for a sequence whose params.logprobs >= 0: the sampled token's
  /// log-probability under the model, then the params.logprobs most likely
  /// tokens' (see model/sampling.hpp).
  std::vector<token_logprob> logprobs;
};

/// Values of one sequence's keys and values that the step could not store
/// in the configured element type (fp8_e5m2: saturated past the window's
/// range, or not finite); only sequences with some are listed.
struct sequence_kv_overflow {
  uint64_t id = 0;
  int64_t saturated = 0;
  int64_t non_finite = 0;
};

/// What one step produced.
struct step_output {
  uint64_t step = 0;
  std::vector<sampled_token> tokens;
  /// Tokens computed this step (prompt tokens plus decodes).
  int64_t num_tokens = 0;
  /// Sequences in the step.
  int32_t num_seqs = 0;
  /// Wall time of the step, seconds: from its submission, or from the end of
  /// the step it was queued behind (overlapped steps), to its end.
  double seconds = 0;
  /// Device time of the step, seconds, where the runner measures it (CUDA:
  /// event timing from its first operation on the stream to its last);
  /// 0 where it does not (CPU).
  double device_seconds = 0;
  /// Sequences whose keys or values written this step overflowed the KV
  /// cache's element type (new counts of this step only), in plan order.
  std::vector<sequence_kv_overflow> kv_overflows;
};

} // namespace metronome
