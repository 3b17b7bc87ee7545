#include "gpu/gemm_tuner.hpp"

#include <algorithm>
#include <vector>

#include "gpu/cuda_check.hpp"
#include "gpu/device_memory.hpp"

namespace metronome::gpu {

namespace {

/// The descriptors of one shape (column-major view: D [n x m] = W^T-op...).
struct lt_shape {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;

  lt_shape(int32_t m, int32_t n, int32_t k, bool y_f32) {
    METRONOME_CUBLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    METRONOME_CUBLAS(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    METRONOME_CUBLAS(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    // W stored [n][k] row-major = k x n column-major; op(A) = A^T is n x k.
    METRONOME_CUBLAS(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, n, k));
    METRONOME_CUBLAS(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, m, k));
    METRONOME_CUBLAS(cublasLtMatrixLayoutCreate(&c, y_f32 ? CUDA_R_32F : CUDA_R_16BF, n, m, n));
  }

  ~lt_shape() {
    if (c)
      cublasLtMatrixLayoutDestroy(c);
    if (b)
      cublasLtMatrixLayoutDestroy(b);
    if (a)
      cublasLtMatrixLayoutDestroy(a);
    if (op)
      cublasLtMatmulDescDestroy(op);
  }
};

} // namespace

gemm_tuner::gemm_tuner(cublasHandle_t blas, cudaStream_t stream, void* workspace,
                       size_t workspace_bytes)
  : blas_(blas), stream_(stream), workspace_(workspace), workspace_bytes_(workspace_bytes) {
  METRONOME_CUBLAS(cublasLtCreate(&lt_));
}

gemm_tuner::~gemm_tuner() {
  if (lt_)
    cublasLtDestroy(lt_);
}

void gemm_tuner::run_gemmex(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k,
                            void* y, bool y_f32, float beta, cudaStream_t) {
  const float alpha = 1.0f;
  METRONOME_CUBLAS(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF,
                                k, x, CUDA_R_16BF, k, &beta, y, y_f32 ? CUDA_R_32F : CUDA_R_16BF,
                                n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void gemm_tuner::run_lt(const cublasLtMatmulAlgo_t& algo, const bf16* x, int32_t m,
                        const bf16* w, int32_t n, int32_t k, void* y, bool y_f32, float beta,
                        cudaStream_t stream) {
  lt_shape s(m, n, k, y_f32);
  const float alpha = 1.0f;
  METRONOME_CUBLAS(cublasLtMatmul(lt_, s.op, &alpha, w, s.a, x, s.b, &beta, y, s.c, y, s.c,
                                  &algo, workspace_, workspace_bytes_, stream));
}

void gemm_tuner::run(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, void* y,
                     bool y_f32, float beta, cudaStream_t stream) {
  auto it = algos_.find(key{m, n, k, y_f32, beta != 0.0f});
  if (it != algos_.end() && it->second.lt)
    run_lt(it->second.algo, x, m, w, n, k, y, y_f32, beta, stream);
  else
    run_gemmex(x, m, w, n, k, y, y_f32, beta, stream);
}

double gemm_tuner::tune(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, void* y,
                        bool y_f32, float beta) {
  const key kk{m, n, k, y_f32, beta != 0.0f};
  if (algos_.contains(kk))
    return 1.0;
  cudaEvent_t e0, e1;
  METRONOME_CUDA(cudaEventCreate(&e0));
  METRONOME_CUDA(cudaEventCreate(&e1));
  auto time = [&](auto&& launch) {
    for (int i = 0; i < 2; ++i)
      launch();
    constexpr int reps = 5;
    METRONOME_CUDA(cudaEventRecord(e0, stream_));
    for (int i = 0; i < reps; ++i)
      launch();
    METRONOME_CUDA(cudaEventRecord(e1, stream_));
    wait_event(e1, 60.0, "gemm tuning");
    float ms = 0;
    METRONOME_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    return double(ms) / reps;
  };
  choice best;
  double best_ms = 0, base_ms = 0;
  try {
    best_ms = base_ms = time([&] { run_gemmex(x, m, w, n, k, y, y_f32, beta, stream_); });
    lt_shape s(m, n, k, y_f32);
    cublasLtMatmulPreference_t pref = nullptr;
    METRONOME_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    METRONOME_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_, sizeof workspace_bytes_));
    std::vector<cublasLtMatmulHeuristicResult_t> results(16);
    int found = 0;
    const auto st = cublasLtMatmulAlgoGetHeuristic(lt_, s.op, s.a, s.b, s.c, s.c, pref,
                                                   int(results.size()), results.data(), &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS)
      for (int i = 0; i < found; ++i) {
        if (results[size_t(i)].state != CUBLAS_STATUS_SUCCESS)
          continue;
        const auto& algo = results[size_t(i)].algo;
        const double ms = time([&] { run_lt(algo, x, m, w, n, k, y, y_f32, beta, stream_); });
        if (ms < best_ms) {
          best_ms = ms;
          best = choice{true, algo};
        }
      }
  } catch (...) {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    throw;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  algos_[kk] = best;
  return best_ms > 0 ? base_ms / best_ms : 1.0;
}

} // namespace metronome::gpu
