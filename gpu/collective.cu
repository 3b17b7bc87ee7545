#include "gpu/collective.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <set>
#include <stdexcept>

#include <cuda/atomic>

#include "gpu/cuda_check.hpp"
#include "gpu/device_memory.hpp"
#include "gpu/launch.cuh"

namespace metronome::gpu {

collective_kind parse_collective_kind(const std::string& value, const std::string& field) {
  if (value == "auto")
    return collective_kind::automatic;
  if (value == "nccl")
    return collective_kind::nccl;
  if (value == "peer")
    return collective_kind::peer;
  throw std::invalid_argument(field + ": '" + value + "' is not one of auto, nccl, peer");
}

// -- peer: one kernel per collective over one address space ----------------------------------

namespace {

constexpr int peer_max_ranks = 8;
/// Blocks of one collective at most; each has its own flag and epoch.
constexpr int peer_max_blocks = 64;
/// The same where ranks share a device. A waiting block holds its SM slot
/// while the other rank still computes on the same SMs. With up to 128 of
/// them, the other rank's 2,048-token prefill stalled past the 30 s step
/// timeout (H100, 1B shape, two ranks under `serve`): its GEMMs want whole
/// SMs (cuBLAS's cluster kernels two in one GPC) and found few free of
/// waiting blocks. 16 blocks leave at least 116 SMs to the other rank.
constexpr int peer_shared_device_blocks = 16;
constexpr int peer_threads = 512;

/// What one rank's kernel reads: every rank's staging buffer and flags,
/// its own epochs.
struct peer_args {
  /// [rank] -> [2 parities][capacity] 4-byte values.
  void* stage[peer_max_ranks] = {};
  /// [rank] -> [peer_max_blocks]: the epoch each block of that rank last
  /// staged.
  uint32_t* flags[peer_max_ranks] = {};
  /// This rank's per-block epoch counters (only its own kernels touch them).
  uint32_t* epoch = nullptr;
  /// Blocks a collective launches at most (peer_max_blocks, or
  /// peer_shared_device_blocks where ranks share a device).
  int32_t max_blocks = peer_max_blocks;
  int32_t rank = 0, ranks = 1;
  size_t capacity = 0;
  unsigned long long timeout_ns = 0;
};

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ inline void add_to(float& a, float b) {
  a += b;
}

__device__ inline void add_to(float4& a, float4 b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
}

__device__ inline void add_to(int32_t& a, int32_t b) {
  a += b;
}

/// Block b takes slice b of `data` (`count` values of V: float4 where the
/// count allows, four floats a load): it stages its slice (every rank for a
/// sum, rank 0 for a broadcast) into its parity of this rank's staging
/// buffer, raises its flag to the new epoch, waits until block b of every
/// rank has done the same, then writes the slice's result from the staged
/// copies (the sum in rank order, or rank 0's values). The two parities let
/// a rank run one collective ahead of the slowest: it cannot get two
/// ahead, since the next barrier needs the slowest's flag, raised only once
/// that rank has read the previous epoch's data.
template <class T, bool sum>
__global__ void __launch_bounds__(peer_threads) peer_collective_kernel(peer_args a, T* data,
                                                                       size_t count) {
  // The staging buffers' parity stride in values of T.
  const size_t capacity = a.capacity * 4 / sizeof(T);
  // Under PDL: the predecessor (this rank's projection) writes `data`.
  pdl_wait();
  const int b = int(blockIdx.x);
  __shared__ uint32_t epoch_s;
  if (threadIdx.x == 0)
    epoch_s = ++a.epoch[b];
  __syncthreads();
  const uint32_t e = epoch_s;
  const size_t parity = e & 1u;
  const size_t per = (count + gridDim.x - 1) / gridDim.x;
  const size_t lo = size_t(b) * per, hi = min(count, lo + per);
  if (sum || a.rank == 0) {
    T* mine = static_cast<T*>(a.stage[a.rank]) + parity * capacity;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
      mine[i] = data[i];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    cuda::atomic_ref<uint32_t, cuda::thread_scope_system> flag(a.flags[a.rank][b]);
    flag.store(e, cuda::memory_order_release);
  }
  if (int(threadIdx.x) < a.ranks) {
    cuda::atomic_ref<uint32_t, cuda::thread_scope_system> flag(a.flags[threadIdx.x][b]);
    const unsigned long long start = global_ns();
    // Wrap-safe: epochs count up by one per collective on every rank.
    while (int32_t(flag.load(cuda::memory_order_acquire) - e) < 0) {
      if (global_ns() - start > a.timeout_ns) {
        printf("metronome: tensor-parallel rank %d waited more than %llu ms for rank %d at "
               "block %d (epoch %u)\n",
               a.rank, a.timeout_ns / 1000000ull, int(threadIdx.x), b, e);
        __trap();
      }
      __nanosleep(64);
    }
  }
  __syncthreads();
  // Late: a dependent scheduled while this grid waited would hold SM slots
  // the other ranks (on a shared device) may need to arrive.
  pdl_trigger();
  if (sum) {
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      T acc = static_cast<const T*>(a.stage[0])[parity * capacity + i];
      for (int p = 1; p < a.ranks; ++p)
        add_to(acc, static_cast<const T*>(a.stage[p])[parity * capacity + i]);
      data[i] = acc;
    }
  } else if (a.rank != 0) {
    const T* root = static_cast<const T*>(a.stage[0]) + parity * capacity;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
      data[i] = root[i];
  }
}

/// Buffers of one rank, on its device.
struct peer_rank_memory {
  int device = 0;
  device_buffer stage, flags, epoch;
};

/// Everything the group's endpoints share; freed with the last of them.
struct peer_group {
  std::vector<peer_rank_memory> ranks;
  size_t capacity = 0;
  int32_t max_blocks = peer_max_blocks;
  unsigned long long timeout_ns = 0;
};

class peer_collective final : public collective {
public:
  peer_collective(std::shared_ptr<peer_group> group, int32_t rank)
    : collective(rank, int32_t(group->ranks.size())), group_(std::move(group)) {
    args_.rank = rank;
    args_.ranks = int32_t(group_->ranks.size());
    args_.capacity = group_->capacity;
    args_.timeout_ns = group_->timeout_ns;
    args_.max_blocks = group_->max_blocks;
    for (size_t r = 0; r < group_->ranks.size(); ++r) {
      args_.stage[r] = group_->ranks[r].stage.get();
      args_.flags[r] = group_->ranks[r].flags.get<uint32_t>();
    }
    args_.epoch = group_->ranks[size_t(rank)].epoch.get<uint32_t>();
  }

