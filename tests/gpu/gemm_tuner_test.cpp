// The GEMM tuner's projections against a host product: the ordinary GEMM, and
// the split-K partials of run_split (strided batches over slices of k) before
// tuning, after it, and through cuBLASLt's algorithms wherever it has one.

#include <cstdio>

#include <cublas_v2.h>

#include "gpu/cuda_check.hpp"
#include "gpu/gemm_tuner.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace metronome {
namespace {

using gpu::bf16;
using test::dev_array;

struct blas_handle {
  cublasHandle_t h = nullptr;
  blas_handle() {
    METRONOME_CUBLAS(cublasCreate(&h));
  }
  ~blas_handle() {
    cublasDestroy(h);
  }
};

TEST(gpu_gemm_tuner, split_partials_sum_to_the_product) {
  METRONOME_REQUIRE_GPU();
  auto rng = test::fresh_rng("gemm_tuner_split");
  blas_handle blas;
  dev_array<unsigned char> ws(size_t(32) << 20);
  METRONOME_CUBLAS(cublasSetWorkspace(blas.h, ws.get(), 32u << 20));
  gpu::gemm_tuner tuner(blas.h, nullptr, ws.get(), size_t(32) << 20);
  // A second tuner that keeps cuBLASLt's algorithms even where GemmEx wins:
  // run_split through cuBLASLt's strided layouts is checked on any device.
  gpu::gemm_tuner lt_tuner(blas.h, nullptr, ws.get(), size_t(32) << 20);
  lt_tuner.set_lt_only(true);
  int32_t lt_splits = 0;
  struct shape {
    int32_t m, n, k;
  };
  for (const shape s : {shape{1, 96, 512}, shape{7, 200, 1024}, shape{64, 128, 2048}}) {
    auto x = test::random_floats(rng, size_t(s.m) * s.k, -1, 1);
    auto w = test::random_floats(rng, size_t(s.n) * s.k, -1, 1);
    auto xb = test::to_bf16(x), wb = test::to_bf16(w);
    auto d_x = test::upload_bf16(x);
    auto d_w = test::upload_bf16(w);
    // The host product of the bf16 inputs, in double.
    std::vector<double> want(size_t(s.m) * s.n);
    for (int32_t i = 0; i < s.m; ++i)
      for (int32_t j = 0; j < s.n; ++j) {
        double acc = 0;
        for (int32_t kk = 0; kk < s.k; ++kk)
          acc += double(bf16_to_f32(xb[size_t(i) * s.k + kk]))
                 * double(bf16_to_f32(wb[size_t(j) * s.k + kk]));
        want[size_t(i) * s.n + j] = acc;
      }
    auto close = [&](const std::vector<float>& got, const std::string& what) {
      ASSERT_EQ(got.size(), want.size());
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::abs(double(got[i]) - want[i]));
      EXPECT_LT(worst, 1e-3 * std::sqrt(double(s.k))) << what;
    };
    dev_array<float> y(size_t(s.m) * s.n);
    tuner.run(d_x.get(), s.m, d_w.get(), s.n, s.k, y.get(), true, 0.0f, nullptr);
    close(y.download(), "plain");
    for (int32_t splits : {1, 2, 4, 8}) {
      ASSERT_TRUE(gpu::gemm_tuner::split_ok(s.k, splits));
      for (int tuned : {0, 1, 2}) { // untuned, tuned, tuned to cuBLASLt only
        auto& t = tuned == 2 ? lt_tuner : tuner;
        const std::string what = "m " + std::to_string(s.m) + " splits " + std::to_string(splits)
                                 + (tuned == 1 ? " tuned" : tuned == 2 ? " tuned, cuBLASLt" : "");
        dev_array<float> parts(size_t(splits) * s.m * s.n);
        if (tuned > 0) {
          EXPECT_GT(t.tune_split(d_x.get(), s.m, d_w.get(), s.n, s.k, parts.get(), splits), 0.0);
        }
        if (tuned == 2 && splits > 1 && t.split_uses_lt(s.m, s.n, s.k, splits))
          ++lt_splits;
        parts.poison();
        t.run_split(d_x.get(), s.m, d_w.get(), s.n, s.k, parts.get(), splits, nullptr);
        test::sync_check();
        const auto p = parts.download();
        std::vector<float> sum(want.size(), 0.0f);
        for (int32_t sp = 0; sp < splits; ++sp)
          for (size_t i = 0; i < sum.size(); ++i)
            sum[i] += p[size_t(sp) * sum.size() + i];
        close(sum, what);
        // Each partial is the product over its own slice of k.
        const int32_t ks = s.k / splits;
        double worst = 0;
        for (int32_t i = 0; i < s.m; ++i)
          for (int32_t j = 0; j < s.n; ++j) {
            double acc = 0;
            for (int32_t kk = (splits - 1) * ks; kk < s.k; ++kk)
              acc += double(bf16_to_f32(xb[size_t(i) * s.k + kk]))
                     * double(bf16_to_f32(wb[size_t(j) * s.k + kk]));
            const float got = p[(size_t(splits - 1) * s.m + i) * s.n + j];
            worst = std::max(worst, std::abs(double(got) - acc));
          }
        EXPECT_LT(worst, 1e-3 * std::sqrt(double(ks))) << what << " (last slice)";
      }
    }
  }
  // cuBLASLt ran split shapes (of the nine split configurations above).
  std::printf("[ metric   ] split configurations run through cuBLASLt: %d of 9\n", lt_splits);
  EXPECT_GT(lt_splits, 0);
  EXPECT_FALSE(gpu::gemm_tuner::split_ok(512, 3));
  EXPECT_FALSE(gpu::gemm_tuner::split_ok(100, 2));
  dev_array<float> scratch(96);
  dev_array<bf16> tiny(300);
  EXPECT_THROW(tuner.run_split(tiny.get(), 1, tiny.get(), 1, 300, scratch.get(), 7, nullptr),
               gpu::cuda_error);
}

} // namespace
} // namespace metronome
