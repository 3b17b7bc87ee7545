#pragma once
// The paged KV pool on the device: every layer's K and V pages and the page
// tables that index them, one row per sequence slot.
//
// Design note. One allocation holds all layers, each layer's share K then V
// ([pages + 1][kv_heads][page_size] rows of head_dim bf16; with the fp8
// cache, rows of head_dim e4m3 bytes followed by the K and V row scales).
// The extra page is the scratch page padding rows write into, and the extra
// page-table row (max_seqs) the scratch slot that maps only to it: every
// entry starts at num_pages, so padding never touches a sequence's keys. The
// memory planner sizes the pool; the page tables change only through the
// page updates each step carries (launch_page_updates).

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "gpu/device_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/model_config.hpp"

namespace metronome::gpu {

class kv_pool {
public:
  /// For `config`'s layers and kv heads, pages of `page_size` tokens; fp8:
  /// the fp8 form (kv_view::k8), with e5m2 bytes and window scales where
  /// e5m2 is set, e4m3 bytes and row scales otherwise. Allocates nothing.
  kv_pool(const model_config& config, int32_t page_size, bool fp8, bool e5m2 = false)
    : config_(config), page_size_(page_size), fp8_(fp8), e5m2_(fp8 && e5m2) {
  }

  /// Whether the pools are the fp8_e5m2 cache (kv_view::e5m2).
  bool e5m2() const {
    return e5m2_;
  }

  /// A one-page pool and one-entry page tables for `max_seqs` + 1 slots,
  /// uninitialised: what a probe capture needs to measure a graph's memory
  /// (`layer_bytes` for two pages). The engine's constructor thread.
  void allocate_probe(int32_t max_seqs, size_t layer_bytes);

  /// Frees the pool and its page tables (after a probe).
  void release();

  /// The serving pool of `num_pages` pages (plus the scratch page),
  /// `layer_bytes` a layer, zeroed, and page tables of `page_stride`
  /// entries for `max_seqs` + 1 slots, every entry the scratch page;
  /// enqueued on `stream` (the caller waits). The engine's constructor thread.
  void allocate(int32_t num_pages, int32_t page_stride, int32_t max_seqs, size_t layer_bytes,
                cudaStream_t stream);

  /// Layer `layer_index`'s pools with the page tables.
  kv_view view(int32_t layer_index) const;

  int32_t num_pages() const {
    return num_pages_;
  }

  int32_t page_stride() const {
    return page_stride_;
  }

  int32_t* page_table() const {
    return page_table_.get<int32_t>();
  }

  const device_buffer& pool() const {
    return pool_;
  }

  const device_buffer& page_tables() const {
    return page_table_;
  }

private:
  const model_config& config_;
  int32_t page_size_ = 0;
  bool fp8_ = false, e5m2_ = false;
  int32_t num_pages_ = 0, page_stride_ = 0;
  device_buffer pool_, page_table_;
  // One layer's share of pool_.
  size_t layer_bytes_ = 0;
};

} // namespace metronome::gpu