  std::string describe() const override {
    return "peer";
  }

private:
  int blocks_for(size_t count) const {
    const size_t per_block = size_t(peer_threads) * 8;
    return int(std::clamp<size_t>((count + per_block - 1) / per_block, 1,
                                  size_t(args_.max_blocks)));
  }

  void check(size_t count) const {
    if (count > args_.capacity)
      throw std::logic_error("peer collective: " + std::to_string(count)
                             + " values exceed the staging capacity "
                             + std::to_string(args_.capacity));
  }

  void do_all_reduce_sum(float* data, size_t count, cudaStream_t stream) override {
    check(count);
    if (count % 4 == 0 && reinterpret_cast<uintptr_t>(data) % 16 == 0)
      launch_kernel("peer_all_reduce", peer_collective_kernel<float4, true>,
                    dim3(blocks_for(count / 4)), dim3(peer_threads), 0, stream, args_,
                    reinterpret_cast<float4*>(data), count / 4);
    else
      launch_kernel("peer_all_reduce", peer_collective_kernel<float, true>,
                    dim3(blocks_for(count)), dim3(peer_threads), 0, stream, args_, data, count);
  }

  void do_broadcast(int32_t* data, size_t count, cudaStream_t stream) override {
    check(count);
    launch_kernel("peer_broadcast", peer_collective_kernel<int32_t, false>,
                  dim3(blocks_for(count)), dim3(peer_threads), 0, stream, args_, data, count);
  }

