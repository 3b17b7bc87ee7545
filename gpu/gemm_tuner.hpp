#pragma once
// Dense projections through cuBLASLt with an algorithm chosen by timing, per
// shape, at start-up.
//
// Design note. For the skinny GEMMs of decode (8 to a few hundred tokens
// against a 4096 x 14336 weight) cuBLAS's default heuristic often picks a
// tiling that leaves most SMs idle, which costs half the bandwidth. The tuner
// asks cuBLASLt for its candidate algorithms (split-K variants included) for
// each shape the captured graphs use, times each on the real weights, and
// keeps the fastest; shapes it has not tuned (prefill of arbitrary length)
// use cublasGemmEx's own choice. Tuning never happens during stream capture.

#include <cstdint>
#include <map>
#include <tuple>

#include <cublasLt.h>
#include <cublas_v2.h>

#include "gpu/kernels.hpp"

namespace metronome::gpu {

class gemm_tuner {
public:
  /// `workspace` (bytes) is shared with `blas` (same stream, never concurrent).
  gemm_tuner(cublasHandle_t blas, cudaStream_t stream, void* workspace, size_t workspace_bytes);
  ~gemm_tuner();

  gemm_tuner(const gemm_tuner&) = delete;
  gemm_tuner& operator=(const gemm_tuner&) = delete;

  /// Row-major y [m][n] = x [m][k] W^T (+ beta y) with W [n][k]; y fp32 or bf16.
  void run(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, void* y, bool y_f32,
           float beta, cudaStream_t stream);

  /// Times cuBLASLt's candidates for this shape on these buffers (which it
  /// overwrites) and remembers the fastest if it beats cublasGemmEx.
  /// Synchronous; not while capturing. Returns the speed-up over GemmEx.
  double tune(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, void* y, bool y_f32,
              float beta);

  /// Shapes tuned and how many use a cuBLASLt algorithm.
  int32_t tuned() const {
    return int32_t(algos_.size());
  }

private:
  using key = std::tuple<int32_t, int32_t, int32_t, bool, bool>;
  struct choice {
    bool lt = false;
    cublasLtMatmulAlgo_t algo{};
  };

  void run_gemmex(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, void* y,
                  bool y_f32, float beta, cudaStream_t stream);
  void run_lt(const cublasLtMatmulAlgo_t& algo, const bf16* x, int32_t m, const bf16* w,
              int32_t n, int32_t k, void* y, bool y_f32, float beta, cudaStream_t stream);

  cublasHandle_t blas_;
  cublasLtHandle_t lt_ = nullptr;
  cudaStream_t stream_;
  void* workspace_;
  size_t workspace_bytes_;
  std::map<key, choice> algos_;
};

} // namespace metronome::gpu
