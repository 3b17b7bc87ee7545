#include "gpu/cuda_check.hpp"

#include <string>

namespace metronome::gpu {

namespace {

std::string where(const char* what, const char* file, int line) {
  std::string f = file;
  if (auto i = f.rfind("/gpu/"); i != std::string::npos)
    f = f.substr(i + 1);
  return std::string(what) + " failed at " + f + ":" + std::to_string(line);
}

const char* cublas_status_name(int status) {
  switch (status) {
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

} // namespace

bool cuda_context_lost(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorUnknown:
      return true;
    default:
      return false;
  }
}

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw cuda_error(where(what, file, line) + ": " + cudaGetErrorName(err) + ": "
                     + cudaGetErrorString(err),
                   cuda_context_lost(err));
}

void throw_cublas_error(int status, const char* what, const char* file, int line) {
  throw cuda_error(where(what, file, line) + ": " + cublas_status_name(status) + " ("
                   + std::to_string(status) + ")");
}

} // namespace metronome::gpu
