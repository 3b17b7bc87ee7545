#include "bench/gpu/kernel_bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <cublas_v2.h>

#include "gpu/cuda_check.hpp"
#include "gpu/device_memory.hpp"
#include "gpu/kernels.hpp"

namespace metronome::bench {

namespace {

using gpu::bf16;
using gpu::device_buffer;

/// Fills `bytes` of device memory with random bf16 in [-0.05, 0.05).
void fill_random(void* dst, size_t bytes, uint64_t seed) {
  const size_t block = std::min<size_t>(bytes / 2, 16u << 20); // elements
  std::vector<float> host(block);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-0.05f, 0.05f);
  for (auto& x : host)
    x = d(rng);
  device_buffer f32(block * 4);
  METRONOME_CUDA(cudaMemcpy(f32.get(), host.data(), block * 4, cudaMemcpyHostToDevice));
  auto* out = static_cast<unsigned char*>(dst);
  gpu::launch_to_bf16(f32.get(), false, int64_t(block), reinterpret_cast<bf16*>(out), nullptr);
  for (size_t off = block * 2; off < bytes; off += block * 2)
    METRONOME_CUDA(cudaMemcpy(out + off, out, std::min(block * 2, bytes - off),
                              cudaMemcpyDeviceToDevice));
  METRONOME_CUDA(cudaDeviceSynchronize());
}

/// Timed launches per figure: METRONOME_KBENCH_REPS (default 15; 1 under a
/// profiler, which times each launch itself).
int default_reps() {
  static const int reps = [] {
    const char* v = std::getenv("METRONOME_KBENCH_REPS");
    return v ? std::max(1, std::atoi(v)) : 15;
  }();
  return reps;
}

/// Median microseconds of fn(i) over `reps` launches (after up to 3
/// warm-ups), each timed with events.
double time_us(const std::function<void(int)>& fn, int reps = default_reps()) {
  gpu::event_timer timer;
  for (int i = 0; i < std::min(3, reps); ++i)
    fn(i);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    timer.start();
    fn(i);
    timer.stop();
    t.push_back(timer.ms(60, "kernel timing") * 1e3);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct shape {
  const char* name;
  int64_t n, k;
};

} // namespace

void kernel_bench(const model_config& c, const std::string& model, double bw, double flops,
                  nlohmann::json& rows) {
  auto row = [&](const std::string& metric, double us, double floor_us) {
    rows.push_back({{"engine", "metronome-kernel"},
                    {"model", model},
                    {"metric", metric},
                    {"value", us},
                    {"unit", "us"},
                    {"floor", floor_us}});
    std::printf("  %-44s %9.1f us  floor %9.1f us  (%3.0f%%)\n", metric.c_str(), us, floor_us,
                100.0 * floor_us / us);
    std::fflush(stdout);
  };
  const gpu::kernel_generations saved = gpu::active_kernels();
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), f = c.intermediate_size;
  const shape shapes[] = {{"qkv", q + 2 * kv, h},
                          {"o", h, q},
                          {"gate_up", 2 * f, h},
                          {"down", h, f},
                          {"lm_head", c.vocab_size, h}};
  cublasHandle_t handle;
  METRONOME_CUBLAS(cublasCreate(&handle));
  device_buffer ws(32u << 20);
  METRONOME_CUBLAS(cublasSetWorkspace(handle, ws.get(), ws.bytes()));
  const int64_t max_m = 2048;
  device_buffer x(size_t(max_m) * size_t(std::max(h, f)) * 2);
  fill_random(x.get(), x.bytes(), 7);
  // fp32 residual rows and a norm weight for the fused RMSNorm prologue.
  device_buffer residual(size_t(8) * size_t(h) * 4), norm_w(size_t(h) * 2);
  {
    std::vector<float> host(size_t(8) * size_t(h));
    std::mt19937_64 rng(13);
    std::uniform_real_distribution<float> d(-2.0f, 2.0f);
    for (auto& v : host)
      v = d(rng);
    METRONOME_CUDA(cudaMemcpy(residual.get(), host.data(), residual.bytes(),
                              cudaMemcpyHostToDevice));
    fill_random(norm_w.get(), norm_w.bytes(), 17);
  }

