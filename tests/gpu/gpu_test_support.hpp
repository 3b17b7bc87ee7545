#pragma once
// Helpers of the GPU tests: skipping without a device, device arrays that are
// poisoned when made, fresh random inputs, bf16 rounding and error norms.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/cuda_check.hpp"
#include "gpu/cuda_runner.hpp"
#include "gpu/device_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/dtype.hpp"

namespace metronome::test {

/// Skips the test when no CUDA device is present (CI without GPU).
#define METRONOME_REQUIRE_GPU()                                   \
  do {                                                            \
    if (::metronome::cuda_device_count() == 0)                    \
      GTEST_SKIP() << "no CUDA device: GPU test skipped";         \
  } while (false)

/// True when METRONOME_GPU_TEST_QUICK is set (smaller shapes, for the
/// sanitizer runs).
bool quick_mode();

/// A fresh random engine per call; its seed is printed by SCOPED_TRACE so a
/// failure can be replayed with METRONOME_GPU_TEST_SEED.
std::mt19937_64 fresh_rng(const std::string& what);

/// A device array of T, filled with 0xff bytes (NaN as float and bf16, -1 as
/// int32) when made, so unwritten outputs are visible.
template <class T>
class dev_array {
public:
  explicit dev_array(size_t n) : n_(n), buf_(n * sizeof(T)) {
    poison();
  }

  explicit dev_array(const std::vector<T>& host) : dev_array(host.size()) {
    upload(host);
  }

  void poison() {
    if (n_)
      METRONOME_CUDA(cudaMemset(buf_.get(), 0xff, n_ * sizeof(T)));
  }

  void upload(const std::vector<T>& host) {
    if (host.size() != n_)
      throw std::runtime_error("dev_array::upload: size mismatch");
    if (n_)
      METRONOME_CUDA(cudaMemcpy(buf_.get(), host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }

  std::vector<T> download() const {
    std::vector<T> host(n_);
    METRONOME_CUDA(cudaDeviceSynchronize());
    if (n_)
      METRONOME_CUDA(cudaMemcpy(host.data(), buf_.get(), n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

  T* get() const {
    return buf_.get<T>();
  }

  size_t size() const {
    return n_;
  }

private:
  size_t n_;
  gpu::device_buffer buf_;
};

/// Synchronises and throws on any pending device error.
void sync_check();

/// bf16 bits of x (round to nearest even) and back.
inline uint16_t to_bf16(float x) {
  return f32_to_bf16(x);
}
inline float from_bf16(uint16_t b) {
  return bf16_to_f32(b);
}
inline float round_bf16(float x) {
  return bf16_to_f32(f32_to_bf16(x));
}

/// Uniform random floats in [lo, hi).
std::vector<float> random_floats(std::mt19937_64& rng, size_t n, float lo, float hi);

/// The same as bf16 bits, and the floats they stand for.
std::vector<uint16_t> to_bf16(std::span<const float> x);
std::vector<float> from_bf16(std::span<const uint16_t> x);

/// A device array of bf16 from floats (rounded).
dev_array<gpu::bf16> upload_bf16(std::span<const float> x);
std::vector<float> download_bf16(const dev_array<gpu::bf16>& a);

/// ||a - b|| / ||b||; infinity if any element of a is NaN.
double relative_error(std::span<const float> a, std::span<const float> b);

/// Count of NaN elements.
size_t count_nan(std::span<const float> a);

/// Selects kernel generations (gpu::active_kernels()) for a scope and
/// restores the previous choice after it: tests run both generations.
class kernel_generation_scope {
public:
  explicit kernel_generation_scope(int generation) : saved_(gpu::active_kernels()) {
    auto& k = gpu::active_kernels();
    k.gemv = k.decode_attention = k.prefill_attention = generation;
  }
  ~kernel_generation_scope() {
    gpu::active_kernels() = saved_;
  }
  kernel_generation_scope(const kernel_generation_scope&) = delete;
  kernel_generation_scope& operator=(const kernel_generation_scope&) = delete;

private:
  gpu::kernel_generations saved_;
};

/// Runner options of the end-to-end GPU tests: room for 8 sequences and
/// 4,096 tokens of KV (the tiny presets), `page_size` tokens a page.
inline cuda_runner_options small_runner_options(int32_t page_size = 16) {
  cuda_runner_options o;
  o.limits.max_batch_size = 8;
  o.limits.max_num_batched_tokens = 256;
  o.limits.page_size = page_size;
  o.limits.kv_cache_tokens = 4096;
  o.gpu_memory_fraction = 0.9;
  return o;
}

} // namespace metronome::test
