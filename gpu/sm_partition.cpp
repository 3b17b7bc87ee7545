#include "gpu/sm_partition.hpp"

#include <stdexcept>
#include <string>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "gpu/cuda_check.hpp"

namespace metronome::gpu {
namespace {

/// The driver's green-context calls, looked up once through the runtime.
struct green_api {
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetDevResource_v12040 get_resource = nullptr;
  PFN_cuDevSmResourceSplitByCount_v12040 split = nullptr;
  PFN_cuDevResourceGenerateDesc_v12040 describe = nullptr;
  PFN_cuGreenCtxCreate_v12040 create = nullptr;
  PFN_cuGreenCtxDestroy_v12040 destroy = nullptr;
  PFN_cuGreenCtxStreamCreate_v12050 stream_create = nullptr;
  PFN_cuCtxFromGreenCtx_v12040 as_context = nullptr;
  PFN_cuCtxGetCurrent_v4000 get_current = nullptr;
  PFN_cuCtxSetCurrent_v4000 set_current = nullptr;
};

template <class F>
void look_up(const char* name, int version, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status{};
  const cudaError_t e =
    cudaGetDriverEntryPointByVersion(name, &p, unsigned(version), cudaEnableDefault, &status);
  if (e != cudaSuccess || status != cudaDriverEntryPointSuccess || !p)
    throw std::runtime_error(std::string("sm_partition: the driver has no ") + name
                             + " (green contexts need a CUDA 12.5 or later driver)");
  fn = reinterpret_cast<F>(p);
}

const green_api& api() {
  static const green_api a = [] {
    green_api g;
    look_up("cuDeviceGet", 2000, g.device_get);
    look_up("cuDeviceGetDevResource", 12040, g.get_resource);
    look_up("cuDevSmResourceSplitByCount", 12040, g.split);
    look_up("cuDevResourceGenerateDesc", 12040, g.describe);
    look_up("cuGreenCtxCreate", 12040, g.create);
    look_up("cuGreenCtxDestroy", 12040, g.destroy);
    look_up("cuGreenCtxStreamCreate", 12050, g.stream_create);
    look_up("cuCtxFromGreenCtx", 12040, g.as_context);
    look_up("cuCtxGetCurrent", 4000, g.get_current);
    look_up("cuCtxSetCurrent", 4000, g.set_current);
    return g;
  }();
  return a;
}

void check(CUresult r, const char* call) {
  if (r != CUDA_SUCCESS)
    throw std::runtime_error(std::string("sm_partition: ") + call + " failed (CUresult "
                             + std::to_string(int(r)) + ")");
}

thread_local int32_t thread_launch_sms = 0;

} // namespace

sm_partition::sm_partition(int device, int32_t count, bool rest) : rest_(rest) {
  const green_api& g = api();
  METRONOME_CUDA(cudaSetDevice(device));
  METRONOME_CUDA(cudaFree(nullptr)); // the primary context exists before any green one
  CUdevice dev{};
  check(g.device_get(&dev, device), "cuDeviceGet");
  CUdevResource all{};
  check(g.get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource");
  device_sms_ = int32_t(all.sm.smCount);
  if (count <= 0 || count >= device_sms_)
    throw std::invalid_argument("sm_partition: " + std::to_string(count)
                                + " SMs: expected 1 to " + std::to_string(device_sms_ - 1)
                                + " (this device has " + std::to_string(device_sms_) + ")");
  CUdevResource group{}, remaining{};
  unsigned groups = 1;
  check(g.split(&group, &groups, &all, &remaining, 0, unsigned(count)),
        "cuDevSmResourceSplitByCount");
  CUdevResource& mine = rest ? remaining : group;
  if (groups != 1 || mine.sm.smCount == 0)
    throw std::invalid_argument("sm_partition: " + std::to_string(count) + " of "
                                + std::to_string(device_sms_)
                                + " SMs leave no share for the " + (rest ? "rest" : "first"));
  sms_ = int32_t(mine.sm.smCount);
  CUdevResourceDesc desc{};
  check(g.describe(&desc, &mine, 1), "cuDevResourceGenerateDesc");
  CUgreenCtx green{};
  check(g.create(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");
  green_ = green;
  // The runtime calls of this thread (events, cuBLAS handles, allocations,
  // graph captures, launches) go to the current context, and an event must
  // belong to the context of the stream it is recorded on: make the green
  // one current, as PyTorch's green contexts do.
  CUcontext ctx{};
  CUstream s{};
  CUresult r = g.as_context(&ctx, green);
  if (r == CUDA_SUCCESS)
    r = g.set_current(ctx);
  if (r == CUDA_SUCCESS)
    r = g.stream_create(&s, green, CU_STREAM_NON_BLOCKING, 0);
  if (r != CUDA_SUCCESS) {
    g.set_current(nullptr);
    g.destroy(green);
    green_ = nullptr;
    cudaSetDevice(device);
    check(r, "making the green context current (cuCtxFromGreenCtx, cuCtxSetCurrent, "
             "cuGreenCtxStreamCreate)");
  }
  context_ = ctx;
  stream_ = s;
  device_ = device;
}

sm_partition::~sm_partition() {
  const green_api& g = api();
  if (stream_)
    cudaStreamDestroy(stream_);
  // The thread goes back to the device's primary context if ours is current.
  CUcontext current{};
  if (g.get_current(&current) == CUDA_SUCCESS && current == static_cast<CUcontext>(context_)) {
    g.set_current(nullptr);
    cudaSetDevice(device_);
  }
  if (green_)
    g.destroy(static_cast<CUgreenCtx>(green_));
}

std::string sm_partition::describe() const {
  return std::string(rest_ ? "last " : "first ") + std::to_string(sms_) + " of "
         + std::to_string(device_sms_) + " SMs";
}

int32_t launch_sms() {
  if (thread_launch_sms > 0)
    return thread_launch_sms;
  static const int32_t device_sms = [] {
    int device = 0, n = 0;
    METRONOME_CUDA(cudaGetDevice(&device));
    METRONOME_CUDA(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n > 0 ? n : 1;
  }();
  return device_sms;
}

void set_launch_sms(int32_t sms) {
  thread_launch_sms = sms > 0 ? sms : 0;
}

} // namespace metronome::gpu
