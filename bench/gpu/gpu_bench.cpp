// gpu_bench: the CUDA runner on one model folder against the device's own
// floors, measured in the same run.
//
// Floors: the device-to-device copy bandwidth (bytes read + written per
// second of a 2 GiB cudaMemcpy) bounds memory-bound steps: a decode step must
// read every weight once plus each sequence's KV. The cuBLAS bf16 GEMM rate
// (8192^3, random data) bounds prefill: FLOPs of the projections plus causal
// attention. Decode figures are steps as the executor runs them: each
// submitted behind the one in flight, timed from the previous step's end to
// its own (host work for the next step overlaps this one); `_sync` rows run
// one execute() at a time (host work, copies and the wait on the step's
// path), as the rounds before the ninth measured. Prefill figures are wall
// time of execute(). Medians of repeated steps after warm-up.
//
// Output: rows {"engine", "model", "metric", "value", "unit", "floor"} (--out)
// and the step-time grid {"kind", "num_seqs", "kv_tokens", "prefill_tokens",
// "ms"} for the scheduler's cost model (--grid).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <cublas_v2.h>
#include <cuda_profiler_api.h>
#include <nlohmann/json.hpp>

#include "bench/gpu/bench_driver.hpp"
#include "bench/gpu/environment_switches.hpp"
#include "bench/gpu/overlap_bench.hpp"
#include "bench/gpu/kernel_bench.hpp"
#include "config/config_scalar.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/cuda_runner.hpp"
#include "gpu/device_memory.hpp"
#include "gpu/kernels.hpp"
#include "model/make_model.hpp"
#include "model/model_weights.hpp"
#include "model/rtn_quantize.hpp"

