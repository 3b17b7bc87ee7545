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
//
// A projection can also be split along k into fp32 partial products, one
// batch of a strided-batched GEMM each (run_split), for a kernel of ours to
// reduce: the decode path folds that reduction into the residual add and the
// next RMSNorm, where cuBLAS's own split-K would launch a reduction kernel
// of its own.

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

  /// partials [splits][m][n] (fp32) = the products of x and W over the
  /// splits' equal slices of k: their sum is x W^T. k / splits must be a
  /// multiple of 8 (split_ok).
  void run_split(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, float* partials,
                 int32_t splits, cudaStream_t stream);

  /// Whether run_split can cut k into `splits` slices.
  static bool split_ok(int32_t k, int32_t splits) {
    return splits >= 1 && k % splits == 0 && (k / splits) % 8 == 0;
  }

  /// Times cuBLASLt's candidates for this shape on these buffers (which it
  /// overwrites) and remembers the fastest if it beats cublasGemmEx.
  /// Synchronous; not while capturing. Returns the chosen GEMM's time (ms).
  double tune(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, void* y, bool y_f32,
              float beta);

  /// The same for run_split with `splits` slices (GemmEx's strided-batched
  /// form as the fallback). Returns the chosen GEMM's time (ms).
  double tune_split(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, float* partials,
                    int32_t splits);

  /// Memory the tuner may overwrite (with zeros) before each timed launch, so
  /// that no candidate finds the weights in L2 as the one before left them:
  /// in a step every projection streams its weights from DRAM. Null: none.
  void set_flush(void* zeros, size_t bytes) {
    flush_ = zeros;
    flush_bytes_ = bytes;
  }

  /// Shapes tuned.
  int32_t tuned() const {
    return int32_t(algos_.size());
  }

  /// Whether run_split of this shape runs a cuBLASLt algorithm (tuned and
  /// chosen), rather than GemmEx's strided batch.
  bool split_uses_lt(int32_t m, int32_t n, int32_t k, int32_t splits) const;

  /// For tests: tuning keeps a cuBLASLt algorithm whenever cuBLASLt offers
  /// one that runs, even where GemmEx is faster, so that the cuBLASLt forms
  /// (the split slices' layouts among them) are checked on any device.
  void set_lt_only(bool on) {
    lt_only_ = on;
  }

private:
  /// m, n, k, fp32 output, beta != 0, splits (1: an ordinary GEMM).
  using key = std::tuple<int32_t, int32_t, int32_t, bool, bool, int32_t>;
  struct choice {
    bool lt = false;
    cublasLtMatmulAlgo_t algo{};
    double ms = 0.0;
  };

  void run_gemmex(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, void* y,
                  bool y_f32, float beta, int32_t splits, cudaStream_t stream);
  void run_lt(const cublasLtMatmulAlgo_t& algo, const bf16* x, int32_t m, const bf16* w,
              int32_t n, int32_t k, void* y, bool y_f32, float beta, int32_t splits,
              cudaStream_t stream);
  double tune_key(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, void* y,
                  bool y_f32, float beta, int32_t splits);

  cublasHandle_t blas_;
  cublasLtHandle_t lt_ = nullptr;
  cudaStream_t stream_;
  void* workspace_;
  size_t workspace_bytes_;
  std::map<key, choice> algos_;
  void* flush_ = nullptr;
  size_t flush_bytes_ = 0;
  bool lt_only_ = false;
};

} // namespace metronome::gpu
