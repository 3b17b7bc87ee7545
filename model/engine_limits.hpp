#pragma once
// The limits of one engine as plain values: how many sequences and tokens a
// step takes, how long a sequence may grow, how the KV cache is cut into
// pages and how large it is, how many requests may wait, and how long a step
// may take. One struct with one set of defaults, those of metronome.yaml
// (docs/configuration.md), so `engine_limits{}` is what `metronome serve`
// runs with no file and no flags. The configuration fills it once
// (sim::settings_from_config); the engine (engine_options), the scheduler
// (scheduler_config), the runners (cuda_runner_options, make_cpu_runner)
// and the replay (sim::scheduling_settings) take it whole. No CAF and no
// CUDA: every layer includes it.

#include <chrono>
#include <cstdint>

namespace metronome {

struct engine_limits {
  /// Most sequences in one step (engine.max_batch_size; vLLM's max_num_seqs).
  /// The CUDA runner captures decode graphs up to this size.
  int32_t max_batch_size = 128;
  /// Most tokens one step computes: one per decoding sequence plus prompt
  /// chunks (engine.max_num_batched_tokens).
  int32_t max_num_batched_tokens = 2048;
  /// Most prompt tokens of one sequence in one step
  /// (engine.prefill_chunk_tokens); 0 = what is left of the step's budget.
  /// A cap keeps one long prompt from taking a whole step, so several
  /// prompts progress side by side; at most max_num_batched_tokens.
  int32_t prefill_chunk_tokens = 0;
  /// Longest sequence, prompt plus output, in tokens (model.max_model_len);
  /// 0 = the model's max_position_embeddings. The scheduler takes it
  /// resolved (> 0; with 0 every request is too long): spawn_engine resolves
  /// it to the model's context (on the CPU, lowered to what the KV cache
  /// holds), the replay to its cost model's.
  int32_t max_model_len = 0;
  /// Tokens per KV page, a power of two (engine.page_size).
  int32_t page_size = 16;
  /// KV capacity in tokens (engine.kv_cache_tokens); 0 = the runner sizes
  /// it: the CUDA runner from the device's memory, the CPU runner for
  /// max_batch_size sequences of max_model_len, at most 1 GiB.
  int64_t kv_cache_tokens = 0;
  /// Requests waiting for admission beyond which the scheduler refuses new
  /// ones (queue_full; server.max_queued_requests).
  int32_t max_queued_requests = 1024;
  /// Longest one step may take (engine.step_timeout_ms): the scheduler then
  /// gives up on the step and has its executor replaced, and every wait of
  /// the CUDA runner for its device (a step, its own start-up work, its
  /// shutdown) ends there too, so a hung kernel is an error, never an
  /// endless wait.
  std::chrono::milliseconds step_timeout{30000};

  /// step_timeout in seconds.
  double step_timeout_s() const {
    return std::chrono::duration<double>(step_timeout).count();
  }

  bool operator==(const engine_limits&) const = default;
};

} // namespace metronome