namespace metronome {
namespace {

/// METRONOME_PROFILE_BATCH (bench/gpu/environment_switches.hpp), read at start.
int32_t profile_batch = 0;

using nlohmann::json;
using bench::bench_driver;
using bench::median;

// -- floors ------------------------------------------------------------------------------

/// Bytes read + written per second by a device-to-device copy of 2 GiB.
double copy_bandwidth() {
  const size_t bytes = 2ull << 30;
  gpu::device_buffer a(bytes), b(bytes);
  METRONOME_CUDA(cudaMemset(a.get(), 0x5a, bytes));
  METRONOME_CUDA(cudaMemset(b.get(), 0x33, bytes));
  gpu::event_timer timer;
  std::vector<double> rates;
  for (int i = 0; i < 13; ++i) {
    timer.start();
    METRONOME_CUDA(cudaMemcpyAsync(i % 2 ? a.get() : b.get(), i % 2 ? b.get() : a.get(), bytes,
                                   cudaMemcpyDeviceToDevice));
    timer.stop();
    const double ms = timer.ms(60, "copy bandwidth");
    if (i >= 3)
      rates.push_back(2.0 * double(bytes) / (ms * 1e-3));
  }
  return median(rates);
}

/// FLOP/s of a bf16 8192^3 cuBLAS GEMM (fp32 accumulate) on random data.
double gemm_rate() {
  const int n = 8192;
  const size_t elems = size_t(n) * n;
  std::vector<float> host(elems);
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (auto& x : host) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = float(int64_t(s >> 40) - (1 << 23)) / float(1 << 23);
  }
  gpu::device_buffer f32(elems * 4), a(elems * 2), b(elems * 2), c(elems * 2);
  METRONOME_CUDA(cudaMemcpy(f32.get(), host.data(), elems * 4, cudaMemcpyHostToDevice));
  gpu::launch_to_bf16(f32.get(), false, int64_t(elems), a.get<gpu::bf16>(), nullptr);
  std::reverse(host.begin(), host.end());
  METRONOME_CUDA(cudaMemcpy(f32.get(), host.data(), elems * 4, cudaMemcpyHostToDevice));
  gpu::launch_to_bf16(f32.get(), false, int64_t(elems), b.get<gpu::bf16>(), nullptr);
  cublasHandle_t h;
  METRONOME_CUBLAS(cublasCreate(&h));
  const float alpha = 1, beta = 0;
  auto run = [&] {
    METRONOME_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a.get(),
                                  CUDA_R_16BF, n, b.get(), CUDA_R_16BF, n, &beta, c.get(),
                                  CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  const double ms = gpu::mean_launch_ms(nullptr, 3, 10, run, 60, "gemm rate");
  cublasDestroy(h);
  return 2.0 * n * double(n) * n / (ms * 1e-3);
}

// -- model arithmetic ----------------------------------------------------------------------

struct model_costs {
  double weight_bytes = 0; // read once per step
  double kv_bytes_per_token = 0;
  double layer_params = 0;
  double lm_head_params = 0;
  double attn_flops_per_pair = 0; // per (query, key) pair, all layers
};

model_costs costs_of(const model_config& c) {
  model_costs m;
  const double h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), f = c.intermediate_size;
  m.layer_params = c.num_layers * (h * (q + 2 * kv) + q * h + 3 * h * f + 2 * h);
  m.lm_head_params = double(c.vocab_size) * h;
  m.weight_bytes = 2 * (m.layer_params + m.lm_head_params + h);
  if (c.quantization) {
    // 4-bit projections (gpu/int4_layout.hpp): half a byte a weight and a
    // 4-byte scale-zero word per row and group; norms and the LM head bf16.
    const double gs_h = c.quantization->group_size < 0 ? h : c.quantization->group_size;
    const double gs_q = c.quantization->group_size < 0 ? q : c.quantization->group_size;
    const double gs_f = c.quantization->group_size < 0 ? f : c.quantization->group_size;
    const double per_layer = (q + 2 * kv) * h * (0.5 + 4 / gs_h) + h * q * (0.5 + 4 / gs_q)
                             + 2 * f * h * (0.5 + 4 / gs_h) + h * f * (0.5 + 4 / gs_f) + 4 * h;
    m.weight_bytes = c.num_layers * per_layer + 2 * (m.lm_head_params + h);
  }
  m.kv_bytes_per_token = double(c.num_layers) * 2 * kv * 2;
  m.attn_flops_per_pair = double(c.num_layers) * 4 * q;
  return m;
}

double prefill_flops(const model_costs& m, double n, double ctx) {
  // Causal pairs of n new tokens after ctx cached ones.
  const double pairs = n * ctx + n * (n + 1) / 2;
  return 2 * n * m.layer_params + pairs * m.attn_flops_per_pair + 2 * m.lm_head_params;
}

// -- main ----------------------------------------------------------------------------------

struct options {
  std::string model, name, out, grid;
  std::string make_preset; // with --make-out: write that preset's folder and exit
  std::string make_quantize; // with --make-preset: awq or gptq writes int4 projections (group 128)
  std::string quantize = "none"; // model.quantize: int4 quantizes a float model at load
  bool quick = false;
  bool kernels = false;     // per-kernel timings first
  bool decode_only = false; // only the decode figures (batch 1, 8, 32, 64)
  bool headline = false;    // only the target figures (prefill 2048, decode bs1, bs64)
  bool kernels_only = false; // the per-kernel timings and nothing else (for profilers)
  bool decode_spread = false; // decode steps of equal and uneven contexts, pages in order or not
  int32_t max_batch = 128;
  int32_t page_size = 16;    // engine_limits::page_size (server: engine.page_size)
  std::string path = "auto"; // cuda_runner_options::small_batch_path
  std::string kv_dtype = "bf16"; // cuda_runner_options::kv_cache_dtype, as its name
  int32_t logprobs = -1;          // every sequence asks for logprobs with this many alternatives
  std::string profile_mixed;      // B:N[,B:N...]: mixed steps timed, the first profiled, then exit
  std::string profile_prefix;     // P:N[,P:N...]: N new tokens after P cached ones, then exit
  std::string overlap;            // decode SMs a split, "0,64,88": --overlap, then exit
  std::string overlap_chunks = "512,2048";
  int32_t overlap_batch = 64, overlap_context = 1024;
  std::string tp_devices;            // "0,1": tensor parallel, rank r on cuda:N_r
  std::string tp_collective = "auto"; // cuda_runner_options::tensor_parallel_collective
};

/// One B:N spec of --profile-mixed; `profile`: its step inside the profiler range.
int profile_mixed_one(bench_driver& d, model_runner& runner, const std::string& spec,
                      bool profile) {
  const auto colon = spec.find(':');
  const auto b = parse_integer(spec.substr(0, colon));
  const auto n = colon == std::string::npos ? std::nullopt : parse_integer(spec.substr(colon + 1));
  if (!b || !n || *b < 1 || *n < 0) {
    std::fprintf(stderr, "gpu_bench: --profile-mixed: expected B:N, not '%s'\n", spec.c_str());
    return 2;
  }
  const auto all = d.prefill(int32_t(*b), 1024);
  const int32_t chunk = int32_t(*n);
  auto extra = d.add(1, std::max(1, 16 * chunk));
  auto chunks = [&](bool with_prompt) {
    std::vector<std::pair<uint64_t, int32_t>> c;
    for (auto id : all)
      c.push_back({id, 1});
    if (with_prompt && chunk > 0)
      c.push_back({extra[0], chunk});
    return c;
  };
  std::vector<double> captured, eager, mixed, mixed_eager;
  for (int rep = 0; rep < 3; ++rep) {
    captured.push_back(d.step(chunks(false)));
    set_cuda_graphs(runner, false);
    eager.push_back(d.step(chunks(false)));
    set_cuda_graphs(runner, true);
    if (chunk > 0) {
      mixed.push_back(d.step(chunks(true)));
      set_mixed_graphs(runner, false);
      mixed_eager.push_back(d.step(chunks(true)));
      set_mixed_graphs(runner, true);
    }
  }
  std::printf("profile-mixed %s: decode captured %.3f ms, uncaptured %.3f ms; mixed captured "
              "%.3f ms, uncaptured %.3f ms\n",
              spec.c_str(), median(captured), median(eager), median(mixed), median(mixed_eager));
  std::fflush(stdout);
  if (!profile) {
    d.release(all);
    d.release(extra);
    return 0;
  }
  // The profiled step: with graphs as configured (ncu times each kernel of
  // a replayed graph too).
  if (std::getenv("METRONOME_PROFILE_EAGER"))
    set_cuda_graphs(runner, false);
  METRONOME_CUDA(cudaDeviceSynchronize());
  METRONOME_CUDA(cudaProfilerStart());
  d.step(chunks(true));
  METRONOME_CUDA(cudaDeviceSynchronize());
  METRONOME_CUDA(cudaProfilerStop());
  set_cuda_graphs(runner, true);
  d.release(all);
  d.release(extra);
  return 0;
}

/// The non-empty items of a comma-separated list of specs, in order.
std::vector<std::string> spec_list(const std::string& specs) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= specs.size();) {
    size_t end = specs.find(',', at);
    if (end == std::string::npos)
      end = specs.size();
    if (end > at)
      out.push_back(specs.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

/// `--profile-mixed B:N`: B decodes at 1,024 keys beside one prompt chunk of
/// N tokens (N = 0: the B decodes alone, uncaptured), the step's wall time
/// with and without graphs, and one such step inside a profiler range for
/// `ncu --profile-from-start off` (kernel by kernel, to set beside a decode
/// step's). Several specs, separated by commas, are timed one after another
/// on the same engine (one start-up); only the first is profiled. Returns
/// the exit code.
int profile_mixed(bench_driver& d, model_runner& runner, const std::string& specs) {
  bool first = true;
  for (const std::string& spec : spec_list(specs)) {
    if (const int rc = profile_mixed_one(d, runner, spec, first); rc != 0)
      return rc;
    first = false;
  }
  return 0;
}

/// `--profile-prefix P:N[,P:N...]`: the step that computes N new prompt
/// tokens of one sequence whose first P tokens are already in the cache (a
/// prefix-cache hit's first step), against the step of a fresh N-token
/// prompt, with graphs and without; medians of 5, each on a new sequence.
/// The gap is what the cached keys cost a short suffix (issue 34's bar).
int profile_prefix(bench_driver& d, model_runner& runner, const std::string& specs) {
  for (const std::string& spec : spec_list(specs)) {
    const auto colon = spec.find(':');
    const auto p = parse_integer(spec.substr(0, colon));
    const auto n =
      colon == std::string::npos ? std::nullopt : parse_integer(spec.substr(colon + 1));
    if (!p || !n || *p < 0 || *n < 1) {
      std::fprintf(stderr, "gpu_bench: --profile-prefix: expected P:N, not '%s'\n", spec.c_str());
      return 2;
    }
    const int32_t cached = int32_t(*p), fresh = int32_t(*n);
    std::vector<double> after[2], alone[2];
    for (int rep = 0; rep < 5; ++rep)
      for (int graphs = 1; graphs >= 0; --graphs) {
        set_cuda_graphs(runner, graphs == 1);
        auto hit = d.add(1, cached + fresh);
        d.compute(hit, cached);
        after[graphs].push_back(d.step({{hit[0], fresh}}));
        d.release(hit);
        auto lone = d.add(1, fresh);
        alone[graphs].push_back(d.step({{lone[0], fresh}}));
        d.release(lone);
      }
    set_cuda_graphs(runner, true);
    std::printf("profile-prefix %s: after %d cached captured %.3f ms, uncaptured %.3f ms; "
                "alone captured %.3f ms, uncaptured %.3f ms; ratio captured %.3f\n",
                spec.c_str(), cached, median(after[1]), median(after[0]), median(alone[1]),
                median(alone[0]), median(after[1]) / median(alone[1]));
    std::fflush(stdout);
  }
  return 0;
}

/// `--decode-spread`: decode steps of B sequences with the same KV tokens
/// in all, their contexts equal or uneven (most short, a few long), their
/// pages taken in order or scattered over the whole pool: what separates
/// a live step from the grid's (equal contexts, fresh pages). Medians of
/// overlapped steps. Returns the exit code.
int decode_spread(bench_driver& d) {
  struct shape {
    const char* name;
    std::vector<int32_t> lens;
  };
  auto equal = [](int32_t b, int32_t len) { return std::vector<int32_t>(size_t(b), len); };
  auto uneven = [](int32_t b, int32_t total, int32_t longs, int32_t short_len) {
    std::vector<int32_t> v(size_t(b - longs), short_len);
    const int32_t long_len = (total - short_len * (b - longs)) / longs;
    v.insert(v.end(), size_t(longs), long_len);
    return v;
  };
  const std::vector<shape> shapes = {
    {"64 x 1024", equal(64, 1024)},
    {"64: 48 x 128 + 16 x 3712", uneven(64, 65536, 16, 128)},
    {"64: 60 x 512 + 4 x 8704", uneven(64, 65536, 4, 512)},
    {"32 x 2048", equal(32, 2048)},
    {"32: 28 x 256 + 4 x 14592", uneven(32, 65536, 4, 256)},
    {"96 x 512", equal(96, 512)},
    {"96: 80 x 128 + 16 x 2432", uneven(96, 49152, 16, 128)},
  };
  for (bool scattered : {false, true}) {
    if (scattered)
      d.scatter_free_pages(7);
    else
      d.order_free_pages();
    for (const auto& sh : shapes) {
      std::vector<uint64_t> ids;
      for (auto len : sh.lens) {
        auto one = d.add(1, len);
        ids.push_back(one[0]);
      }
      d.compute(ids);
      const double ms = d.decode(ids, 5, 30);
      int64_t kv = 0;
      for (auto len : sh.lens)
        kv += len;
      std::printf("decode-spread %-28s kv %6lld  pages %-10s %.3f ms\n", sh.name,
                  static_cast<long long>(kv), scattered ? "scattered" : "in order", ms);
      std::fflush(stdout);
      d.release(ids);
      if (scattered)
        d.scatter_free_pages(11);
      else
        d.order_free_pages();
    }
  }
  return 0;
}

int run(const options& o) {
  std::printf("== %s (%s)\n", o.name.c_str(), o.model.c_str());
  const double bw = copy_bandwidth();
  const double flops = gemm_rate();
  std::printf("floors: copy %.0f GB/s (read + write), cuBLAS bf16 %.0f TFLOP/s\n", bw / 1e9,
              flops / 1e12);
  const auto gens = gpu::active_kernels();
  std::printf("kernels: gemv v%d, decode attention v%d, prefill attention v%d\n", gens.gemv,
              gens.decode_attention, gens.prefill_attention);

  auto model = model_folder::open(o.model, {parse_weight_quantization(o.quantize).value()});
  const auto& cfg = model->config;
  std::printf("weights: %s\n", model->weights_description().c_str());
  model_costs mc = costs_of(cfg);
  // The floors count the cache's own bytes: with fp8 and fp8_e5m2, head_dim
  // bytes and a 4-byte scale a row.
  if (o.kv_dtype == "fp8" || o.kv_dtype == "fp8_e5m2")
    mc.kv_bytes_per_token = double(cfg.num_layers) * 2 * cfg.num_kv_heads * (cfg.head_dim + 4);
  std::printf("kv cache: %s\n", o.kv_dtype.c_str());
  json rows = json::array(), grid = json::array();
  if (!o.overlap.empty()) {
    bench::overlap_options oo;
    oo.decode_sms = bench::parse_int_list(o.overlap);
    oo.chunks = bench::parse_int_list(o.overlap_chunks);
    oo.decode_batch = o.overlap_batch;
    oo.context = o.overlap_context;
    bench::overlap_bench(model, oo, rows);
    if (!o.out.empty())
      std::ofstream(o.out) << rows.dump(1) << "\n";
    return 0;
  }
  if (o.kernels || o.kernels_only)
    bench::kernel_bench(cfg, o.name, bw, flops, rows);
  if (o.kernels_only) {
    if (!o.out.empty())
      std::ofstream(o.out) << rows.dump(1) << "\n";
    return 0;
  }
  cuda_runner_options ro;
  ro.limits.max_batch_size = o.max_batch;
  ro.limits.max_num_batched_tokens = 2048;
  ro.gpu_memory_fraction = 0.85;
  ro.small_batch_path = o.path;
  ro.limits.page_size = o.page_size;
  ro.kv_cache_dtype = parse_kv_cache_dtype(o.kv_dtype).value(); // checked with the arguments
  ro.profile_batch = profile_batch;
  if (!o.tp_devices.empty()) {
    ro.tensor_parallel_devices = bench::parse_int_list(o.tp_devices);
    ro.tensor_parallel = int32_t(ro.tensor_parallel_devices.size());
    ro.tensor_parallel_collective = o.tp_collective;
  }
  const auto t_load = std::chrono::steady_clock::now();
  auto runner = make_cuda_runner(model, ro);
  const double load_s =
    std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  std::printf("runner up in %.1f s; %s\n%s", load_s, describe_cuda_runner(*runner).c_str(),
              format_memory_plan(runner->memory_plan()).c_str());

  auto row = [&](const std::string& metric, double value, const std::string& unit,
                 double floor) {
    rows.push_back({{"engine", "metronome"},
                    {"model", o.name},
                    {"metric", metric},
                    {"value", value},
                    {"unit", unit},
                    {"floor", std::isfinite(floor) ? json(floor) : json(nullptr)}});
    std::printf("  %-36s %10.3f %-8s floor %10.3f\n", metric.c_str(), value, unit.c_str(),
                floor);
    std::fflush(stdout);
  };
  row("copy_bandwidth", bw / 1e9, "GB/s", NAN);
  row("gemm_bf16_tflops", flops / 1e12, "TFLOP/s", NAN);
  row("load_s", load_s, "s", NAN);
  auto decode_floor = [&](double kv_tokens) {
    return (mc.weight_bytes + kv_tokens * mc.kv_bytes_per_token) / bw * 1e3;
  };
  bench_driver d(*runner, ro.limits.max_num_batched_tokens, ro.limits.max_batch_size,
                 o.logprobs);
  if (!o.profile_mixed.empty())
    return profile_mixed(d, *runner, o.profile_mixed);
  if (!o.profile_prefix.empty())
    return profile_prefix(d, *runner, o.profile_prefix);
  if (o.decode_spread)
    return decode_spread(d);

  // Prefill: one prompt per step, median of 5.
  for (int32_t n : {128, 2048}) {
    if (o.decode_only || (o.headline && n != 2048))
      continue;
    std::vector<double> ms;
    for (int rep = 0; rep < 6; ++rep) {
      auto ids = d.prefill(1, n);
      d.release(ids);
    }
    for (int rep = 0; rep < 5; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      auto ids = d.prefill(1, n);
      ms.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                   * 1e3);
      d.release(ids);
    }
    // Floor: the FLOPs at the GEMM rate, or reading the weights once, whichever is longer.
    row("prefill_ms_" + std::to_string(n), median(ms), "ms",
        std::max(prefill_flops(mc, n, 0) / flops, mc.weight_bytes / bw) * 1e3);
  }

  // Batch-1 decode at two contexts, graphs on and off.
  double bs1_ctx1024 = NAN;
  for (int32_t ctx : {128, 1024, 4096}) {
    auto ids = d.prefill(1, ctx);
    // Overlapped as the executor runs them, and (_sync) one step at a time:
    // the host's work and the wait on the step's path.
    double ms = NAN, sync = NAN;
    if (o.headline)
      ms = d.decode(ids, 10, o.quick ? 30 : 100);
    else
      std::tie(ms, sync) = d.decode_both(ids, 10, o.quick ? 15 : 50, 2);
    // The device's share: the last step's graph replayed back to back on its
    // own inputs, no host work between.
    const double replay = cuda_graph_replay_ms(*runner, 1, true);
    // Uncaptured: one at a time (the launches on the step's path), and
    // overlapped (a step's launches while the step before it runs).
    double eager = NAN, eager_overlapped = NAN;
    if (!o.headline) {
      set_cuda_graphs(*runner, false);
      std::tie(eager_overlapped, eager) = d.decode_both(ids, 3, o.quick ? 6 : 15, 2);
      set_cuda_graphs(*runner, true);
    }
    const double fl = decode_floor(ctx + 60);
    if (ctx == 1024) {
      bs1_ctx1024 = ms;
      row("decode_step_ms_bs1_ctx1024", ms, "ms", fl);
      if (std::isfinite(replay))
        row("decode_graph_replay_ms_bs1_ctx1024", replay, "ms", fl);
      if (!o.headline)
        row("decode_step_ms_bs1_ctx1024_sync", sync, "ms", fl);
    } else {
      row("decode_bs1_ms_ctx" + std::to_string(ctx), ms, "ms", fl);
      if (std::isfinite(replay))
        row("decode_bs1_graph_replay_ms_ctx" + std::to_string(ctx), replay, "ms", fl);
      row("decode_bs1_floor_fraction_ctx" + std::to_string(ctx), fl / ms, "fraction", 1.0);
      if (!o.headline) {
        row("decode_bs1_ms_ctx" + std::to_string(ctx) + "_sync", sync, "ms", fl);
        row("decode_bs1_ms_ctx" + std::to_string(ctx) + "_uncaptured", eager, "ms", fl);
        row("decode_bs1_ms_ctx" + std::to_string(ctx) + "_uncaptured_overlapped",
            eager_overlapped, "ms", fl);
      }
    }
    d.release(ids);
  }

  // Decode steps of larger batches at context 1024. Their floors count each
  // sequence's KV at about the mean context of the steps measured (a --quick
  // run): 1045 for the overlapped and one-at-a-time steps (1024 prefilled,
  // then 10 warm-up steps and two rounds of both kinds), 1048 for the graph
  // replay of the last of them, 1075 for the uncaptured steps after those.
  // A full run measures more steps: its mean context is about 10 tokens
  // later, which moves the batch-64 floor by under 0.5%. The ratio's floor
  // divides by a batch-1 floor at 1030 tokens (at batch 1 the KV is about 1%
  // of the bytes, so its exact context hardly matters).
  std::vector<int32_t> batches = {8, 32, 64, 128};
  if (o.headline)
    batches = {64};
  else if (o.decode_only)
    batches = {8, 32, 64};
  for (int32_t b : batches) {
    if (b > o.max_batch)
      continue;
    auto ids = d.prefill(b, 1024);
    double ms = NAN, sync = NAN;
    if (o.headline)
      ms = d.decode(ids, 10, o.quick ? 10 : 20);
    else
      std::tie(ms, sync) = d.decode_both(ids, 10, o.quick ? 6 : 10, 2);
    const double replay = cuda_graph_replay_ms(*runner, b, true);
    row("decode_step_ms_bs" + std::to_string(b) + "_ctx1024", ms, "ms",
        decode_floor(double(b) * 1045));
    if (std::isfinite(replay))
      row("decode_graph_replay_ms_bs" + std::to_string(b) + "_ctx1024", replay, "ms",
          decode_floor(double(b) * 1048));
    if (b == 64) {
      if (!o.headline) {
        row("decode_step_ms_bs64_ctx1024_sync", sync, "ms", decode_floor(64.0 * 1045));
        set_cuda_graphs(*runner, false);
        const auto [eo, es] = d.decode_both(ids, 3, o.quick ? 4 : 8, 2);
        row("decode_step_ms_bs64_ctx1024_uncaptured", es, "ms", decode_floor(64.0 * 1075));
        row("decode_step_ms_bs64_ctx1024_uncaptured_overlapped", eo, "ms",
            decode_floor(64.0 * 1075));
        set_cuda_graphs(*runner, true);
      }
      row("decode_bs64_over_bs1_ctx1024", ms / bs1_ctx1024, "x",
          decode_floor(64.0 * 1045) / decode_floor(1030));
    }
    d.release(ids);
  }

  // The step-time grid for the scheduler's cost model.
  if (!o.grid.empty() && !o.decode_only && !o.headline) {
    std::vector<int32_t> prefill_sizes = {16, 32, 64, 128, 256, 512, 1024, 2048};
    for (int32_t n : prefill_sizes) {
      std::vector<double> ms;
      for (int rep = 0; rep < 3; ++rep) {
        auto ids = d.prefill(1, n);
        d.release(ids);
      }
      for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        auto ids = d.prefill(1, n);
        ms.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e3);
        d.release(ids);
      }
      grid.push_back({{"kind", "prefill"}, {"num_seqs", 1}, {"kv_tokens", n},
                      {"prefill_tokens", n}, {"ms", median(ms)}});
    }
    // Chunks continuing a cached prompt (chunked prefill), up to the 8k
    // prompts of long-prompt workloads.
    for (int32_t cached : {1024, 4096, 7168})
      for (int32_t n : {64, 256, 1024, 2048}) {
        std::vector<double> ms;
        for (int rep = 0; rep < 3; ++rep) {
          auto ids = d.add(1, cached + n);
          d.compute(ids, cached);
          ms.push_back(d.step({{ids[0], n}}));
          d.release(ids);
        }
        grid.push_back({{"kind", "prefill"}, {"num_seqs", 1}, {"kv_tokens", cached + n},
                        {"prefill_tokens", n}, {"ms", median(ms)}});
      }
    // Mixed steps: decodes at context 1024 next to one prompt chunk, from
    // the small chunks of stall-free steps to a whole budget's.
    for (int32_t b : {8, 32, 64, 96}) {
      if (b > o.max_batch - 1)
        continue;
      auto all = d.prefill(b, 1024);
      for (int32_t n : {16, 32, 64, 128, 256, 512, 1024}) {
        auto extra = d.add(1, 3 * n);
        std::vector<double> ms;
        double kv = 0;
        for (int rep = 0; rep < 3; ++rep) {
          std::vector<std::pair<uint64_t, int32_t>> chunks;
          kv = 0;
          for (auto id : all) {
            chunks.push_back({id, 1});
            kv += d.context(id) + 1;
          }
          kv += d.context(extra[0]) + n;
          chunks.push_back({extra[0], n});
          ms.push_back(d.step(chunks));
        }
        grid.push_back({{"kind", "mixed"}, {"num_seqs", b + 1}, {"kv_tokens", int64_t(kv)},
                        {"prefill_tokens", n}, {"ms", median(ms)}});
        d.release(extra);
      }
      d.release(all);
    }
    std::vector<int32_t> contexts = o.quick ? std::vector<int32_t>{128, 1024, 4096}
                                            : std::vector<int32_t>{128, 512, 1024, 2048, 4096};
    std::vector<int32_t> sizes = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128};
    for (int32_t ctx : contexts) {
      auto all = d.prefill(o.max_batch, ctx);
      for (int32_t b : sizes) {
        if (b > o.max_batch)
          continue;
        std::vector<uint64_t> ids(all.begin(), all.begin() + b);
        const double ms = d.decode(ids, 2, 6);
        double kv = 0;
        for (auto id : ids)
          kv += d.context(id);
        grid.push_back({{"kind", "decode"}, {"num_seqs", b}, {"kv_tokens", int64_t(kv)},
                        {"prefill_tokens", 0}, {"ms", ms}});
      }
      d.release(all);
    }
    std::ofstream(o.grid) << grid.dump(1) << "\n";
    std::printf("grid: %zu rows -> %s\n", grid.size(), o.grid.c_str());
  }

  if (!o.out.empty())
    std::ofstream(o.out) << rows.dump(1) << "\n";
  return 0;
}

