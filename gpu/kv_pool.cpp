#include "gpu/kv_pool.hpp"

namespace metronome::gpu {

void kv_pool::allocate_probe(int32_t max_seqs, size_t layer_bytes) {
  num_pages_ = 1;
  page_stride_ = 1;
  layer_bytes_ = layer_bytes;
  pool_ = device_buffer(size_t(config_.num_layers) * layer_bytes_);
  page_table_ = device_buffer(size_t(max_seqs + 1) * 4);
}

void kv_pool::release() {
  pool_.reset();
  page_table_.reset();
}

void kv_pool::allocate(int32_t num_pages, int32_t page_stride, int32_t max_seqs,
                       size_t layer_bytes, cudaStream_t stream) {
  num_pages_ = num_pages;
  page_stride_ = page_stride;
  layer_bytes_ = layer_bytes;
  pool_ = device_buffer(size_t(config_.num_layers) * layer_bytes_);
  METRONOME_CUDA(cudaMemsetAsync(pool_.get(), 0, pool_.bytes(), stream));
  page_table_ = device_buffer(size_t(max_seqs + 1) * size_t(page_stride_) * 4);
  launch_fill_i32(page_table_.get<int32_t>(), int64_t(max_seqs + 1) * page_stride_, num_pages_,
                  stream);
}

kv_view kv_pool::view(int32_t layer_index) const {
  const auto& c = config_;
  kv_view kv;
  auto* base = pool_.get<unsigned char>() + size_t(layer_index) * layer_bytes_;
  if (fp8_) {
    // [K bytes][V bytes][K scales][V scales] of the pool's rows (its pages,
    // the padding page included, x page_size x kv heads).
    const size_t rows = size_t(num_pages_ + 1) * size_t(page_size_) * size_t(c.num_kv_heads);
    kv.k8 = base;
    kv.v8 = base + rows * size_t(c.head_dim);
    kv.k_scale = reinterpret_cast<float*>(base + 2 * rows * size_t(c.head_dim));
    kv.v_scale = kv.k_scale + rows;
    kv.e5m2 = e5m2_;
  } else {
    kv.k = reinterpret_cast<bf16*>(base);
    kv.v = reinterpret_cast<bf16*>(base + layer_bytes_ / 2);
  }
  kv.page_table = page_table_.get<int32_t>();
  kv.page_table_stride = page_stride_;
  kv.page_size = page_size_;
  kv.kv_heads = c.num_kv_heads;
  kv.head_dim = c.head_dim;
  return kv;
}

} // namespace metronome::gpu
