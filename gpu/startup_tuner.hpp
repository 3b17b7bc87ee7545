#pragma once
// The start-up tuner: the timings that decide, once per process, how the
// engine runs its steps: the cuBLAS algorithms and split-K choices of each
// projection shape, and for each decode size the path (GEMV, skinny GEMM,
// cuBLAS), the PDL setting and the late triggers its graph keeps.
//
// Design note. Every choice is made by timing the real thing on the device
// before any request arrives: a projection alone (gemm_tuner), then each
// candidate decode graph whole, since kernels timed alone mislead about a
// step (a split that wins alone may lose in the step). Where two choices
// are close, the challenger must win by a margin over alternating timings
// (wins_by_margin), so that drift during start-up favours neither and the
// simpler form stays. The tuner flushes L2 from the KV pool between
// timings (zero while no sequence runs). It runs on the engine's
// constructor thread, after the KV pool exists, and leaves the decode graph
// cache filled; nothing it decides changes afterwards.

#include <cstdint>

#include <cuda_runtime_api.h>

#include "gpu/cuda_runner.hpp"
#include "gpu/decode_graph_cache.hpp"
#include "gpu/forward_pass.hpp"
#include "gpu/kv_pool.hpp"
#include "gpu/weight_store.hpp"

namespace metronome::gpu {

class startup_tuner {
public:
  /// METRONOME_PDL=auto keeps a decode graph with PDL (then with late
  /// triggers) only if its mean of four timings beats the graph without by
  /// this fraction.
  static constexpr double pdl_margin = 0.01;

  startup_tuner(const model_config& config, const cuda_runner_options& options,
                forward_pass& forward, const weight_store& weights, const kv_pool& kv,
                decode_graph_cache& graphs, cudaStream_t stream);

  /// Tunes the projections, chooses and captures every decode size's graph
  /// (both slots) and the mixed graphs (`graphs_enabled`: the engine's
  /// setting). Synchronous; the engine's constructor thread.
  void capture_graphs(bool graphs_enabled);

private:
  /// Tunes the five projection shapes for m tokens (before capturing); for a
  /// decode batch or a mixed graph's rows, also chooses how the cuBLAS path
  /// splits its projections (forward_pass::split_choices).
  void tune_projections(int32_t m);
  /// Whether `challenger` beats `incumbent` (graphs of `batch`) by
  /// pdl_margin over four timings each in alternating order, so that a drift
  /// within the start-up favours neither.
  bool wins_by_margin(const graph_exec& challenger, const graph_exec& incumbent, int32_t batch);

  const model_config& config_;
  const cuda_runner_options& options_;
  forward_pass& forward_;
  const weight_store& weights_;
  const kv_pool& kv_;
  decode_graph_cache& graphs_;
  cudaStream_t stream_ = nullptr;
};

} // namespace metronome::gpu
