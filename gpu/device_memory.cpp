#include "gpu/device_memory.hpp"

#include <chrono>
#include <string>
#include <thread>

namespace metronome::gpu {

void wait_event(cudaEvent_t event, double timeout_s, const char* what) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = start + std::chrono::duration_cast<clock::duration>(
                                  std::chrono::duration<double>(timeout_s));
  for (uint64_t spins = 0;; ++spins) {
    const cudaError_t st = cudaEventQuery(event);
    if (st == cudaSuccess)
      return;
    if (st != cudaErrorNotReady)
      throw_cuda_error(st, what, __FILE__, __LINE__);
    // Spin for the first ~100 us (a decode step's tail), then yield.
    if (spins > 2000) {
      if (clock::now() > deadline)
        throw cuda_error(std::string(what) + ": the device did not finish within "
                         + std::to_string(timeout_s) + " s");
      std::this_thread::yield();
    }
  }
}

} // namespace metronome::gpu
