#include "gpu/startup_tuner.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace metronome::gpu {

namespace {

/// Device time (ms) of what `launch` enqueues on `stream`, the mean of five
/// runs after two unmeasured ones. Synchronous; not while capturing.
template <class F>
double time_ms(cudaStream_t stream, F&& launch) {
  return mean_launch_ms(stream, 2, 5, launch, 60.0, "kernel timing");
}

} // namespace

startup_tuner::startup_tuner(const model_config& config, const cuda_runner_options& options,
                             forward_pass& forward, const weight_store& weights,
                             const kv_pool& kv, decode_graph_cache& graphs, cudaStream_t stream)
  : config_(config), options_(options), forward_(forward), weights_(weights), kv_(kv),
    graphs_(graphs), stream_(stream) {
}

void startup_tuner::tune_projections(int32_t m) {
  const auto& c = config_;
  const int32_t h = c.hidden_size, q = c.q_size(), qkv = q + 2 * c.kv_size();
  const int32_t f = c.intermediate_size;
  const layer_weights& L = weights_.layers().front();
  const forward_buffers& b = forward_.buffers();
  gemm_tuner& tuner = forward_.tuner();
  auto& splits = forward_.split_choices();
  constexpr int32_t max_gemm_splits = forward_pass::max_gemm_splits;
  // Scratch use of the activation buffers, filled with a non-zero constant
  // (bf16 0x3c3c ~ 0.0115; all-zero inputs would flatter the timings).
  for (auto* buf : {&b.xn, &b.attn, &b.act, &b.dequant})
    if (buf->bytes() > 0)
      METRONOME_CUDA(cudaMemsetAsync(buf->get(), 0x3c, buf->bytes(), stream_));
  // A 4-bit projection is multiplied as its bf16 form in the dequantization
  // scratch (forward_pass::dense): time that.
  auto as_dense = [&](const bf16* dense, const int4_weights& w4) {
    return w4 ? b.dequant.get<bf16>() : dense;
  };
  const bf16 *w_qkv = as_dense(L.qkv, L.qkv4), *w_o = as_dense(L.o, L.o4);
  const bf16 *w_gate_up = as_dense(L.gate_up, L.gate_up4), *w_down = as_dense(L.down, L.down4);
  const double qkv_ms = tuner.tune(b.xn.get<bf16>(), m, w_qkv, qkv, h, b.qkv.get(), false, 0.0f);
  const double o_ms = tuner.tune(b.attn.get<bf16>(), m, w_o, h, q, b.x.get(), true, 1.0f);
  tuner.tune(b.xn.get<bf16>(), m, w_gate_up, 2 * f, h, b.gate_up.get(), false, 0.0f);
  const double down_ms = tuner.tune(b.act.get<bf16>(), m, w_down, h, f, b.x.get(), true, 1.0f);
  if (m <= forward_.max_batch())
    tuner.tune(b.xn.get<bf16>(), m, weights_.lm_head(), c.vocab_size, h, b.logits.get(), true,
               0.0f);
  if (m <= forward_.split_rows()) {
    if (b.split_partials.bytes() > 0 && !splits.contains(m)) {
      // Each projection whole or as split-K partials, by timing. A split
      // must win by 2%, or the simpler launch stays.
      float* parts = b.split_partials.get<float>();
      auto better = [](double ms, double best_ms) { return ms < 0.98 * best_ms; };
      split_choice r;
      // qkv: its partials cost the fused attention a few KB more to read.
      if (decode_attention_fuses_rope(forward_.attention_of(0))) {
        double best_ms = qkv_ms;
        for (int32_t s = 1; s <= max_gemm_splits; s *= 2)
          if (gemm_tuner::split_ok(h, s)) {
            const double ms = tuner.tune_split(b.xn.get<bf16>(), m, w_qkv, qkv, h, parts, s);
            if (better(ms, best_ms)) {
              r.qkv = s;
              best_ms = ms;
            }
          }
      }
      // o and down: cuBLAS's epilogue adding into the residual and a norm
      // launch, or the partials and launch_residual_rms_norm.
      const double norm_ms = time_ms(stream_, [&] {
        launch_rms_norm(b.x.get<float>(), nullptr, L.mlp_norm, 1e-5f, m, h, b.xn.get<bf16>(),
                        stream_);
      });
      auto best_split = [&](const bf16* in, const bf16* w, int32_t k, const bf16* bias,
                            double whole_ms) {
        int32_t best = 0;
        double best_ms = whole_ms + norm_ms;
        for (int32_t s = 1; s <= max_gemm_splits; s *= 2) {
          if (!gemm_tuner::split_ok(k, s))
            continue;
          const double ms = tuner.tune_split(in, m, w, h, k, parts, s) + time_ms(stream_, [&] {
                              launch_residual_rms_norm(parts, s, bias, b.x.get<float>(),
                                                       L.mlp_norm, 1e-5f, m, h,
                                                       b.xn.get<bf16>(), stream_);
                            });
          if (better(ms, best_ms)) {
            best = s;
            best_ms = ms;
          }
        }
        return best;
      };
      const double o_bias_ms =
        L.o_bias
          ? time_ms(stream_, [&] { launch_add_bias(b.x.get<float>(), L.o_bias, m, h, stream_); })
          : 0.0;
      r.o = best_split(b.attn.get<bf16>(), w_o, q, L.o_bias, o_ms + o_bias_ms);
      r.down = best_split(b.act.get<bf16>(), w_down, f, nullptr, down_ms);
      splits[m] = r;
    }
  }
  METRONOME_CUDA(cudaMemsetAsync(b.x.get(), 0, b.x.bytes(), stream_));
}

