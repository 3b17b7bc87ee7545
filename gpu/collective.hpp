#pragma once
// Collectives between the ranks of one tensor-parallel group (issue 38):
// the sum of the ranks' partial outputs after o_proj and down_proj, and the
// broadcast of rank 0's sampled ids.
//
// Design note. Each rank holds an endpoint of the group and enqueues on its
// own stream, from its own thread, the same collectives in the same order;
// an endpoint enqueues like any kernel, so the calls are captured into the
// decode graphs and replayed with them. Two implementations:
//
//  * nccl: NCCL's all-reduce and broadcast, one communicator per rank made
//    by ncclCommInitAll in this process. libnccl is loaded at run time
//    (dlopen: METRONOME_NCCL_LIBRARY, else libnccl.so.2 on the library
//    path), so nothing links it and a build without it serves one GPU.
//  * peer: one kernel per collective that reads the other ranks' buffers
//    directly (one address space: ranks on one device, or devices with peer
//    access) and meets them at per-block flags, as the custom all-reduces of
//    vLLM and TensorRT-LLM do for small messages. NCCL refuses two ranks on
//    one device, so this is what runs tensor parallelism on one GPU (tests);
//    on several it is the lower-latency choice where peer access exists.
//    Its waits are bounded: a rank that does not arrive within the time
//    limit traps the kernel (a device error, which ends the group) instead
//    of spinning for ever.
//
// Every rank must run every collective: one rank that skips one leaves the
// others waiting. At start-up each rank times and captures on its own, in
// no particular step with the others, so an endpoint starts idle (its calls
// enqueue nothing) and the engine makes it live once its start-up is done,
// then captures its graphs again with the collectives in them.
//
// The sums are fp32, in rank order: every rank gets bit-identical results,
// so the replicated residual stream stays identical on all ranks.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace metronome::gpu {

/// One rank's endpoint. Its members are called on that rank's thread, with
/// its device current.
class collective {
public:
  virtual ~collective() = default;

  int32_t rank() const {
    return rank_;
  }

  int32_t ranks() const {
    return ranks_;
  }

  /// "nccl 2.28.9" or "peer".
  virtual std::string describe() const = 0;

  /// Whether calls enqueue anything (false until the engine's start-up is
  /// done; see the design note).
  bool live() const {
    return live_;
  }

  void set_live(bool on) {
    live_ = on;
  }

  /// Sums `count` floats at `data` (this rank's device buffer) over the
  /// ranks, in place, on `stream`. The same `data` buffer on every call of
  /// this rank is not required, but `count` must match the other ranks'.
  void all_reduce_sum(float* data, size_t count, cudaStream_t stream) {
    if (live_ && ranks_ > 1 && count > 0)
      do_all_reduce_sum(data, count, stream);
  }

  /// Copies rank 0's `count` int32 values at `data` into every rank's
  /// `data`, on `stream`.
  void broadcast_from_first(int32_t* data, size_t count, cudaStream_t stream) {
    if (live_ && ranks_ > 1 && count > 0)
      do_broadcast(data, count, stream);
  }

protected:
  collective(int32_t rank, int32_t ranks) : rank_(rank), ranks_(ranks) {
  }

  virtual void do_all_reduce_sum(float* data, size_t count, cudaStream_t stream) = 0;
  virtual void do_broadcast(int32_t* data, size_t count, cudaStream_t stream) = 0;

private:
  int32_t rank_ = 0, ranks_ = 1;
  bool live_ = false;
};

/// Which implementation a group uses.
enum class collective_kind : uint8_t {
  /// peer where every rank is on one device, else nccl.
  automatic,
  nccl,
  peer,
};

/// Parses "auto", "nccl", "peer"; throws std::invalid_argument naming
/// `field` otherwise.
collective_kind parse_collective_kind(const std::string& value, const std::string& field);

/// Why NCCL cannot be used here ("" when it can): the library not found, or
/// a symbol missing. Loads it on the first call. Any thread.
std::string nccl_problem();

/// Makes the endpoints of a group over `devices` (rank r on devices[r]; a
/// device may repeat only with `peer`). nccl: ncclCommInitAll over the
/// devices. peer: enables peer access between distinct devices (refused by
/// name where a pair has none) and allocates each rank's flags and staging
/// buffers of `max_floats` floats on its device. Call on any one thread
/// before the ranks start; the endpoints then go to their ranks' threads.
/// Throws std::runtime_error (why), std::invalid_argument (a repeated device
/// with nccl).
std::vector<std::shared_ptr<collective>> make_collective_group(const std::vector<int>& devices,
                                                               collective_kind kind,
                                                               size_t max_floats,
                                                               double timeout_s);

} // namespace metronome::gpu
