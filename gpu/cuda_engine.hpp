#pragma once
// The forward pass on one CUDA device, as the CUDA runner drives it: it
// builds the engine's parts at start-up, then launches steps and answers
// them in order, at most two in flight.
//
// Design note. The engine owns the parts and sequences them; each job is a
// part of its own: the memory_planner sizes the KV pool from what the
// device has left, the weight_store uploads the weights, the kv_pool holds
// the paged cache, the forward_pass enqueues a step's kernels over its
// activations, the step_packer (host only) lays out and fills each step's
// pinned input block, the decode_graph_cache holds the captured graphs and
// picks one for a step, and the startup_tuner times the choices the graphs
// are captured with. Every step's inputs are packed into one pinned block
// and copied to the device in one transfer (in a graph, by its first node).
// Two steps can be in flight (launch, then finish): each has its own
// pinned staging and result block (slots 0 and 1, alternating), and each
// graph is captured twice, once per slot. A token the previous step samples
// reaches the next one on the device: the runner passes its row
// (engine_chunk::fed_row) and the embedding gather reads the id from that
// step's sampled ids, so the host never waits for it. Page tables live on
// the device per sequence slot and change only by the updates of each step.
// Steps no graph serves run the same kernels uncaptured. All of it on the
// runner's (executor's) thread.

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "gpu/cuda_runner.hpp"
#include "gpu/decode_graph_cache.hpp"
#include "gpu/device_memory.hpp"
#include "gpu/forward_pass.hpp"
#include "gpu/kernels.hpp"
#include "gpu/kv_pool.hpp"
#include "gpu/memory_planner.hpp"
#include "gpu/sm_partition.hpp"
#include "gpu/step_inputs.hpp"
#include "gpu/step_packer.hpp"
#include "gpu/weight_store.hpp"
#include "model/model_weights.hpp"

namespace metronome::gpu {

/// What one step produced, in chunk order for the sampled chunks.
struct engine_result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  /// Per sampled chunk: empty, or (where it asked) the sampled token's model
  /// log-probability, then its `logprobs` alternatives.
  std::vector<std::vector<token_logprob>> model_logprobs;
  /// Device time of the step in milliseconds: from its first operation on
  /// the stream to its last (CUDA event timing), so neither the host's share
  /// nor a wait behind the step before it counts.
  double device_ms = 0;
  /// The fp8_e5m2 cache only: per chunk of the step, in order, the values
  /// its writes saturated, then those not finite ([chunks][2]); empty for
  /// the other element types.
  std::vector<uint32_t> kv_overflow;
};

class cuda_engine {
public:
  /// Builds everything on options.device; see make_cuda_runner.
  cuda_engine(std::shared_ptr<const model_folder> model, const cuda_runner_options& options);
  ~cuda_engine();

  cuda_engine(const cuda_engine&) = delete;
  cuda_engine& operator=(const cuda_engine&) = delete;

  /// Runs one step and waits for its ids (bounded by the step timeout); none
  /// may be in flight.
  engine_result run(std::span<const engine_chunk> chunks, std::span<const page_update> updates);

  /// Enqueues one step and returns without waiting for it. At most two are
  /// in flight (std::logic_error beyond); a step with penalties only when
  /// none is (they share one pinned block). Throws std::invalid_argument for
  /// a step beyond the capacities, before enqueuing anything.
  void launch(std::span<const engine_chunk> chunks, std::span<const page_update> updates);

  /// Page-table entries one step's input block holds; a step with more
  /// launches only when none is in flight (they travel in a block of their
  /// own).
  int32_t update_capacity() const {
    return update_capacity_;
  }

  /// Tests and drills only: the next launch() first enqueues a kernel that
  /// reads an unmapped address (a sticky device error; model_runner::
  /// arm_device_fault). The caller's thread, as launch().
  void arm_device_fault() {
    fault_armed_ = true;
  }

  /// Steps launched and not yet finished.
  size_t in_flight() const {
    return flight_.size();
  }

  /// True when the oldest step in flight has finished (false when none is).
  bool oldest_done();

  /// Seconds since the oldest step in flight was launched (0 when none).
  double oldest_age_s() const;

  /// Waits for the oldest step in flight, at most until the step timeout after
  /// its launch (then cuda_error), and returns its ids; std::logic_error
  /// when none is in flight.
  engine_result finish();

  const model_config& config() const {
    return model_->config;
  }

  int32_t num_pages() const {
    return kv_->num_pages();
  }

  int32_t page_size() const {
    return options_.limits.page_size;
  }

  int32_t max_seqs() const {
    return max_seqs_;
  }

  int32_t max_pages_per_seq() const {
    return kv_->page_stride();
  }

  const cuda_runner_options& options() const {
    return options_;
  }

  /// The stream every step runs on, in launch order (the runner records its
  /// step notifier's events on it).
  cudaStream_t stream() const {
    return stream_;
  }

  const std::vector<memory_plan_entry>& memory_plan() const {
    return planner_.entries();
  }

  /// Between steps (none in flight).
  void set_graphs(bool on) {
    graphs_enabled_ = on;
  }

