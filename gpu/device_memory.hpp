#pragma once
// Owning handles of device and pinned host memory, streams, events and graphs:
// each frees its resource once, never throws from its destructor.

#include <cstddef>
#include <cstdint>
#include <utility>

#include <cuda_runtime_api.h>

#include "gpu/cuda_check.hpp"

namespace metronome::gpu {

/// A cudaMalloc'd block.
class device_buffer {
public:
  device_buffer() = default;

  explicit device_buffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0)
      METRONOME_CUDA(cudaMalloc(&ptr_, bytes));
  }

  device_buffer(device_buffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {
  }

  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }

  ~device_buffer() {
    reset();
  }

  void reset() noexcept {
    if (ptr_)
      cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

  template <class T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

  size_t bytes() const {
    return bytes_;
  }

private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// A cudaHostAlloc'd (pinned) block.
class pinned_buffer {
public:
  pinned_buffer() = default;

  explicit pinned_buffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0)
      METRONOME_CUDA(cudaHostAlloc(&ptr_, bytes, cudaHostAllocDefault));
  }

  pinned_buffer(pinned_buffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {
  }

  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    if (this != &o) {
      if (ptr_)
        cudaFreeHost(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }

  ~pinned_buffer() {
    if (ptr_)
      cudaFreeHost(ptr_);
  }

  template <class T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

  size_t bytes() const {
    return bytes_;
  }

private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// An instantiated CUDA graph.
class graph_exec {
public:
  graph_exec() = default;
  explicit graph_exec(cudaGraphExec_t e) : exec_(e) {
  }
  graph_exec(graph_exec&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)) {
  }
  graph_exec& operator=(graph_exec&& o) noexcept {
    if (this != &o) {
      if (exec_)
        cudaGraphExecDestroy(exec_);
      exec_ = std::exchange(o.exec_, nullptr);
    }
    return *this;
  }
  ~graph_exec() {
    if (exec_)
      cudaGraphExecDestroy(exec_);
  }

  cudaGraphExec_t get() const {
    return exec_;
  }

  explicit operator bool() const {
    return exec_ != nullptr;
  }

private:
  cudaGraphExec_t exec_ = nullptr;
};

/// Waits for `event` by polling, so a hung device becomes an exception after
/// `timeout_s` instead of an endless wait. Spins briefly, then yields.
void wait_event(cudaEvent_t event, double timeout_s, const char* what);

} // namespace metronome::gpu
