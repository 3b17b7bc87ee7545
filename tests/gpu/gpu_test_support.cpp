#include "tests/gpu/gpu_test_support.hpp"

#include <cstring>

#include "bench/gpu/environment_switches.hpp"

namespace metronome::test {

namespace {
// The benchmark switches (METRONOME_KERNELS, METRONOME_PDL), applied before
// any test runs: bench/gpu/run_h200.sh runs the GPU tests under them too.
[[maybe_unused]] const int32_t applied_switches = bench::apply_environment_switches();
} // namespace

bool quick_mode() {
  const char* v = std::getenv("METRONOME_GPU_TEST_QUICK");
  return v && *v && std::strcmp(v, "0") != 0;
}

std::mt19937_64 fresh_rng(const std::string& what) {
  uint64_t seed = 0;
  if (const char* v = std::getenv("METRONOME_GPU_TEST_SEED"); v && *v)
    seed = std::strtoull(v, nullptr, 10);
  else
    seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  ::testing::Test::RecordProperty("seed_" + what, std::to_string(seed));
  std::printf("[ seed     ] %s: METRONOME_GPU_TEST_SEED=%llu\n", what.c_str(),
              static_cast<unsigned long long>(seed));
  return std::mt19937_64(seed);
}

void sync_check() {
  METRONOME_CUDA(cudaDeviceSynchronize());
  METRONOME_CUDA(cudaGetLastError());
}

std::vector<float> random_floats(std::mt19937_64& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> out(n);
  for (auto& x : out)
    x = d(rng);
  return out;
}

std::vector<uint16_t> to_bf16(std::span<const float> x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = f32_to_bf16(x[i]);
  return out;
}

std::vector<float> from_bf16(std::span<const uint16_t> x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = bf16_to_f32(x[i]);
  return out;
}

dev_array<gpu::bf16> upload_bf16(std::span<const float> x) {
  auto bits = to_bf16(x);
  dev_array<gpu::bf16> a(x.size());
  if (!bits.empty())
    METRONOME_CUDA(cudaMemcpy(a.get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  return a;
}

std::vector<float> download_bf16(const dev_array<gpu::bf16>& a) {
  std::vector<uint16_t> bits(a.size());
  METRONOME_CUDA(cudaDeviceSynchronize());
  if (!bits.empty())
    METRONOME_CUDA(cudaMemcpy(bits.data(), a.get(), bits.size() * 2, cudaMemcpyDeviceToHost));
  return from_bf16(bits);
}

double relative_error(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size())
    return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]))
      return INFINITY;
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

size_t count_nan(std::span<const float> a) {
  size_t n = 0;
  for (float x : a)
    n += std::isnan(x);
  return n;
}

} // namespace metronome::test