  /// Between steps: whether steps with prompt chunks may replay the mixed
  /// graphs (when graphs are on and were captured).
  void set_mixed_graphs(bool on) {
    mixed_enabled_ = on;
  }

  /// Mixed graphs captured (both slots' twins count as one).
  size_t mixed_graph_count() const {
    return graphs_->mixed_graphs().size();
  }

  /// Steps that replayed a mixed graph since start-up.
  uint64_t mixed_launches() const {
    return mixed_launches_;
  }

  /// The first `rows` rows of the last step's logits (synchronous; tests).
  std::vector<float> logits(int32_t rows);

  /// Device time per step of the decode graph serving `batch` sequences,
  /// replayed back to back (no host work between steps): on padding inputs,
  /// or, with repeat_last_step, on the last step's own inputs (a decode
  /// step is idempotent: it rewrites the same keys and values and samples
  /// the same ids). NaN when no graph serves that size, or the last step
  /// was not that graph. Synchronous; between steps, on the runner's thread
  /// (benchmarks).
  double graph_replay_ms(int32_t batch, bool repeat_last_step);

  /// How a decode step computes its projections (forward_pass.hpp).
  using decode_path = gpu::decode_path;

  /// The SM share the runner runs on ("all 132 SMs", "first 64 of 132 SMs").
  std::string sm_share() const {
    return partition_ ? partition_->describe() : "all " + std::to_string(num_sms_) + " SMs";
  }

  /// Which path each captured decode batch size takes ("1:gemv,16:skinny,...").
  std::string small_batch_choice() const {
    return graphs_->small_batch_choice();
  }

  /// How the weights are held: "bf16", or for a 4-bit checkpoint "int4
  /// (gptq, 4 bits, group 128): 4 of 4 matrices a layer", then each
  /// matrix kept as bf16 and why (weight_store::int4_fallbacks).
  std::string weights_choice() const;

private:
  /// Builds the forward pass, sizes the step blocks and allocates them.
  void allocate_activations();
  /// Plans the KV pool (measuring one probe capture of each graph kind),
  /// allocates it and has the startup_tuner capture the graphs.
  void plan_kv_and_capture();
  /// Enqueues an uncaptured step packed in staging slot `slot` with layout
  /// l: its input copy, the decode or general forward, the ids' copy back.
  void enqueue_eager(int32_t slot, const step_layout& l, int32_t sampled, int32_t penalties,
                     bool all_single, bool decode, bool any_logprobs);
  /// Enqueues page-table updates from a block of their own (none in flight).
  void apply_page_updates(std::span<const page_update> updates);
  void require_idle(const char* what) const;

  std::shared_ptr<const model_folder> model_;
  cuda_runner_options options_;
  memory_planner planner_;
  step_packer packer_;
  int32_t num_sms_ = 0;
  // The device's free memory before this runner allocated anything
  // (options_.device_replicas > 1: its own use is measured from here).
  size_t free_at_start_ = 0;
  // kv_cache_dtype "fp8" (kv_pool, forward_pass).
  bool kv_fp8_ = false;
  // With options_.sm_count: the green context whose stream stream_ is
  // (destroyed with it, after everything that enqueues on it).
  std::unique_ptr<sm_partition> partition_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  cudaEvent_t step_done_[2] = {nullptr, nullptr}; // per staging slot
  cudaEvent_t step_start_[2] = {nullptr, nullptr}; // per staging slot; with step_done_: device_ms
  cublasHandle_t cublas_ = nullptr;

  // The parts, in the order they are built (torn down in reverse).
  std::unique_ptr<weight_store> weights_;
  std::unique_ptr<kv_pool> kv_;
  std::unique_ptr<forward_pass> fwd_;
  host_blocks host_; // per slot: two steps in flight
  std::unique_ptr<decode_graph_cache> graphs_;

  pinned_buffer penalties_pinned_;
  // Page updates beyond a step's block (apply_page_updates; grown on demand).
  device_buffer big_updates_dev_;
  pinned_buffer big_updates_pinned_;
  std::vector<prefill_item> items_;
  size_t input_capacity_ = 0;
  int32_t update_capacity_ = 0, item_capacity_ = 0;
  int32_t max_seqs_ = 0;

  bool mixed_enabled_ = true;
  uint64_t mixed_launches_ = 0;
  bool graphs_enabled_ = true;
  bool fault_armed_ = false; // arm_device_fault()
  int32_t last_graph_ = -1; // the graph the last step replayed (-1: none)

  /// Steps launched and not finished, oldest first.
  struct flight {
    int32_t slot = 0;
    int32_t sampled = 0;
    int32_t seqs = 0; // chunks
    /// Per sampled row, the alternatives it asked for (-1: none); empty
    /// when no row asked, and then no log-probabilities were copied back.
    std::vector<int32_t> logprobs;
    std::chrono::steady_clock::time_point launched;
  };
  std::vector<flight> flight_; // at most two
  int32_t next_slot_ = 0; // the staging slot of the next step (after one: the last used 1 - it)
};

} // namespace metronome::gpu