  std::shared_ptr<peer_group> group_;
  peer_args args_;
};

/// Restores the calling thread's current device.
struct device_guard {
  int saved = 0;
  device_guard() {
    METRONOME_CUDA(cudaGetDevice(&saved));
  }
  ~device_guard() {
    cudaSetDevice(saved);
  }
};

std::vector<std::shared_ptr<collective>> make_peer_group(const std::vector<int>& devices,
                                                         size_t max_floats, double timeout_s) {
  if (devices.size() > size_t(peer_max_ranks))
    throw std::invalid_argument("peer collective: at most " + std::to_string(peer_max_ranks)
                                + " ranks");
  const device_guard restore;
  const std::set<int> distinct(devices.begin(), devices.end());
  for (int a : distinct)
    for (int b : distinct) {
      if (a == b)
        continue;
      int can = 0;
      METRONOME_CUDA(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can)
        throw std::runtime_error("peer collective: cuda:" + std::to_string(a)
                                 + " has no peer access to cuda:" + std::to_string(b)
                                 + " (use tensor_parallel_collective: nccl)");
      METRONOME_CUDA(cudaSetDevice(a));
      const cudaError_t st = cudaDeviceEnablePeerAccess(b, 0);
      if (st == cudaErrorPeerAccessAlreadyEnabled)
        cudaGetLastError();
      else
        METRONOME_CUDA(st);
    }
  auto group = std::make_shared<peer_group>();
  // Whole float4s: the staging parity stride of the vector kernel.
  group->capacity = (max_floats + 3) / 4 * 4;
  group->max_blocks =
    distinct.size() < devices.size() ? peer_shared_device_blocks : peer_max_blocks;
  group->timeout_ns = (unsigned long long)(std::max(timeout_s, 0.001) * 1e9);
  for (int d : devices) {
    METRONOME_CUDA(cudaSetDevice(d));
    peer_rank_memory& m = group->ranks.emplace_back();
    m.device = d;
    m.stage = device_buffer(2 * group->capacity * 4);
    m.flags = device_buffer(size_t(peer_max_blocks) * 4);
    m.epoch = device_buffer(size_t(peer_max_blocks) * 4);
    METRONOME_CUDA(cudaMemset(m.flags.get(), 0, m.flags.bytes()));
    METRONOME_CUDA(cudaMemset(m.epoch.get(), 0, m.epoch.bytes()));
  }
  for (int d : distinct) {
    METRONOME_CUDA(cudaSetDevice(d));
    METRONOME_CUDA(cudaDeviceSynchronize());
  }
  std::vector<std::shared_ptr<collective>> out;
  for (size_t r = 0; r < devices.size(); ++r)
    out.push_back(std::make_shared<peer_collective>(group, int32_t(r)));
  return out;
}

// -- nccl: loaded at run time ------------------------------------------------------------------

// The few declarations of nccl.h this file needs (an ABI NCCL keeps from
// 2.0 on), so that the build needs no NCCL headers.
using nccl_comm_t = struct nccl_comm_opaque*;
using nccl_result_t = int;
constexpr int nccl_int32 = 2, nccl_float32 = 7, nccl_sum = 0;

struct nccl_api {
  std::string problem; // why it cannot be used ("" when it can)
  std::string library;
  int version = 0;
  nccl_result_t (*get_version)(int*) = nullptr;
  const char* (*error_string)(nccl_result_t) = nullptr;
  nccl_result_t (*comm_init_all)(nccl_comm_t*, int, const int*) = nullptr;
  nccl_result_t (*comm_destroy)(nccl_comm_t) = nullptr;
  nccl_result_t (*all_reduce)(const void*, void*, size_t, int, int, nccl_comm_t,
                              cudaStream_t) = nullptr;
  nccl_result_t (*broadcast)(const void*, void*, size_t, int, int, nccl_comm_t,
                             cudaStream_t) = nullptr;
};

const nccl_api& nccl() {
  static const nccl_api api = [] {
    nccl_api a;
    const char* env = std::getenv("METRONOME_NCCL_LIBRARY");
    a.library = env && *env ? env : "libnccl.so.2";
    void* h = dlopen(a.library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* why = dlerror();
      a.problem = "cannot load " + a.library + " (" + (why ? why : "not found")
                  + "); set METRONOME_NCCL_LIBRARY to libnccl.so.2's path";
      return a;
    }
    auto sym = [&](const char* name, auto& fn) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn && a.problem.empty())
        a.problem = a.library + " has no " + name;
    };
    sym("ncclGetVersion", a.get_version);
    sym("ncclGetErrorString", a.error_string);
    sym("ncclCommInitAll", a.comm_init_all);
    sym("ncclCommDestroy", a.comm_destroy);
    sym("ncclAllReduce", a.all_reduce);
    sym("ncclBroadcast", a.broadcast);
    if (a.problem.empty())
      a.get_version(&a.version);
    return a;
  }();
  return api;
}

