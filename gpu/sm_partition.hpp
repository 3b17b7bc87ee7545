#pragma once
// A share of the device's streaming multiprocessors and a stream whose
// kernels run only on them: a CUDA green context (driver API, sm_90: groups
// of 8 SMs). Two runners given complementary shares run their steps side by
// side without taking SMs from each other: a decode lane that keeps its
// inter-token gaps while a prompt lane computes prompts (docs/scheduling.md,
// "Spatial sharing").
//
// The driver's entry points are looked up through the runtime
// (cudaGetDriverEntryPointByVersion), so nothing links libcuda: a build
// without a GPU still loads.

#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

namespace metronome::gpu {

class sm_partition {
public:
  /// The first `count` SMs of `device` (rounded up to the device's
  /// granularity), or with `rest` the SMs left after them. Makes the green
  /// context current on the calling thread (the runner's), so that the
  /// runtime objects it creates next (events, cuBLAS, graphs) belong to it;
  /// the destructor gives the thread back the device's primary context.
  /// Throws std::invalid_argument for a
  /// count the device cannot split (0, more SMs than it has, none left for
  /// `rest`), std::runtime_error naming the driver call that failed.
  sm_partition(int device, int32_t count, bool rest);
  ~sm_partition();

  sm_partition(const sm_partition&) = delete;
  sm_partition& operator=(const sm_partition&) = delete;

  /// A non-blocking stream of the green context: what is launched on it
  /// (kernels, cuBLAS, graph replays) runs on sms() SMs.
  cudaStream_t stream() const {
    return stream_;
  }

  /// SMs of the share.
  int32_t sms() const {
    return sms_;
  }

  /// "first 64 of 132 SMs", "last 68 of 132 SMs".
  std::string describe() const;

private:
  void* green_ = nullptr;   // CUgreenCtx
  void* context_ = nullptr; // its CUcontext
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  int32_t sms_ = 0, device_sms_ = 0;
  bool rest_ = false;
};

/// SMs that one-wave kernels launched from this thread size their grids to:
/// the device's, or the share set by set_launch_sms (an engine running in an
/// sm_partition sets it on its thread at start).
int32_t launch_sms();

/// Sets launch_sms() for the calling thread; 0 = the device's SMs.
void set_launch_sms(int32_t sms);

} // namespace metronome::gpu
