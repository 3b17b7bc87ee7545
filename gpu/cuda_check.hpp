#pragma once
// CUDA and cuBLAS errors as exceptions that name the failing call and where
// it was made. Every CUDA call of the GPU executor goes through these checks;
// every kernel launch is followed by METRONOME_CUDA_LAUNCHED().

#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>

#include "model/device_error.hpp"

namespace metronome::gpu {

/// A failed CUDA runtime or library call. context_lost() for the errors
/// CUDA calls sticky (cuda_context_lost): the executor then has the
/// process exit rather than restart a runner on a dead context.
class cuda_error : public device_error {
public:
  using device_error::device_error;
};

/// True for the errors after which every later CUDA call of the process
/// fails the same way (an illegal address, a kernel fault or assert, an
/// uncorrectable ECC error, ...): the CUDA context is lost until the
/// process exits.
bool cuda_context_lost(cudaError_t err);

/// Throws cuda_error("<what> failed at <file>:<line>: <error name>: <description>"),
/// context_lost() as cuda_context_lost(err) says.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);

/// Throws for a cuBLAS status.
[[noreturn]] void throw_cublas_error(int status, const char* what, const char* file, int line);

} // namespace metronome::gpu

#define METRONOME_CUDA(call)                                                         \
  do {                                                                               \
    const cudaError_t metronome_err_ = (call);                                       \
    if (metronome_err_ != cudaSuccess)                                               \
      ::metronome::gpu::throw_cuda_error(metronome_err_, #call, __FILE__, __LINE__); \
  } while (false)

/// After a kernel launch: reports launch errors (bad configuration, too much
/// shared memory) at the launch site.
#define METRONOME_CUDA_LAUNCHED(name)                                                \
  do {                                                                               \
    const cudaError_t metronome_err_ = cudaGetLastError();                           \
    if (metronome_err_ != cudaSuccess)                                               \
      ::metronome::gpu::throw_cuda_error(metronome_err_, name, __FILE__, __LINE__);  \
  } while (false)

#define METRONOME_CUBLAS(call)                                                       \
  do {                                                                               \
    const int metronome_st_ = static_cast<int>(call);                                \
    if (metronome_st_ != 0)                                                          \
      ::metronome::gpu::throw_cublas_error(metronome_st_, #call, __FILE__, __LINE__); \
  } while (false)
