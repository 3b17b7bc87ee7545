#include "gpu/device_memory.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

namespace metronome::gpu {

void wait_event(cudaEvent_t event, double timeout_s, const char* what) {
  using clock = std::chrono::steady_clock;
  using std::chrono::microseconds;
  // Queries back to back for this long (the tail of a decode step ends
  // within it), then naps between queries, each nap longer up to the
  // longest: the thread sleeps instead of spinning on a long step, and
  // notices its end at most a nap (plus the kernel's timer slack) late.
  constexpr auto spin = microseconds(20);
  constexpr auto first_nap = microseconds(20), longest_nap = microseconds(200);
  const auto start = clock::now();
  const auto deadline = start + std::chrono::duration_cast<clock::duration>(
                                  std::chrono::duration<double>(timeout_s));
  auto nap = first_nap;
  for (;;) {
    const cudaError_t st = cudaEventQuery(event);
    if (st == cudaSuccess)
      return;
    if (st != cudaErrorNotReady)
      throw_cuda_error(st, what, __FILE__, __LINE__);
    const auto now = clock::now();
    if (now - start < spin)
      continue;
    if (now > deadline)
      // A kernel that never ends holds the device until the process exits.
      throw cuda_error(std::string(what) + ": the device did not finish within "
                         + std::to_string(timeout_s) + " s",
                       true);
    std::this_thread::sleep_for(std::min<clock::duration>(nap, deadline - now));
    nap = std::min(nap * 2, longest_nap);
  }
}

} // namespace metronome::gpu