constexpr const char* usage =
  "usage: gpu_bench --model DIR --name NAME [--out rows.json] [--grid grid.json]"
  " [--quick] [--kernels] [--kernels-only] [--decode-only] [--headline]"
  " [--max-batch N] [--page-size N] [--path auto|gemv|skinny|cublas]\n"
  "       [--kv-cache-dtype bf16|fp8|fp8_e5m2] [--logprobs N (0-20)] [--profile-mixed B:N]\n"
  "       [--profile-prefix P:N] [--decode-spread] [--quantize none|int4]\n"
  "       [--overlap SMS[,SMS...] [--overlap-chunks N[,N...]] [--overlap-batch N]\n"
  "        [--overlap-context N]] [--tp-devices N,N[,...] [--tp-collective auto|nccl|peer]]\n"
  "       gpu_bench --make-preset NAME --make-out DIR [--make-quantize awq|gptq]";

/// The command line into `o`; empty, or what to print before exiting with 2
/// (the usage, or the malformed option named).
std::string parse_args(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    const std::string v = has_value ? argv[i + 1] : "";
    std::string* text = a == "--model" || a == "--make-out" ? &o.model
                        : a == "--name"                     ? &o.name
                        : a == "--out"                      ? &o.out
                        : a == "--grid"                     ? &o.grid
                        : a == "--make-preset"              ? &o.make_preset
                        : a == "--path"                     ? &o.path
                        : a == "--kv-cache-dtype"           ? &o.kv_dtype
                        : a == "--quantize"                 ? &o.quantize
                        : a == "--make-quantize"            ? &o.make_quantize
                        : a == "--profile-mixed"            ? &o.profile_mixed
                        : a == "--profile-prefix"           ? &o.profile_prefix
                        : a == "--overlap"                  ? &o.overlap
                        : a == "--overlap-chunks"           ? &o.overlap_chunks
                        : a == "--tp-devices"               ? &o.tp_devices
                        : a == "--tp-collective"            ? &o.tp_collective
                                                            : nullptr;
    int32_t* number = a == "--max-batch"   ? &o.max_batch
                      : a == "--page-size" ? &o.page_size
                      : a == "--logprobs"  ? &o.logprobs
                      : a == "--overlap-batch"   ? &o.overlap_batch
                      : a == "--overlap-context" ? &o.overlap_context
                                           : nullptr;
    bool* flag = a == "--quick"          ? &o.quick
                 : a == "--kernels"      ? &o.kernels
                 : a == "--decode-only"  ? &o.decode_only
                 : a == "--headline"     ? &o.headline
                 : a == "--kernels-only" ? &o.kernels_only
                 : a == "--decode-spread" ? &o.decode_spread
                                         : nullptr;
    if (flag) {
      *flag = true;
      continue;
    }
    if (!text && !number)
      return usage;
    if (!has_value)
      return "gpu_bench: " + a + " needs a value";
    ++i;
    if (text) {
      if (text == &o.kv_dtype && !parse_kv_cache_dtype(v))
        return "gpu_bench: " + a + ": expected bf16, fp8 or fp8_e5m2, not '" + v + "'";
      if (text == &o.quantize && !parse_weight_quantization(v))
        return "gpu_bench: " + a + ": expected none or int4, not '" + v + "'";
      if ((text == &o.overlap || text == &o.overlap_chunks) && bench::parse_int_list(v).empty())
        return "gpu_bench: " + a + ": expected whole numbers separated by commas, not '" + v
               + "'";
      if (text == &o.tp_devices && bench::parse_int_list(v).size() < 2)
        return "gpu_bench: " + a + ": expected two or more device ordinals separated by "
               "commas, not '" + v + "'";
      if (text == &o.tp_collective && v != "auto" && v != "nccl" && v != "peer")
        return "gpu_bench: " + a + ": expected auto, nccl or peer, not '" + v + "'";
      if (text == &o.overlap_chunks) {
        for (int32_t c : bench::parse_int_list(v)) {
          if (c < 1)
            return "gpu_bench: " + a + ": a chunk of 0 tokens in '" + v + "'";
        }
      }
      if (text == &o.make_quantize && v != "awq" && v != "gptq")
        return "gpu_bench: " + a + ": expected awq or gptq, not '" + v + "'";
      *text = v;
      continue;
    }
    const auto n = parse_integer(v); // the config's strict decimal syntax
    if (number == &o.logprobs) {
      if (!n || *n < 0 || *n > max_logprobs)
        return "gpu_bench: " + a + ": expected a whole number from 0 to "
               + std::to_string(max_logprobs) + ", not '" + v + "'";
    } else if (!n || *n < 1 || *n > (int64_t(1) << 20)) {
      return "gpu_bench: " + a + ": expected a whole number from 1 to 1048576, not '" + v + "'";
    }
    *number = int32_t(*n);
  }
  return {};
}

} // namespace
} // namespace metronome