void startup_tuner::capture_graphs(bool graphs_enabled) {
  using decode_graph = decode_graph_cache::decode_graph;
  using mixed_graph = decode_graph_cache::mixed_graph;
  auto& splits = forward_.split_choices();
  for (decode_graph& dg : graphs_.decode_graphs())
    dg = decode_graph{dg.size};
  // The tuner's flush: the start of the KV pool, zero now and while no
  // sequence runs (twice the L2, or what the pool has).
  // Only at start-up: no sequence holds a page yet.
  int device = 0, l2 = 0;
  METRONOME_CUDA(cudaGetDevice(&device));
  METRONOME_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  struct flush_scope {
    gemm_tuner& t;
    ~flush_scope() {
      t.set_flush(nullptr, 0);
    }
  } unset{forward_.tuner()};
  forward_.tuner().set_flush(kv_.pool().get(), std::min(kv_.pool().bytes(), 2 * size_t(l2)));
  // Full prefill chunks have exactly max_num_batched_tokens tokens.
  tune_projections(forward_.max_tokens());
  const std::string& want = options_.small_batch_path;
  for (decode_graph& dg : graphs_.decode_graphs()) {
    const int32_t n = dg.size;
    // The candidates for this size; "auto" times each captured graph and
    // keeps the fastest, the other settings force a path where it applies.
    std::vector<decode_path> candidates;
    if (forward_.gemv_ok(n) && (want == "auto" || want == "gemv"))
      candidates.push_back(decode_path::gemv);
    if (forward_.skinny_ok() && n <= skinny_gemm_max_m && (want == "auto" || want == "skinny"))
      candidates.push_back(decode_path::skinny);
    if (want == "auto" || want == "cublas" || candidates.empty())
      candidates.push_back(decode_path::blas);
    // The winner so far goes straight into dg. PDL and late triggers as the
    // launches of this thread would use them (METRONOME_PDL, or a scope the
    // caller holds); with "auto" (the default), decided below.
    dg.path = candidates.front();
    dg.pdl = pdl_active();
    dg.late = late_triggers();
    const bool pdl_both = pdl_setting() == pdl_mode::per_graph;
    double best_ms = 0.0;
    for (decode_path path : candidates) {
      if (path == decode_path::blas)
        tune_projections(n);
      graph_exec g;
      graphs_.capture_one(n, path, g);
      // cuBLAS with the split-K projections the tuner chose, against all
      // whole: timed in the step, where the tuner timed each kernel alone.
      double ms = std::nan("");
      const split_choice chosen = forward_.splits_of(n);
      if (path == decode_path::blas && active_kernels().gemm_splits == 2
          && (chosen.qkv || chosen.o || chosen.down)) {
        ms = graphs_.time(g, n);
        splits[n] = split_choice{};
        graph_exec whole;
        graphs_.capture_one(n, path, whole);
        const double whole_ms = graphs_.time(whole, n);
        if (whole_ms <= ms) {
          g = std::move(whole);
          ms = whole_ms;
        } else {
          splits[n] = chosen;
        }
      }
      if (candidates.size() == 1) {
        dg.exec[0] = std::move(g);
        break;
      }
      if (std::isnan(ms))
        ms = graphs_.time(g, n);
      if (!dg.exec[0] || ms < best_ms) {
        dg.exec[0] = std::move(g);
        dg.path = path;
        best_ms = ms;
      }
    }
    // METRONOME_PDL=auto: the GEMV path's graph again with PDL, the path
    // whose short kernels it can help (with every candidate tried, no
    // cuBLAS-path size of either model won by the margin on the H200; with
    // the o and down GEMVs never launching early, the batch-1 graphs win by
    // 3 to 6.5%: bench/results/h200-2026-12-01-r12.md). Both timed four times
    // in alternating order, so that a drift within the start-up favours
    // neither; PDL must win by pdl_margin, or the plain graph stays (single
    // timings picked by noise at 8B).
    if (pdl_both && dg.path == decode_path::gemv) {
      graph_exec gp;
      {
        const pdl_scope with_pdl(true);
        graphs_.capture_one(n, dg.path, gp);
      }
      if (wins_by_margin(gp, dg.exec[0], n)) {
        dg.exec[0] = std::move(gp);
        dg.pdl = true;
      }
    }
    // Then, where PDL won, late triggers (kernels.hpp), kept on the same
    // terms: they win at the 1B shape and lose at the 8B one (H200).
    if (pdl_both && dg.pdl && dg.path == decode_path::gemv) {
      graph_exec gl;
      {
        const pdl_scope with_pdl(true);
        const late_trigger_scope late(true);
        graphs_.capture_one(n, dg.path, gl);
      }
      if (wins_by_margin(gl, dg.exec[0], n)) {
        dg.exec[0] = std::move(gl);
        dg.late = true;
      }
    }
  }
  // Each size's twin: the same step reading staging slot 1 and writing
  // result slot 1, for the step launched behind one in flight. (Pointing
  // one graph's copy nodes at the other slot before each launch made the
  // launch wait for the graph's previous run: no overlap.)
  for (decode_graph& dg : graphs_.decode_graphs()) {
    const pdl_scope same_pdl(dg.pdl);
    const late_trigger_scope same_late(dg.late);
    graphs_.capture_one(dg.size, dg.path, dg.exec[1], 1);
  }
  auto& mixed = graphs_.mixed_graphs();
  mixed.clear();
  for (const auto& [singles, prompt] : graphs_.mixed_sizes(graphs_enabled)) {
    mixed_graph& m = mixed.emplace_back();
    m.singles = singles;
    m.prompt = prompt;
    // Its projections' algorithms and splits, timed for its rows as the
    // decode sizes' are (a shape already tuned is not timed again).
    tune_projections(singles + prompt);
    for (int32_t slot = 0; slot < 2; ++slot)
      graphs_.capture_mixed(m, m.exec[slot], slot);
  }
}

bool startup_tuner::wins_by_margin(const graph_exec& challenger, const graph_exec& incumbent,
                                   int32_t batch) {
  double inc_ms = 0.0, ch_ms = 0.0;
  for (int round = 0; round < 4; ++round) {
    const bool ch_first = round % 3 != 0; // inc ch | ch inc | ch inc | inc ch
    (ch_first ? ch_ms : inc_ms) += graphs_.time(ch_first ? challenger : incumbent, batch);
    (ch_first ? inc_ms : ch_ms) += graphs_.time(ch_first ? incumbent : challenger, batch);
  }
  return ch_ms < (1.0 - pdl_margin) * inc_ms;
}

} // namespace metronome::gpu