void nccl_check(nccl_result_t r, const char* call) {
  if (r != 0)
    throw std::runtime_error(std::string("nccl: ") + call + " failed: "
                             + (nccl().error_string ? nccl().error_string(r) : "?"));
}

/// The communicators of one group; destroyed with the last endpoint.
struct nccl_group {
  std::vector<nccl_comm_t> comms;
  ~nccl_group() {
    for (auto c : comms)
      if (c)
        nccl().comm_destroy(c);
  }
};

class nccl_collective final : public collective {
public:
  nccl_collective(std::shared_ptr<nccl_group> group, int32_t rank)
    : collective(rank, int32_t(group->comms.size())), group_(std::move(group)) {
  }

  std::string describe() const override {
    const int v = nccl().version;
    // 2.9 on: major * 10000 + minor * 100 + patch.
    return "nccl " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "."
           + std::to_string(v % 100);
  }

private:
  void do_all_reduce_sum(float* data, size_t count, cudaStream_t stream) override {
    nccl_check(nccl().all_reduce(data, data, count, nccl_float32, nccl_sum,
                                 group_->comms[size_t(rank())], stream),
               "ncclAllReduce");
  }

  void do_broadcast(int32_t* data, size_t count, cudaStream_t stream) override {
    nccl_check(nccl().broadcast(data, data, count, nccl_int32, 0, group_->comms[size_t(rank())],
                                stream),
               "ncclBroadcast");
  }

  std::shared_ptr<nccl_group> group_;
};

} // namespace

std::string nccl_problem() {
  return nccl().problem;
}

std::vector<std::shared_ptr<collective>> make_collective_group(const std::vector<int>& devices,
                                                               collective_kind kind,
                                                               size_t max_floats,
                                                               double timeout_s) {
  if (devices.empty())
    throw std::invalid_argument("collective group: no ranks");
  const std::set<int> distinct(devices.begin(), devices.end());
  if (kind == collective_kind::automatic)
    kind = distinct.size() == 1 ? collective_kind::peer : collective_kind::nccl;
  if (kind == collective_kind::peer)
    return make_peer_group(devices, max_floats, timeout_s);
  if (distinct.size() != devices.size())
    throw std::invalid_argument("nccl: a device holds more than one rank (NCCL refuses that; "
                                "use tensor_parallel_collective: peer)");
  if (const std::string p = nccl_problem(); !p.empty())
    throw std::runtime_error("nccl: " + p);
  const device_guard restore;
  auto group = std::make_shared<nccl_group>();
  group->comms.resize(devices.size());
  nccl_check(nccl().comm_init_all(group->comms.data(), int(devices.size()), devices.data()),
             "ncclCommInitAll");
  std::vector<std::shared_ptr<collective>> out;
  for (size_t r = 0; r < devices.size(); ++r)
    out.push_back(std::make_shared<nccl_collective>(group, int32_t(r)));
  return out;
}

} // namespace metronome::gpu
