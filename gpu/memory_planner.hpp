#pragma once
// The memory planner: the arithmetic of how the CUDA engine shares a device
// between weights, activations, captured graphs and the paged KV pool, and
// the record of what each took (memory_plan_entry, reported by /health and
// the start-up log).
//
// Design note. The KV pool gets what the configured share of device memory
// (gpu_memory_fraction of the device's total) leaves after what is already
// allocated (weights, activations, workspaces), an estimate of the graphs
// still to capture (measured by the engine on one probe capture of each
// kind, scaled by how many it will hold at once) and a fixed reserve for the
// CUDA context and cuBLAS; kv_cache_tokens overrides it. The planner only
// computes: the engine measures the device (cudaMemGetInfo), allocates and
// records, so this part needs no CUDA and is tested on the host.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/cuda_runner.hpp"
#include "model/model_config.hpp"

namespace metronome::gpu {

class memory_planner {
public:
  /// Memory left unplanned for the CUDA context's own growth and cuBLAS.
  static constexpr size_t reserve_bytes = 256ull << 20;

  /// For `config` served with `options` (any thread; no device calls).
  memory_planner(const model_config& config, const cuda_runner_options& options);

  /// Bytes of one token row of one kv head, in K and in V each: head_dim
  /// bf16, or head_dim e4m3 and its scale.
  size_t kv_row_bytes() const;

  /// Bytes of one layer's pools (K and V) for `pages` pages; the fp8 pools
  /// rounded up to 256 bytes.
  size_t kv_layer_bytes(int64_t pages) const;

  /// Sequences the runner holds at once: options.max_seqs, or 4 x
  /// max_batch; std::invalid_argument below max_batch.
  int32_t max_seqs(int32_t max_batch) const;

  /// The graphs' share: every decode size twice (a twin per staging slot),
  /// plus the three candidates "auto" holds at once while it times a size,
  /// and every mixed size twice; each graph as measured plus 2 MiB.
  static size_t graph_estimate(size_t one_decode, size_t decode_sizes, bool auto_path,
                               size_t one_mixed, size_t mixed_sizes);

  /// The share of a device of `device_total` bytes the runner may hold.
  size_t budget(size_t device_total) const;

  /// KV pages (the scratch page not counted): limits.kv_cache_tokens, or
  /// what the budget leaves beside `used` bytes and the graphs' estimate;
  /// std::runtime_error naming the budget when that is none.
  int32_t kv_pages(size_t device_total, size_t used, size_t graph_estimate) const;

  /// Page-table entries a sequence: max_model_len (or the model's
  /// max_position_embeddings), capped by the pool's `num_pages`, in pages.
  int32_t page_stride(int32_t num_pages) const;

  /// Adds an entry to the plan (constructor thread of the engine).
  void record(std::string name, int64_t bytes) {
    entries_.push_back({std::move(name), bytes});
  }

  /// The plan, in the order recorded.
  const std::vector<memory_plan_entry>& entries() const {
    return entries_;
  }

private:
  const model_config& config_;
  const cuda_runner_options& options_;
  bool kv_fp8_ = false;
  std::vector<memory_plan_entry> entries_;
};

} // namespace metronome::gpu
