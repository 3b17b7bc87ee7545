#pragma once
// The decode-graph cache: the CUDA graphs a step replays instead of
// launching its ~360 kernels one by one, captured at start-up, and the rule
// that picks one for a step.
//
// Design note. A decode step of B sequences is padded to the next captured
// size (step_packer::decode_sizes); its graph holds the input block's copy,
// the whole decode forward pass with sampling and the copy of the ids back,
// so a decode step is one graph launch. Each size is captured twice, once
// per staging slot, so that a step launched behind one in flight copies
// through the other slot's blocks without waiting for the first graph's
// run. A step with prompt chunks of up to 256 tokens in all beside at most
// max_batch_size - 4 decodes replays a mixed graph, padded the same way to
// a grid of (decodes, prompt tokens) sizes (step_packer::mixed_sizes).
// Launch gaps of the ~360 kernels of an uncaptured mixed step cost the 8B
// shape ~1.4 ms on the H200 (kernel sum 7.8 ms, wall 9.1 ms beside 64
// decodes): every step that carries a prompt chunk was a long inter-token
// gap. Only small chunks (stall-free steps) are captured; larger ones run
// eagerly, where the gaps weigh little. Which path, PDL setting and splits
// each decode size captures with is the startup_tuner's choice; the cache
// holds the result. The engine's thread only.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "gpu/cuda_runner.hpp"
#include "gpu/device_memory.hpp"
#include "gpu/forward_pass.hpp"
#include "gpu/step_packer.hpp"

namespace metronome::gpu {

class decode_graph_cache {
public:
  /// One padded decode batch size and its captured step.
  struct decode_graph {
    int32_t size = 0;
    /// [slot]: the step copying through staging/result slot 0, and its twin
    /// through slot 1 (empty until captured).
    graph_exec exec[2];
    decode_path path = decode_path::blas;
    bool pdl = false;  // whether its launches use PDL (kernels.hpp)
    bool late = false; // and late triggers (late_triggers(), kernels.hpp)
    /// Both slots' graphs exist: steps of this size may replay it.
    bool captured() const {
      return exec[0] && exec[1];
    }
  };

  /// A captured step with prompt chunks: `singles` one-token rows (decodes,
  /// padded), at most step_packer::mixed_max_chunks prompt chunks of
  /// `prompt` rows in all (padded), its items and sampling rows padded to
  /// their capacities.
  struct mixed_graph {
    int32_t singles = 0, prompt = 0;
    graph_exec exec[2];
  };

  /// Over the engine's parts; captures nothing yet. The engine's
  /// constructor thread.
  decode_graph_cache(const cuda_runner_options& options, forward_pass& forward,
                     const step_packer& packer, host_blocks& host, cudaStream_t stream);

  /// The decode sizes to capture (none when `enabled` is false), each
  /// uncaptured.
  void plan_sizes(bool enabled);

  /// The (singles, prompt) sizes of the mixed graphs to capture, ascending
  /// (none unless graphs are `enabled` and options.mixed_graphs).
  std::vector<std::pair<int32_t, int32_t>> mixed_sizes(bool enabled) const;

  /// Captures what `enqueue` launches (a step of layout l) into `out`,
  /// between the copy of its inputs from staging block `slot` and of its
  /// results to result block `slot`, and uploads it. Returns its node count.
  size_t capture(const step_layout& l, int32_t slot, graph_exec& out,
                 const std::function<void()>& enqueue);

  /// Captures the decode step of `batch` sequences copying its inputs from
  /// staging block `slot` and its ids to result block `slot`.
  size_t capture_one(int32_t batch, decode_path path, graph_exec& out, int32_t slot = 0);

  /// Captures every graph captured so far again, each with the choices it
  /// was captured with (path, PDL, late triggers; both slots): under tensor
  /// parallelism, once the collectives are live, so that the graphs hold
  /// them (collective.hpp). Capture only: nothing runs on the device.
  void recapture();

  /// Captures the mixed step of graph `m` through slot `slot`.
  size_t capture_mixed(const mixed_graph& m, graph_exec& out, int32_t slot);

  /// The layout of the mixed graph for `singles` one-token rows and
  /// `prompt` prompt rows (the active prefill kernel's tiles).
  step_layout mixed_layout(int32_t singles, int32_t prompt) const;

  /// The smallest captured decode graph for `batch` sequences (-1: none).
  int32_t graph_index(int32_t batch) const;

  /// The smallest mixed graph for a step (-1: none fits).
  int32_t mixed_index(int32_t singles, int32_t chunks, int32_t prompt, int32_t updates) const;

  /// Device time per replay of g, replayed back to back; pads the inputs of
  /// both staging slots first unless `pad` is false. Synchronous; with no
  /// step in flight (the caller checks).
  double time(const graph_exec& g, int32_t batch, bool pad = true);

  /// The path of an uncaptured decode step of `batch` sequences.
  decode_path eager_path(int32_t batch) const;

  /// Which path each captured decode batch size takes ("1:gemv,16:skinny,...").
  std::string small_batch_choice() const;

  std::vector<decode_graph>& decode_graphs() {
    return graphs_;
  }

  const std::vector<decode_graph>& decode_graphs() const {
    return graphs_;
  }

  std::vector<mixed_graph>& mixed_graphs() {
    return mixed_graphs_;
  }

  const std::vector<mixed_graph>& mixed_graphs() const {
    return mixed_graphs_;
  }

private:
  const cuda_runner_options& options_;
  forward_pass& forward_;
  const step_packer& packer_;
  host_blocks& host_;
  cudaStream_t stream_ = nullptr;
  std::vector<decode_graph> graphs_;      // ascending sizes
  std::vector<mixed_graph> mixed_graphs_; // by singles, then prompt
};

} // namespace metronome::gpu