int main(int argc, char** argv) {
  metronome::profile_batch = metronome::bench::apply_environment_switches();
  metronome::options o;
  if (const std::string error = metronome::parse_args(argc, argv, o); !error.empty()) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 2;
  }
  if (o.model.empty()) {
    std::fprintf(stderr, "gpu_bench: --model is required\n");
    return 2;
  }
  if (!o.make_preset.empty()) {
    // The same code as `metronome make-model --preset NAME --out DIR`.
    try {
      metronome::make_model_options mo;
      auto cfg = metronome::preset_config(o.make_preset);
      if (!cfg)
        throw std::invalid_argument("unknown preset " + o.make_preset);
      mo.config = *cfg;
      mo.out_dir = o.model;
      if (!o.make_quantize.empty()) // as make-model --quantize awq|gptq
        mo.quantize = metronome::rtn_config(o.make_quantize == "gptq"
                                              ? metronome::quant_method::gptq
                                              : metronome::quant_method::awq);
      const auto t0 = std::chrono::steady_clock::now();
      metronome::make_model(mo);
      std::printf("made %s in %s (%.1f s)\n", o.make_preset.c_str(), o.model.c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gpu_bench: %s\n", e.what());
      return 1;
    }
  }
  if (o.name.empty())
    o.name = o.model;
  try {
    return metronome::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_bench: %s\n", e.what());
    return 1;
  }
}
