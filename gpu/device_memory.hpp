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

/// Waits for `event` on the calling thread, so a hung device becomes a
/// cuda_error naming `what` after `timeout_s` instead of an endless wait.
/// Queries for about 20 us (a step's tail), then sleeps between queries
/// (20 us, doubling up to 200 us): it never keeps a core busy. For waits
/// that need no timeout and no answer on this thread, the CUDA runner's
/// step notifier sleeps in the driver instead (step_notifier.hpp).
void wait_event(cudaEvent_t event, double timeout_s, const char* what);

/// Two timing events on one stream: what lies between start() and stop()
/// on the device, in milliseconds. Calls on the stream's host thread.
class event_timer {
public:
  explicit event_timer(cudaStream_t stream = nullptr) : stream_(stream) {
    METRONOME_CUDA(cudaEventCreate(&start_));
    if (const cudaError_t st = cudaEventCreate(&stop_); st != cudaSuccess) {
      cudaEventDestroy(start_);
      throw_cuda_error(st, "cudaEventCreate", __FILE__, __LINE__);
    }
  }
  event_timer(const event_timer&) = delete;
  event_timer& operator=(const event_timer&) = delete;
  ~event_timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }

  void start() {
    METRONOME_CUDA(cudaEventRecord(start_, stream_));
  }

  void stop() {
    METRONOME_CUDA(cudaEventRecord(stop_, stream_));
  }

  /// Waits for stop() (bounded: wait_event) and returns the milliseconds
  /// since start().
  double ms(double timeout_s, const char* what) {
    wait_event(stop_, timeout_s, what);
    float ms = 0;
    METRONOME_CUDA(cudaEventElapsedTime(&ms, start_, stop_));
    return double(ms);
  }

private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

/// Milliseconds per call of `launch` on `stream`: `warm` calls unmeasured,
/// then `reps` calls timed together, the mean.
template <class F>
double mean_launch_ms(cudaStream_t stream, int warm, int reps, F&& launch,
                      double timeout_s = 60.0, const char* what = "timing") {
  for (int i = 0; i < warm; ++i)
    launch();
  event_timer t(stream);
  t.start();
  for (int i = 0; i < reps; ++i)
    launch();
  t.stop();
  return t.ms(timeout_s, what) / reps;
}

} // namespace metronome::gpu
