#include "gpu/memory_planner.hpp"

#include <algorithm>
#include <climits>
#include <stdexcept>

namespace metronome::gpu {

memory_planner::memory_planner(const model_config& config, const cuda_runner_options& options)
  : config_(config), options_(options),
    kv_fp8_(options.kv_cache_dtype == kv_cache_dtype_kind::fp8
            || options.kv_cache_dtype == kv_cache_dtype_kind::fp8_e5m2) {
}

size_t memory_planner::kv_row_bytes() const {
  const size_t d = size_t(config_.head_dim);
  return kv_fp8_ ? d + 4 : d * 2;
}

size_t memory_planner::kv_layer_bytes(int64_t pages) const {
  const size_t rows =
    size_t(pages) * size_t(options_.limits.page_size) * size_t(config_.num_kv_heads);
  // The fp8 pools rounded up to 256 bytes, so that every layer's pools start
  // 16-byte aligned (the prefill copies 16 bytes at a time) whatever the row
  // count.
  return kv_fp8_ ? (2 * rows * kv_row_bytes() + 255) / 256 * 256 : 2 * rows * kv_row_bytes();
}

int32_t memory_planner::max_seqs(int32_t max_batch) const {
  const int32_t n = options_.max_seqs > 0 ? options_.max_seqs : 4 * max_batch;
  if (n < max_batch)
    throw std::invalid_argument("cuda runner: max_seqs: must be at least max_batch_size");
  return n;
}

size_t memory_planner::graph_estimate(size_t one_decode, size_t decode_sizes, bool auto_path,
                                      size_t one_mixed, size_t mixed_sizes) {
  // Every size twice (a twin per staging slot), plus the candidates "auto"
  // holds at once while it times one size (the best so far, the new one,
  // its unsplit variant). METRONOME_PDL=auto's extra graphs (with PDL, then
  // with late triggers) each live beside the best alone (two of those
  // three), and the twins are captured after all candidates are gone, so
  // they need no share of their own.
  const size_t count = 2 * decode_sizes + (auto_path ? 3 : 0);
  return (one_decode + (2ull << 20)) * count + (one_mixed + (2ull << 20)) * 2 * mixed_sizes;
}

size_t memory_planner::budget(size_t device_total) const {
  return size_t(double(device_total) * options_.gpu_memory_fraction);
}

int32_t memory_planner::kv_pages(size_t device_total, size_t used, size_t graph_estimate) const {
  const size_t ps = size_t(options_.limits.page_size);
  const size_t token_bytes =
    size_t(config_.num_layers) * 2 * size_t(config_.num_kv_heads) * kv_row_bytes();
  const size_t budget_b = budget(device_total);
  int64_t pages = 0;
  if (options_.limits.kv_cache_tokens > 0) {
    pages = (options_.limits.kv_cache_tokens + int64_t(ps) - 1) / int64_t(ps);
  } else {
    const int64_t left =
      int64_t(budget_b) - int64_t(used) - int64_t(graph_estimate) - int64_t(reserve_bytes);
    pages = left > 0 ? left / int64_t(ps * token_bytes) - 1 : 0;
  }
  if (pages < 1)
    throw std::runtime_error(
      "cuda runner: no memory left for the KV cache: budget " + std::to_string(budget_b >> 20)
      + " MiB (" + std::to_string(options_.gpu_memory_fraction) + " of "
      + std::to_string(device_total >> 20) + " MiB), already used " + std::to_string(used >> 20)
      + " MiB, graphs ~" + std::to_string(graph_estimate >> 20) + " MiB");
  return int32_t(std::min<int64_t>(pages, INT32_MAX - 1));
}

int32_t memory_planner::page_stride(int32_t num_pages) const {
  const int64_t ps = options_.limits.page_size;
  int64_t max_len = options_.limits.max_model_len > 0 ? options_.limits.max_model_len
                                                      : config_.max_position_embeddings;
  max_len = std::min<int64_t>(max_len, int64_t(num_pages) * ps);
  return int32_t((max_len + ps - 1) / ps);
}

} // namespace metronome::gpu