  // METRONOME_KBENCH_ONLY=int4: the 4-bit GEMV rows alone.
  const char* only_env = std::getenv("METRONOME_KBENCH_ONLY");
  const bool int4_only = only_env && std::string(only_env) == "int4";
  for (const auto& s : shapes) {
    // Arguments of one plain-input launch of `m` tokens into `out`.
    auto plain_args = [&](int m, float* out) {
      gpu::gemv_args a;
      a.n = int32_t(s.n);
      a.k = int32_t(s.k);
      a.m = m;
      a.x = x.get<bf16>();
      a.out_f32 = out;
      return a;
    };
    // The 4-bit GEMV (group 128, random nibbles, zeros and fp16 scales) of
    // each projection, every generation; the floor is its bytes, scales
    // included. The LM head stays bf16 in 4-bit models.
    if (s.k % 128 == 0 && std::string(s.name) != "lm_head") {
      const int32_t groups = int32_t(s.k / 128);
      const size_t q_bytes = size_t(s.n) * size_t(s.k) / 2;
      const size_t sz_bytes = size_t(s.n) * size_t(groups) * 4;
      const int copies = int(std::max<size_t>(1, std::min<size_t>(8, (512u << 20) / q_bytes)));
      device_buffer q(q_bytes * size_t(copies)), sz(sz_bytes * size_t(copies));
      {
        std::mt19937_64 rng(23);
        std::vector<uint32_t> host(q_bytes / 4);
        for (auto& v : host)
          v = uint32_t(rng());
        for (int i = 0; i < copies; ++i)
          METRONOME_CUDA(cudaMemcpy(q.get<unsigned char>() + q_bytes * size_t(i), host.data(),
                                    q_bytes, cudaMemcpyHostToDevice));
        std::vector<uint32_t> szh(sz_bytes / 4);
        for (auto& v : szh)
          v = (0x2000u + uint32_t(rng() % 0x800)) | (uint32_t(rng() % 16) << 16); // fp16 0.008-0.016
        for (int i = 0; i < copies; ++i)
          METRONOME_CUDA(cudaMemcpy(sz.get<unsigned char>() + sz_bytes * size_t(i), szh.data(),
                                    sz_bytes, cudaMemcpyHostToDevice));
      }
      device_buffer y(size_t(8) * size_t(s.n) * 4);
      const double floor_us = double(q_bytes + sz_bytes) / bw * 1e6;
      for (int gen : {2, 1}) {
        gpu::active_kernels().gemv_int4 = gen;
        for (int m : {1, 2, 4, 8}) {
          const gpu::gemv_args a = plain_args(m, y.get<float>());
          if (!gpu::gemv_int4_takes(gpu::gemv_epilogue::store_f32, m, a.k))
            continue;
          // Ten launches back to back a timing, over the rotated copies:
          // these kernels are shorter than a launch's host time, which a
          // single timed launch would count.
          constexpr int burst = 10;
          const double us = time_us([&](int i) {
            for (int j = 0; j < burst; ++j) {
              const size_t c = size_t(i * burst + j) % size_t(copies);
              gpu::int4_weights w;
              w.q = reinterpret_cast<const uint32_t*>(q.get<unsigned char>() + q_bytes * c);
              w.sz = reinterpret_cast<const uint32_t*>(sz.get<unsigned char>() + sz_bytes * c);
              w.group_size = 128;
              w.groups = groups;
              gpu::launch_gemv_int4(gpu::gemv_epilogue::store_f32, a, w, nullptr);
            }
          }) / burst;
          row(std::string("gemv_int4_g") + std::to_string(gen) + "_" + s.name + "_m"
                + std::to_string(m),
              us, floor_us);
        }
      }
      gpu::active_kernels().gemv_int4 = saved.gemv_int4;
      // The skinny GEMM's 4-bit form (decode batches of 9 to 64), split-k
      // scratch as the engine sizes it; the floor is the larger of its bytes
      // and its flops.
      if (gpu::skinny_gemm_supports(gpu::gemv_epilogue::store_f32, int32_t(s.n), int32_t(s.k), 0)) {
        const auto need = gpu::skinny_gemm_workspace(gpu::gemv_epilogue::store_f32,
                                                     int32_t(s.n), int32_t(s.k),
                                                     gpu::skinny_gemm_max_m);
        device_buffer partials(std::max<size_t>(need.partial_bytes, 4));
        device_buffer counters(size_t(std::max(need.counters, 1)) * 4);
        METRONOME_CUDA(cudaMemset(counters.get(), 0, counters.bytes()));
        gpu::skinny_gemm_scratch sc{partials.get<float>(), need.partial_bytes,
                                    counters.get<int32_t>(), need.counters};
        device_buffer y64(size_t(64) * size_t(s.n) * 4);
        for (int m : {16, 32, 64}) {
          const gpu::gemv_args a = plain_args(m, y64.get<float>());
          const double us = time_us([&](int i) {
            const size_t c = size_t(i) % size_t(copies);
            gpu::int4_weights w;
            w.q = reinterpret_cast<const uint32_t*>(q.get<unsigned char>() + q_bytes * c);
            w.sz = reinterpret_cast<const uint32_t*>(sz.get<unsigned char>() + sz_bytes * c);
            w.group_size = 128;
            w.groups = groups;
            gpu::launch_skinny_gemm_int4(gpu::gemv_epilogue::store_f32, a, w, sc, nullptr);
          });
          const double fl =
            std::max(floor_us, 2.0 * m * double(s.n) * double(s.k) / flops * 1e6);
          row(std::string("skinny_int4_") + s.name + "_m" + std::to_string(m), us, fl);
        }
      }
    }
    if (int4_only)
      continue;
    const size_t bytes = size_t(s.n) * size_t(s.k) * 2;
    // Enough copies that a rotation exceeds the 60 MB L2 several times.
    const int copies = int(std::max<size_t>(1, std::min<size_t>(8, (512u << 20) / bytes)));
    device_buffer w(bytes * size_t(copies));
    fill_random(w.get(), w.bytes(), 11);
    device_buffer y(size_t(max_m) * size_t(s.n) * 4);
    auto wp = [&](int i) {
      return reinterpret_cast<const bf16*>(w.get<unsigned char>() + bytes * size_t(i % copies));
    };
    const double floor_us = double(bytes) / bw * 1e6;
    // Both GEMV generations, plain bf16 input; and with the RMSNorm prologue
    // (fp32 residual in) where the engine uses it (qkv, gate_up, LM head).
    const bool norm_input = s.k == h;
    // One GEMV launch timed over the rotated weight copies.
    auto time_gemv = [&](gpu::gemv_args a, const std::string& metric) {
      a.n = int32_t(s.n);
      a.k = int32_t(s.k);
      a.out_f32 = y.get<float>();
      const double us = time_us([&](int i) {
        a.w = wp(i);
        gpu::launch_gemv(gpu::gemv_epilogue::store_f32, a, nullptr);
      });
      row(metric, us, floor_us);
    };
    for (int gen : {2, 1}) {
      gpu::active_kernels().gemv = gen;
      const std::string tag = gen == 1 ? "gemv_v1_" : "gemv_";
      for (int m : {1, 2, 4, 8}) {
        gpu::gemv_args a;
        a.m = m;
        a.x = x.get<bf16>();
        time_gemv(a, tag + s.name + "_m" + std::to_string(m));
      }
      if (norm_input) {
        gpu::gemv_args a;
        a.m = 1;
        a.residual_in = residual.get<float>();
        a.norm_weight = norm_w.get<bf16>();
        time_gemv(a, tag + "norm_" + s.name + "_m1");
      }
    }
    gpu::active_kernels().gemv = saved.gemv;
    // The tensor-core skinny GEMM (plain bf16 input, split-k scratch as the
    // engine sizes it).
    if (gpu::skinny_gemm_supports(gpu::gemv_epilogue::store_f32, int32_t(s.n), int32_t(s.k), 0)) {
      const auto need = gpu::skinny_gemm_workspace(gpu::gemv_epilogue::store_f32, int32_t(s.n),
                                                   int32_t(s.k), gpu::skinny_gemm_max_m);
      device_buffer partials(std::max<size_t>(need.partial_bytes, 4));
      device_buffer counters(size_t(std::max(need.counters, 1)) * 4);
      METRONOME_CUDA(cudaMemset(counters.get(), 0, counters.bytes()));
      gpu::skinny_gemm_scratch sc{partials.get<float>(), need.partial_bytes,
                                  counters.get<int32_t>(), need.counters};
      for (int m : {4, 8, 16, 32, 64}) {
        gpu::gemv_args a = plain_args(m, y.get<float>());
        const double us = time_us([&](int i) {
          a.w = wp(i);
          gpu::launch_skinny_gemm(gpu::gemv_epilogue::store_f32, a, sc, nullptr);
        });
        const double fl = std::max(floor_us, 2.0 * m * double(s.n) * double(s.k) / flops * 1e6);
        row(std::string("skinny_") + s.name + "_m" + std::to_string(m) + "_s"
              + std::to_string(gpu::skinny_gemm_splits(gpu::gemv_epilogue::store_f32,
                                                       int32_t(s.n), int32_t(s.k), m)),
            us, fl);
      }
    }
    for (int m : {1, 8, 64, 2048}) {
      for (bool f32_acc : {false, true}) {
        if (f32_acc && m == 1)
          continue;
        const float alpha = 1, beta = f32_acc ? 1.0f : 0.0f;
        const double us = time_us([&](int i) {
          METRONOME_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(s.n), m, int(s.k),
                                        &alpha, wp(i), CUDA_R_16BF, int(s.k), x.get(),
                                        CUDA_R_16BF, int(s.k), &beta, y.get(),
                                        f32_acc ? CUDA_R_32F : CUDA_R_16BF, int(s.n),
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
        const double fl = std::max(floor_us, 2.0 * m * double(s.n) * double(s.k) / flops * 1e6);
        row(std::string("cublas_") + s.name + "_m" + std::to_string(m)
              + (f32_acc ? "_f32_residual" : "_bf16"),
            us, fl);
      }
    }
  }
  cublasDestroy(handle);
  if (int4_only)
    return;

  // Attention on random pages (layer 0's shape).
  gpu::attention_shape sh;
  sh.num_heads = c.num_heads;
  sh.kv_heads = c.num_kv_heads;
  sh.head_dim = c.head_dim;
  sh.scale = 1.0f / std::sqrt(float(c.head_dim));
  int sms = 0;
  METRONOME_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int32_t per_sm = gpu::decode_attention_blocks_per_sm(sh);
  const int32_t per_sm8 = gpu::decode_attention_blocks_per_sm(sh, true); // the fp8 form's
  const int32_t ps = 16;
  struct attn_case {
    int32_t seqs, ctx, new_tokens;
  };
  std::vector<attn_case> cases = {attn_case{1, 128, 1}, attn_case{1, 4096, 1},
                                  attn_case{1, 32768, 1}, attn_case{64, 1024, 1},
                                  attn_case{1, 2048, 2048}, attn_case{1, 4196, 100}};
  // METRONOME_ATTN_SWEEP="seqs:ctx,...": the attention cases become these
  // shapes (one token a sequence, the launcher's splits, no first-generation
  // or fixed-split variants), to tell the decode attention's fixed cost from
  // its streaming rate. The GEMV and
  // GEMM rows above run as always.
  const char* sweep_env = std::getenv("METRONOME_ATTN_SWEEP");
  const bool sweep = sweep_env != nullptr;
  if (sweep) {
    cases.clear();
    const std::string list = sweep_env;
    auto bad = [&](const std::string& item) {
      return std::runtime_error("METRONOME_ATTN_SWEEP: expected a comma-separated list of "
                                "seqs:ctx pairs (positive, seqs x ctx at most 2^26 tokens), "
                                "got '" + item + "' in '" + list + "'");
    };
    size_t at = 0;
    do {
      const size_t end = std::min(list.find(',', at), list.size());
      const std::string item = list.substr(at, end - at);
      attn_case ac{0, 0, 1};
      char colon = 0, rest = 0;
      std::istringstream one(item);
      if (!(one >> ac.seqs >> colon >> ac.ctx) || colon != ':' || one >> rest || ac.seqs < 1
          || ac.ctx < 1 || int64_t(ac.seqs) * ac.ctx > (int64_t(1) << 26))
        throw bad(item);
      cases.push_back(ac);
      at = end + 1;
    } while (at <= list.size());
  }
  for (const attn_case ac : cases) {
    const int32_t pages_per_seq = (ac.ctx + ps - 1) / ps;
    const int32_t pages = ac.seqs * pages_per_seq;
    const size_t pool = size_t(pages) * size_t(kv) * ps * 2;
    device_buffer k(pool), v(pool);
    fill_random(k.get(), pool, 3);
    fill_random(v.get(), pool, 5);
    std::vector<int32_t> table(static_cast<size_t>(pages), 0);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(1));
    std::vector<int32_t> positions, token_seq, slot, q_start, seq_len;
    for (int32_t s = 0; s < ac.seqs; ++s) {
      slot.push_back(s);
      q_start.push_back(int32_t(positions.size()));
      seq_len.push_back(ac.ctx);
      for (int32_t t = ac.ctx - ac.new_tokens; t < ac.ctx; ++t) {
        positions.push_back(t);
        token_seq.push_back(s);
      }
    }
    q_start.push_back(int32_t(positions.size()));
    auto upload = [](const std::vector<int32_t>& hv) {
      device_buffer d(hv.size() * 4);
      METRONOME_CUDA(cudaMemcpy(d.get(), hv.data(), hv.size() * 4, cudaMemcpyHostToDevice));
      return d;
    };
    auto d_table = upload(table), d_pos = upload(positions), d_ts = upload(token_seq),
         d_slot = upload(slot), d_qs = upload(q_start), d_len = upload(seq_len);
    gpu::kv_view kvv;
    kvv.k = k.get<bf16>();
    kvv.v = v.get<bf16>();
    kvv.page_table = d_table.get<int32_t>();
    kvv.page_table_stride = pages_per_seq;
    kvv.page_size = ps;
    kvv.kv_heads = c.num_kv_heads;
    kvv.head_dim = c.head_dim;
    gpu::batch_view bv;
    bv.num_tokens = int32_t(positions.size());
    bv.num_seqs = ac.seqs;
    bv.positions = d_pos.get<int32_t>();
    bv.token_seq = d_ts.get<int32_t>();
    bv.seq_slot = d_slot.get<int32_t>();
    bv.seq_q_start = d_qs.get<int32_t>();
    bv.seq_len = d_len.get<int32_t>();
    device_buffer dq(size_t(bv.num_tokens) * size_t(q) * 2), out(dq.bytes());
    fill_random(dq.get(), dq.bytes(), 9);
    const std::string shape_tag =
      "_bs" + std::to_string(ac.seqs) + "_ctx" + std::to_string(ac.ctx);
    // The fp8 form for timing: the bf16 pools' first halves as bytes
    // (random, NaN codes included: the time does not depend on them) and
    // one scale a row.
    device_buffer scales(size_t(pages) * size_t(kv) / size_t(c.head_dim) * ps * 8);
    fill_random(scales.get(), scales.bytes(), 11);
    gpu::kv_view kv8 = kvv;
    kv8.k8 = k.get<uint8_t>();
    kv8.v8 = v.get<uint8_t>();
    kv8.k_scale = scales.get<float>();
    kv8.v_scale = kv8.k_scale + scales.bytes() / 8;
    if (ac.new_tokens == 1) {
      // Both generations at their own split choice; the current one also at
      // fixed splits for batch 64 (to check the heuristic).
      struct variant {
        int gen;
        int32_t splits; // 0: the launcher's choice
        int32_t warps;  // 0: the launcher's choice
        bool fp8 = false; // the fp8 cache (kv_view::k8)
      };
      std::vector<variant> variants = {{2, 0, 0}, {1, 0, 0}};
      if (sweep)
        variants = {{2, 0, 0}};
      else if (ac.seqs >= 64)
        variants.insert(variants.end(), {{2, 1, 0}, {2, 2, 0}, {2, 4, 0}, {2, 1, 4}});
      if (sweep && std::getenv("METRONOME_ATTN_SWEEP_FP8"))
        variants.insert(variants.end(), {{2, 0, 0, true}, {2, 0, 2, true}, {2, 0, 4, true}});
      for (const variant vr : variants) {
        gpu::active_kernels().decode_attention = vr.gen;
        const int32_t splits =
          vr.splits > 0 ? vr.splits
                        : gpu::decode_attention_splits(sh, ac.seqs, sms, vr.fp8 ? per_sm8 : per_sm);
        const int32_t warps =
          vr.warps > 0 ? vr.warps
                       : gpu::decode_attention_warps(sh, ac.seqs, splits, sms,
                                                     vr.fp8 ? per_sm8 : per_sm);
        device_buffer po(size_t(ac.seqs) * size_t(c.num_heads) * splits * size_t(c.head_dim) * 4);
        device_buffer pml(size_t(ac.seqs) * size_t(c.num_heads) * splits * 8);
        device_buffer cnt(size_t(ac.seqs) * size_t(c.num_heads) * 4);
        METRONOME_CUDA(cudaMemset(cnt.get(), 0, cnt.bytes()));
        const double us = time_us([&](int) {
          gpu::launch_decode_attention(sh, dq.get<bf16>(), vr.fp8 ? kv8 : kvv, bv, splits, warps,
                                       po.get<float>(), pml.get<float>(), cnt.get<int32_t>(),
                                       out.get<bf16>(), nullptr);
        });
        std::string name = vr.gen == 1 ? "decode_attention_v1" : "decode_attention";
        name += shape_tag;
        if (vr.splits > 0)
          name += "_splits" + std::to_string(vr.splits);
        if (vr.warps > 0)
          name += "_warps" + std::to_string(vr.warps);
        if (vr.fp8)
          name += "_fp8";
        row(name, us, (vr.fp8 ? 1.0 : 2.0) * double(pool) / bw * 1e6);
      }
      gpu::active_kernels().decode_attention = saved.decode_attention;
      if (ac.seqs == 1 && ac.ctx == 128) {
        // Latency inside a graph, as in a step: 32 launches back to back in
        // one captured graph, per launch (the same cache each time, so L2
        // hits after the first); a one-thread kernel for the graph's own
        // cost per node; lengths 1 to 128 and 1, 2 or the launcher's splits
        // (1 and 2 also launch fewer blocks).
        cudaStream_t st;
        METRONOME_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        auto chain_us = [&](const std::function<void(cudaStream_t)>& fn) {
          cudaGraph_t g;
          METRONOME_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
          for (int i = 0; i < 32; ++i)
            fn(st);
          METRONOME_CUDA(cudaStreamEndCapture(st, &g));
          cudaGraphExec_t ge;
          METRONOME_CUDA(cudaGraphInstantiate(&ge, g, 0));
          const double ms = gpu::mean_launch_ms(
            st, 3, 20, [&] { METRONOME_CUDA(cudaGraphLaunch(ge, st)); }, 60, "chain timing");
          cudaGraphExecDestroy(ge);
          cudaGraphDestroy(g);
          return ms * 1e3 / 32;
        };
        device_buffer one(4);
        row("chain_one_thread_kernel",
            chain_us([&](cudaStream_t s2) { gpu::launch_fill_i32(one.get<int32_t>(), 1, 0, s2); }),
            0.0);
        const int32_t auto_splits = gpu::decode_attention_splits(sh, 1, sms, per_sm);
        device_buffer po(size_t(c.num_heads) * 64 * size_t(c.head_dim) * 4);
        device_buffer pml(size_t(c.num_heads) * 64 * 8);
        device_buffer cnt(size_t(c.num_heads) * 4);
        METRONOME_CUDA(cudaMemset(cnt.get(), 0, cnt.bytes()));
        for (int32_t len : {1, 16, 64, 128}) {
          const std::vector<int32_t> lv{len};
          METRONOME_CUDA(cudaMemcpy(d_len.get(), lv.data(), 4, cudaMemcpyHostToDevice));
          for (int32_t splits : {1, 2, auto_splits}) {
            const double us = chain_us([&](cudaStream_t s2) {
              gpu::launch_decode_attention(sh, dq.get<bf16>(), kvv, bv, splits, 4,
                                           po.get<float>(), pml.get<float>(), cnt.get<int32_t>(),
                                           out.get<bf16>(), s2);
            });
            row("chain_decode_attention_bs1_len" + std::to_string(len) + "_splits"
                  + std::to_string(splits),
                us, 0.0);
          }
        }
        const std::vector<int32_t> lv{ac.ctx};
        METRONOME_CUDA(cudaMemcpy(d_len.get(), lv.data(), 4, cudaMemcpyHostToDevice));
        METRONOME_CUDA(cudaStreamDestroy(st));
      }
      if (gpu::decode_attention_fuses_rope(sh)) {
        // The cuBLAS decode path's two launches (RoPE + cache write, then the
        // attention) against the fused kernel, from the raw projection.
        const int32_t splits = gpu::decode_attention_splits(sh, ac.seqs, sms, per_sm);
        const int32_t warps = gpu::decode_attention_warps(sh, ac.seqs, splits, sms, per_sm);
        const int64_t width = int64_t(c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
        device_buffer raw(size_t(bv.num_tokens) * size_t(width) * 2);
        fill_random(raw.get(), raw.bytes(), 11);
        std::vector<float> inv(size_t(c.head_dim / 2));
        for (size_t i = 0; i < inv.size(); ++i)
          inv[i] = float(std::pow(500000.0, -2.0 * double(i) / c.head_dim));
        device_buffer d_inv(inv.size() * 4);
        METRONOME_CUDA(cudaMemcpy(d_inv.get(), inv.data(), d_inv.bytes(), cudaMemcpyHostToDevice));
        device_buffer po(size_t(ac.seqs) * size_t(c.num_heads) * splits * size_t(c.head_dim) * 4);
        device_buffer pml(size_t(ac.seqs) * size_t(c.num_heads) * splits * 8);
        device_buffer cnt(size_t(ac.seqs) * size_t(c.num_heads) * 4);
        METRONOME_CUDA(cudaMemset(cnt.get(), 0, cnt.bytes()));
        const double fused = time_us([&](int) {
          gpu::launch_decode_attention_rope(
            sh, gpu::rope_input{raw.get<bf16>(), nullptr, d_inv.get<float>()}, kvv, bv, splits,
            warps, po.get<float>(), pml.get<float>(), cnt.get<int32_t>(), out.get<bf16>(),
            nullptr);
        });
        const double two = time_us([&](int) {
          gpu::launch_rope_kv_write(raw.get<bf16>(), nullptr, d_inv.get<float>(), bv, kvv,
                                    c.num_heads, dq.get<bf16>(), nullptr);
          gpu::launch_decode_attention(sh, dq.get<bf16>(), kvv, bv, splits, warps,
                                       po.get<float>(), pml.get<float>(), cnt.get<int32_t>(),
                                       out.get<bf16>(), nullptr);
        });
        row("decode_attention_rope" + shape_tag, fused, 2.0 * double(pool) / bw * 1e6);
        row("rope_then_decode_attention" + shape_tag, two, 2.0 * double(pool) / bw * 1e6);
      }
    } else {
      // Both generations with the bf16 cache, and the second with the fp8
      // cache (gen 3 below; the first generation has no fp8 form).
      for (int gen : {2, 1, 3}) {
        const bool fp8 = gen == 3;
        if (fp8 && c.head_dim > 128)
          continue;
        gpu::active_kernels().prefill_attention = fp8 ? 2 : gen;
        std::vector<gpu::prefill_item> items;
        for (int32_t r = 0; r < ac.new_tokens; r += gpu::prefill_tile_rows())
          items.push_back({0, r});
        std::reverse(items.begin(), items.end());
        device_buffer d_items(items.size() * sizeof(gpu::prefill_item));
        METRONOME_CUDA(cudaMemcpy(d_items.get(), items.data(), d_items.bytes(),
                                  cudaMemcpyHostToDevice));
        const double us = time_us([&](int) {
          gpu::launch_prefill_attention(sh, dq.get<bf16>(), fp8 ? kv8 : kvv, bv,
                                        d_items.get<gpu::prefill_item>(), int32_t(items.size()),
                                        out.get<bf16>(), nullptr);
        });
        const double n = ac.new_tokens, cached = ac.ctx - ac.new_tokens;
        const double fl = 4.0 * double(q) * (n * (n + 1) / 2 + n * cached) / flops * 1e6;
        const std::string tag = std::string(gen == 1 ? "prefill_attention_v1_"
                                            : fp8    ? "prefill_attention_fp8_"
                                                     : "prefill_attention_")
                                + std::to_string(ac.new_tokens)
                                + (cached > 0 ? "_after" + std::to_string(int(cached)) : "");
        row(tag, us, fl);
        if (cached > 0 && gen != 1) {
          // A short chunk after a cached prefix: its tiles' keys split over
          // blocks, as the engine does when the tiles alone leave SMs idle.
          const size_t cells = size_t(gpu::prefill_max_splits) * items.size() * c.num_heads * 128;
          device_buffer po(cells * size_t(c.head_dim) * 4), pml(cells * 8);
          for (int32_t splits : {2, 4, gpu::prefill_max_splits}) {
            gpu::prefill_split sp;
            sp.o = po.get<float>();
            sp.ml = pml.get<float>();
            sp.splits = splits;
            const double us_s = time_us([&](int) {
              gpu::launch_prefill_attention(sh, dq.get<bf16>(), fp8 ? kv8 : kvv, bv,
                                            d_items.get<gpu::prefill_item>(),
                                            int32_t(items.size()), out.get<bf16>(), nullptr, sp);
            });
            row(tag + "_splits" + std::to_string(splits), us_s, fl);
          }
        }
      }
      gpu::active_kernels().prefill_attention = saved.prefill_attention;
    }
  }
}

} // namespace metronome::bench
