#include "gpu/forward_pass.hpp"

#include <algorithm>
#include <cmath>

namespace metronome::gpu {

namespace {

constexpr size_t cublas_workspace_bytes = 32ull << 20;

} // namespace

forward_pass::forward_pass(const model_config& config, const cuda_runner_options& options,
                           const weight_store& weights, const kv_pool& kv, cudaStream_t stream,
                           cublasHandle_t cublas, int32_t num_sms, bool kv_fp8)
  : config_(config), weights_(weights), kv_(kv), stream_(stream), num_sms_(num_sms),
    kv_fp8_(kv_fp8), comm_(options.collective.get()) {
  const auto& c = config_;
  max_batch_ = options.limits.max_batch_size;
  max_tokens_ = std::max(options.limits.max_num_batched_tokens, max_batch_);
  const size_t t = size_t(max_tokens_), b = size_t(max_batch_);
  const size_t h = size_t(c.hidden_size), q = size_t(c.q_size()), kvs = size_t(c.kv_size());
  const size_t f = size_t(c.intermediate_size), v = size_t(c.vocab_size);
  buf_.x = device_buffer(t * h * 4);
  buf_.xn = device_buffer(t * h * 2);
  buf_.qkv = device_buffer(t * (q + 2 * kvs) * 2);
  buf_.q = device_buffer(t * q * 2);
  buf_.attn = device_buffer(t * q * 2);
  buf_.gate_up = device_buffer(t * 2 * f * 2);
  buf_.act = device_buffer(t * f * 2);
  buf_.logits = device_buffer(b * v * 4);
  buf_.raw_logits = device_buffer(b * v * 4);

  // Split-K partials: the most (sequences x splits) any batch size needs.
  attention_shape sh = attention_of(0);
  attn_blocks_per_sm_ = decode_attention_blocks_per_sm(sh, kv_fp8_);
  max_splits_product_ = 1;
  // A mixed graph's singles and padding reach max_batch_ + 1 rows.
  for (int32_t n = 1; n <= max_batch_ + 1; ++n)
    max_splits_product_ = std::max(
      max_splits_product_,
      n * (decode_attention_work_items(sh, n, num_sms_, attn_blocks_per_sm_) > 0
             ? decode_attention_work_splits()
             : decode_attention_splits(sh, n, num_sms_, attn_blocks_per_sm_)));
  buf_.part_o = device_buffer(size_t(max_splits_product_) * size_t(c.num_heads)
                              * size_t(c.head_dim) * 4);
  buf_.part_ml = device_buffer(size_t(max_splits_product_) * size_t(c.num_heads) * 2 * 4);
  buf_.split_counters = device_buffer(b * size_t(c.num_heads) * 4);
  METRONOME_CUDA(cudaMemset(buf_.split_counters.get(), 0, buf_.split_counters.bytes()));
  if (kv_fp8_)
    buf_.kv_stage = device_buffer(b * 2 * kvs * 4);
  if (kv_.e5m2())
    buf_.kv_e5m2_rows = device_buffer(t * size_t(c.num_kv_heads) * 16);
  // Rows: a decode batch, or a mixed graph's singles and prompt rows (at most
  // max_batch_size + 256, step_packer::mixed_sizes), whose o and down
  // projections may split the same way.
  split_rows_ = int32_t(std::min<size_t>(t, b + 256));
  if (residual_rms_norm_supports(c.hidden_size))
    buf_.split_partials = device_buffer(size_t(max_gemm_splits) * size_t(split_rows_)
                                        * std::max(h, q + 2 * kvs) * 4);
  buf_.sample_ws = device_buffer(sample_workspace_bytes(max_batch_));
  buf_.cublas_ws = device_buffer(cublas_workspace_bytes);
  METRONOME_CUBLAS(cublasSetWorkspace(cublas, buf_.cublas_ws.get(), buf_.cublas_ws.bytes()));
  tuner_ = std::make_unique<gemm_tuner>(cublas, stream_, buf_.cublas_ws.get(),
                                        buf_.cublas_ws.bytes());

  // The skinny GEMM's split-k scratch: the most any projection needs (they
  // run one after another on the stream).
  const int32_t qkv_n = c.q_size() + 2 * c.kv_size();
  const struct {
    gemv_epilogue ep;
    int32_t n, k;
  } projections[] = {{gemv_epilogue::qkv_rope, qkv_n, c.hidden_size},
                     {gemv_epilogue::residual_add, c.hidden_size, c.q_size()},
                     {gemv_epilogue::swiglu, 2 * c.intermediate_size, c.hidden_size},
                     {gemv_epilogue::residual_add, c.hidden_size, c.intermediate_size},
                     {gemv_epilogue::store_f32, c.vocab_size, c.hidden_size}};
  skinny_ok_ = true;
  skinny_gemm_workspace_size skinny_ws;
  for (const auto& pr : projections) {
    if (!skinny_gemm_supports(pr.ep, pr.n, pr.k, c.head_dim)) {
      skinny_ok_ = false;
      break;
    }
    const auto w = skinny_gemm_workspace(pr.ep, pr.n, pr.k, std::min(max_batch_, skinny_gemm_max_m));
    skinny_ws.partial_bytes = std::max(skinny_ws.partial_bytes, w.partial_bytes);
    skinny_ws.counters = std::max(skinny_ws.counters, w.counters);
  }
  if (skinny_ok_) {
    buf_.skinny_partials = device_buffer(std::max<size_t>(skinny_ws.partial_bytes, 4));
    buf_.skinny_counters = device_buffer(size_t(std::max(skinny_ws.counters, 1)) * 4);
    METRONOME_CUDA(cudaMemset(buf_.skinny_counters.get(), 0, buf_.skinny_counters.bytes()));
  }

  if (weights_.has_int4())
    buf_.dequant = device_buffer(size_t(weights_.largest_int4()) * 2);

  // The prefill attention's split-key scratch (tile rows: 128 or fewer).
  {
    const size_t cells = size_t(prefill_split_parts) * size_t(c.num_heads) * 128;
    buf_.prefill_part_o = device_buffer(cells * size_t(c.head_dim) * 4);
    buf_.prefill_part_ml = device_buffer(cells * 2 * 4);
  }
}

void forward_pass::allocate_step_io(size_t input_bytes) {
  const size_t b = size_t(max_batch_);
  buf_.inputs = device_buffer(input_bytes);
  // ids, log-probabilities and (fp8_e5m2) the overflow counts
  // (kv_view::overflow), so that one copy brings all back.
  buf_.outputs = device_buffer(b * (kv_.e5m2() ? 16 : 8));
  buf_.logits_lse = device_buffer(b * 8);
  buf_.logprob_out = device_buffer(b * (1 + size_t(max_logprobs)) * 8);
}

size_t forward_pass::activation_bytes() const {
  return buf_.x.bytes() + buf_.xn.bytes() + buf_.qkv.bytes() + buf_.q.bytes() + buf_.attn.bytes()
         + buf_.gate_up.bytes() + buf_.act.bytes() + buf_.logits.bytes() + buf_.raw_logits.bytes()
         + buf_.dequant.bytes();
}

size_t forward_pass::workspace_bytes() const {
  return buf_.part_o.bytes() + buf_.part_ml.bytes() + buf_.split_counters.bytes()
         + buf_.sample_ws.bytes() + buf_.cublas_ws.bytes() + buf_.inputs.bytes()
         + buf_.outputs.bytes() + buf_.skinny_partials.bytes() + buf_.skinny_counters.bytes()
         + buf_.split_partials.bytes() + buf_.kv_stage.bytes() + buf_.kv_e5m2_rows.bytes()
         + buf_.logits_lse.bytes()
         + buf_.logprob_out.bytes();
}

// -- views ---------------------------------------------------------------------------------

forward_pass::step_views forward_pass::views(const step_layout& l) const {
  auto* base = buf_.inputs.get<unsigned char>();
  auto i32 = [&](size_t off) { return reinterpret_cast<const int32_t*>(base + off); };
  auto f32 = [&](size_t off) { return reinterpret_cast<const float*>(base + off); };
  step_views v;
  v.batch.num_tokens = l.tokens;
  v.batch.num_seqs = l.seqs;
  v.batch.positions = i32(l.positions);
  v.batch.token_seq = i32(l.token_seq);
  v.batch.seq_slot = i32(l.seq_slot);
  v.batch.seq_q_start = i32(l.seq_q_start);
  v.batch.seq_len = i32(l.seq_len);
  v.singles.num_tokens = l.tokens;
  v.singles.num_seqs = l.singles;
  v.singles.positions = v.batch.positions;
  v.singles.token_seq = v.batch.token_seq;
  v.singles.seq_slot = i32(l.single_slot);
  v.singles.seq_q_start = i32(l.single_q_start);
  v.singles.seq_len = i32(l.single_len);
  if (l.work_items > 0) {
    v.batch.work = i32(l.work);
    v.batch.work_items = l.work_items;
  }
  if (l.single_work_items > 0) {
    v.singles.work = i32(l.single_work);
    v.singles.work_items = l.single_work_items;
  }
  v.ids = i32(l.ids);
  v.sample_src = i32(l.sample_src);
  v.header = i32(l.header);
  v.updates = i32(l.update_data);
  v.items = reinterpret_cast<const prefill_item*>(base + l.item_data);
  v.sampling.temperature = f32(l.temperature);
  v.sampling.top_p = f32(l.top_p);
  v.sampling.min_p = f32(l.min_p);
  v.sampling.top_k = i32(l.top_k);
  v.sampling.seed = reinterpret_cast<const uint64_t*>(base + l.seed);
  v.sampling.step = i32(l.step);
  v.repetition = f32(l.repetition);
  v.frequency = f32(l.frequency);
  v.presence = f32(l.presence);
  v.penalties = buf_.penalties.get<penalty_entry>();
  v.logprobs.count = i32(l.logprobs);
  v.logprobs.raw = buf_.raw_logits.get<float>();
  v.logprobs.lse = buf_.logits_lse.get<double>();
  v.logprobs.tokens = buf_.logprob_out.get<int32_t>();
  v.logprobs.values = reinterpret_cast<float*>(buf_.logprob_out.get<int32_t>()
                                               + size_t(max_batch_) * (1 + max_logprobs));
  return v;
}

attention_shape forward_pass::attention_of(int32_t layer_index) const {
  const auto& c = config_;
  attention_shape sh;
  sh.num_heads = c.num_heads;
  sh.kv_heads = c.num_kv_heads;
  sh.head_dim = c.head_dim;
  sh.window = c.is_sliding(layer_index) ? *c.sliding_window : 0;
  sh.scale = 1.0f / std::sqrt(float(c.head_dim));
  return sh;
}

prefill_split forward_pass::prefill_split_of(int32_t items, int32_t busy) const {
  prefill_split s;
  const int32_t heads = config_.num_heads;
  if (items <= 0 || busy <= 0 || active_kernels().prefill_attention == 1)
    return s;
  const int32_t blocks = busy * heads;
  // Two blocks of the kernel fit an SM: splits until the grid fills it.
  int32_t splits = (2 * num_sms_ + blocks - 1) / blocks;
  splits = std::min({splits, prefill_max_splits, prefill_split_parts / items});
  if (splits <= 1)
    return s;
  s.o = buf_.prefill_part_o.get<float>();
  s.ml = buf_.prefill_part_ml.get<float>();
  s.splits = splits;
  return s;
}

split_choice forward_pass::splits_of(int32_t m) const {
  const int mode = active_kernels().gemm_splits;
  if (mode == 1 || buf_.split_partials.bytes() == 0 || m > split_rows_)
    return {};
  split_choice r;
  if (mode == 3) {
    const auto& c = config_;
    auto pick = [](int32_t k) {
      return gemm_tuner::split_ok(k, 2) ? 2 : gemm_tuner::split_ok(k, 1) ? 1 : 0;
    };
    r = {pick(c.hidden_size), pick(c.q_size()), pick(c.intermediate_size)};
  } else if (auto it = splits_.find(m); it != splits_.end()) {
    r = it->second;
  }
  // qkv partials only reach the fused-RoPE attention, which the active
  // kernels may have turned off since the choice (METRONOME_KERNELS, tests).
  if (!decode_attention_fuses_rope(attention_of(0)))
    r.qkv = 0;
  // Under tensor parallelism o's and down's outputs are partial sums, which
  // must be all-reduced before the norm that would reduce their splits.
  if (comm_) {
    r.o = 0;
    r.down = 0;
  }
  return r;
}

bool forward_pass::prompt_pdl(int32_t rows) {
  // A 2,048-token prefill took 1-6% less time with PDL on the H200
  // (bench/results/h200-2026-12-01-r12.md); steps of decodes beside a chunk
  // of up to 128 tokens 7-15% more, captured or not (h200-2026-12-03-pdl.md).
  const pdl_mode mode = pdl_setting();
  return mode == pdl_mode::per_graph ? rows >= prompt_pdl_min_rows : mode != pdl_mode::off;
}

void forward_pass::gemm(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, void* y,
                        bool y_f32, float beta) {
  tuner_->run(x, m, w, n, k, y, y_f32, beta, stream_);
}

const bf16* forward_pass::dense(const bf16* w, const int4_weights& w4, int32_t n, int32_t k) {
  if (!w4)
    return w;
  launch_dequantize_int4(w4, n, k, buf_.dequant.get<bf16>(), stream_);
  return buf_.dequant.get<bf16>();
}

bool forward_pass::gemv_ok(int32_t n) const {
  if (n < 1 || n > gemv_max_m)
    return false;
  const auto& c = config_;
  const auto& L = weights_.layers().front();
  const struct {
    const int4_weights* w4;
    gemv_epilogue ep;
    int32_t k;
  } in[] = {{&L.qkv4, gemv_epilogue::qkv_rope, c.hidden_size},
            {&L.o4, gemv_epilogue::residual_add, c.q_size()},
            {&L.gate_up4, gemv_epilogue::swiglu, c.hidden_size},
            {&L.down4, gemv_epilogue::residual_add, c.intermediate_size}};
  for (const auto& p : in)
    if (*p.w4 && !gemv_int4_takes(p.ep, n, p.k))
      return false;
  return true;
}

// -- the passes ----------------------------------------------------------------------------

void forward_pass::skinny(gemv_epilogue ep, const gemv_args& a, const int4_weights* w4) {
  skinny_gemm_scratch sc;
  sc.partials = buf_.skinny_partials.get<float>();
  sc.partial_bytes = buf_.skinny_partials.bytes();
  sc.counter_data = buf_.skinny_counters.get<int32_t>();
  sc.counters = int32_t(buf_.skinny_counters.bytes() / 4);
  if (w4)
    launch_skinny_gemm_int4(ep, a, *w4, sc, stream_);
  else
    launch_skinny_gemm(ep, a, sc, stream_);
}

void forward_pass::attend(const attention_shape& sh, const kv_view& kv, const batch_view& batch,
                          int32_t seqs, bool raw_qkv, const bf16* qkv_bias, int32_t qkv_splits) {
  // A listed batch (balanced splits) launches with the list's stride; its
  // warps follow the splits it averages (one a sequence from 33 up).
  const int32_t splits = batch.work
                           ? decode_attention_work_splits()
                           : decode_attention_splits(sh, seqs, num_sms_, attn_blocks_per_sm_);
  const int32_t warps = decode_attention_warps(
    sh, seqs,
    batch.work ? std::max(1, (batch.work_items - seqs) / std::max(1, seqs)) : splits, num_sms_,
    attn_blocks_per_sm_);
  float* po = buf_.part_o.get<float>();
  float* pml = buf_.part_ml.get<float>();
  int32_t* counters = buf_.split_counters.get<int32_t>();
  if (raw_qkv && decode_attention_fuses_rope(sh)) {
    rope_input rope{buf_.qkv.get<bf16>(), qkv_bias, weights_.inv_freq()};
    if (qkv_splits > 0) {
      const auto& c = config_;
      rope.qkv = nullptr;
      rope.partials = buf_.split_partials.get<float>();
      rope.splits = qkv_splits;
      rope.split_stride = int64_t(batch.num_tokens) * (c.q_size() + 2 * c.kv_size());
    }
    launch_decode_attention_rope(sh, rope, kv, batch, splits, warps, po, pml, counters,
                                 buf_.attn.get<bf16>(), stream_);
    return;
  }
  if (qkv_splits > 0)
    throw cuda_error("cuda_engine: qkv partials need the fused-RoPE attention");
  if (raw_qkv)
    launch_rope_kv_write(buf_.qkv.get<bf16>(), qkv_bias, weights_.inv_freq(), batch, kv,
                         sh.num_heads, buf_.q.get<bf16>(), stream_);
  launch_decode_attention(sh, buf_.q.get<bf16>(), kv, batch, splits, warps, po, pml, counters,
                          buf_.attn.get<bf16>(), stream_);
}

void forward_pass::enqueue_decode(const step_layout& l, int32_t batch, decode_path path,
                                  int32_t penalties) {
  const auto& c = config_;
  const step_views sv = views(l);
  const int32_t h = c.hidden_size, q = c.q_size(), qkv = q + 2 * c.kv_size();
  const int32_t f = c.intermediate_size, v = c.vocab_size;
  const float eps = float(c.rms_norm_eps);
  float* x = buf_.x.get<float>();
  bf16* xn = buf_.xn.get<bf16>();
  const auto& layers = weights_.layers();
  const bool gemv = path == decode_path::gemv, tc = path == decode_path::skinny;
  // The GEMV normalises the residual in its prologue; the others take xn.
  auto input = [&](gemv_args& a, const bf16* norm) {
    if (gemv) {
      a.residual_in = x;
      a.norm_weight = norm;
      a.eps = eps;
    } else {
      launch_rms_norm(x, nullptr, norm, eps, batch, h, xn, stream_);
      a.x = xn;
    }
  };
  // 4-bit projections: the 4-bit GEMV and the skinny GEMM's 4-bit form
  // read them as they are; act-order ones reach the skinny GEMM as their
  // bf16 form (dense()).
  auto project = [&](gemv_epilogue ep, gemv_args a, const int4_weights& w4) {
    if (gemv && w4) {
      launch_gemv_int4(ep, a, w4, stream_);
    } else if (gemv) {
      launch_gemv(ep, a, stream_);
    } else if (w4 && skinny_gemm_int4_takes(w4, a.k)) {
      skinny(ep, a, &w4);
    } else {
      a.w = dense(a.w, w4, a.n, a.k);
      skinny(ep, a);
    }
  };
  clear_overflow();
  launch_page_updates(kv_.page_table(), kv_.page_stride(), sv.updates, sv.header, l.updates,
                      stream_);
  launch_embed(weights_.embed(), sv.ids, buf_.outputs.get<int32_t>(), batch, h, x, stream_);
  // The cuBLAS path: every layer's down projection ends by normalising the
  // residual for the next layer (or the LM head), so only the first layer
  // launches its norm.
  const split_choice rc = gemv || tc ? split_choice{} : splits_of(batch);
  if (!gemv && !tc)
    launch_rms_norm(x, nullptr, layers.front().attn_norm, eps, batch, h, xn, stream_);
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const layer_weights& L = layers[size_t(i)];
    const kv_view kv = layer_kv(i);
    const attention_shape sh = attention_of(i);
    if (gemv || tc) {
      gemv_args a;
      a.w = L.qkv;
      a.n = qkv;
      a.k = h;
      a.m = batch;
      input(a, L.attn_norm);
      a.bias = L.qkv_bias;
      a.out_bf16 = buf_.q.get<bf16>();
      a.inv_freq = weights_.inv_freq();
      a.batch = sv.batch;
      a.kv = kv;
      // The fp8 cache: the rotated k and v rows go to the stage, which the
      // attention quantises into the cache (kv_view::stage).
      if (kv_fp8_)
        a.kv.stage = buf_.kv_stage.get<float>();
      a.num_heads = c.num_heads;
      project(gemv_epilogue::qkv_rope, a, L.qkv4);
      attend(sh, a.kv, sv.batch, batch, false);
    } else {
      const bf16* w_qkv = dense(L.qkv, L.qkv4, qkv, h);
      if (rc.qkv > 0)
        tuner_->run_split(xn, batch, w_qkv, qkv, h, buf_.split_partials.get<float>(), rc.qkv,
                          stream_);
      else
        gemm(xn, batch, w_qkv, qkv, h, buf_.qkv.get(), false, 0.0f);
      attend(sh, kv, sv.batch, batch, true, L.qkv_bias, rc.qkv);
    }
    if (gemv || tc) {
      gemv_args a;
      a.w = L.o;
      a.n = h;
      a.k = q;
      a.m = batch;
      a.bias = L.o_bias;
      a.x = buf_.attn.get<bf16>();
      a.out_f32 = x;
      clear_partial(batch);
      project(gemv_epilogue::residual_add, a, L.o4);
      reduce_residual(batch);
      gemv_args g;
      g.w = L.gate_up;
      g.n = 2 * f;
      g.k = h;
      g.m = batch;
      input(g, L.mlp_norm);
      g.out_bf16 = buf_.act.get<bf16>();
      project(gemv_epilogue::swiglu, g, L.gate_up4);
      gemv_args d;
      d.w = L.down;
      d.n = h;
      d.k = f;
      d.m = batch;
      d.x = buf_.act.get<bf16>();
      d.out_f32 = x;
      clear_partial(batch);
      project(gemv_epilogue::residual_add, d, L.down4);
      reduce_residual(batch);
    } else {
      project_residual(buf_.attn.get<bf16>(), batch, dense(L.o, L.o4, h, q), q, L.o_bias, rc.o,
                       L.mlp_norm);
      gemm(xn, batch, dense(L.gate_up, L.gate_up4, 2 * f, h), 2 * f, h, buf_.gate_up.get(),
           false, 0.0f);
      launch_swiglu(buf_.gate_up.get<bf16>(), batch, f, buf_.act.get<bf16>(), stream_);
      const bool last = i + 1 == c.num_layers;
      project_residual(buf_.act.get<bf16>(), batch, dense(L.down, L.down4, h, f), f, nullptr,
                       rc.down, last ? weights_.final_norm() : layers[size_t(i) + 1].attn_norm);
    }
  }
  if (gemv || tc) {
    gemv_args a;
    a.w = weights_.lm_head();
    a.n = v;
    a.k = h;
    a.m = batch;
    input(a, weights_.final_norm());
    a.out_f32 = buf_.logits.get<float>();
    project(gemv_epilogue::store_f32, a, int4_weights{});
  } else {
    gemm(xn, batch, weights_.lm_head(), v, h, buf_.logits.get(), true, 0.0f);
  }
  enqueue_sampling(l, batch, penalties);
}

kv_view forward_pass::layer_kv(int32_t layer) const {
  kv_view kv = kv_.view(layer);
  if (kv.e5m2) {
    kv.overflow =
      reinterpret_cast<uint32_t*>(buf_.outputs.get<unsigned char>() + size_t(max_batch_) * 8);
    kv.e5m2_rows = buf_.kv_e5m2_rows.get<float>();
  }
  return kv;
}

void forward_pass::clear_overflow() {
  if (kv_.e5m2())
    METRONOME_CUDA(cudaMemsetAsync(buf_.outputs.get<unsigned char>() + size_t(max_batch_) * 8,
                                   0, size_t(max_batch_) * 8, stream_));
}

void forward_pass::clear_partial(int32_t rows) {
  if (comm_ && comm_->rank() != 0 && comm_->live())
    METRONOME_CUDA(cudaMemsetAsync(buf_.x.get(), 0,
                                   size_t(rows) * size_t(config_.hidden_size) * 4, stream_));
}

void forward_pass::reduce_residual(int32_t rows) {
  if (comm_)
    comm_->all_reduce_sum(buf_.x.get<float>(), size_t(rows) * size_t(config_.hidden_size),
                          stream_);
}

void forward_pass::project_residual(const bf16* in_x, int32_t m, const bf16* w, int32_t k,
                                    const bf16* bias, int32_t splits, const bf16* norm) {
  const auto& c = config_;
  const int32_t h = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  float* x = buf_.x.get<float>();
  if (comm_) {
    if (splits > 0)
      throw cuda_error("cuda_engine: split-K projections under tensor parallelism");
    // Rank 0 adds into the residual; the others into a cleared x (beta
    // stays 1: the algorithm the tuner chose for this shape).
    clear_partial(m);
    gemm(in_x, m, w, h, k, x, true, 1.0f);
    if (bias)
      launch_add_bias(x, bias, m, h, stream_);
    reduce_residual(m);
    launch_rms_norm(x, nullptr, norm, eps, m, h, buf_.xn.get<bf16>(), stream_);
    return;
  }
  if (splits > 0) {
    float* partials = buf_.split_partials.get<float>();
    tuner_->run_split(in_x, m, w, h, k, partials, splits, stream_);
    launch_residual_rms_norm(partials, splits, bias, x, norm, eps, m, h, buf_.xn.get<bf16>(),
                             stream_);
    return;
  }
  gemm(in_x, m, w, h, k, x, true, 1.0f);
  if (bias)
    launch_add_bias(x, bias, m, h, stream_);
  launch_rms_norm(x, nullptr, norm, eps, m, h, buf_.xn.get<bf16>(), stream_);
}

void forward_pass::enqueue_general(const step_layout& l, int32_t sampled, bool all_single,
                                   int32_t penalties) {
  const auto& c = config_;
  const step_views sv = views(l);
  const int32_t t = l.tokens;
  const int32_t h = c.hidden_size, q = c.q_size(), qkv = q + 2 * c.kv_size();
  const int32_t f = c.intermediate_size, v = c.vocab_size;
  const float eps = float(c.rms_norm_eps);
  float* x = buf_.x.get<float>();
  bf16* xn = buf_.xn.get<bf16>();
  const auto& layers = weights_.layers();
  clear_overflow();
  launch_page_updates(kv_.page_table(), kv_.page_stride(), sv.updates, sv.header, l.updates,
                      stream_);
  launch_embed(weights_.embed(), sv.ids, buf_.outputs.get<int32_t>(), t, h, x, stream_);
  // As the cuBLAS decode path: o and down end by adding into the residual
  // and normalising it for the next projection, as split-K partials reduced
  // in that norm where the tuner chose so for t rows (the mixed graphs'
  // sizes; other sizes run whole). The last down projection stays whole:
  // the LM head normalises only the sampled rows.
  const split_choice rc = splits_of(t);
  launch_rms_norm(x, nullptr, layers.front().attn_norm, eps, t, h, xn, stream_);
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const layer_weights& L = layers[size_t(i)];
    const kv_view kv = layer_kv(i);
    const attention_shape sh = attention_of(i);
    gemm(xn, t, dense(L.qkv, L.qkv4, qkv, h), qkv, h, buf_.qkv.get(), false, 0.0f);
    if (all_single) {
      attend(sh, kv, sv.batch, l.seqs, true, L.qkv_bias);
    } else {
      // Prompt chunks attend in the prefill kernel, tiles of query rows;
      // one-token chunks (the decodes sharing the step) in the decode
      // kernel, split over their keys: in the prefill kernel each would
      // fill a whole tile and read its context without a split.
      launch_rope_kv_write(buf_.qkv.get<bf16>(), L.qkv_bias, weights_.inv_freq(), sv.batch, kv,
                           c.num_heads, buf_.q.get<bf16>(), stream_);
      if (l.items > 0)
        launch_prefill_attention(sh, buf_.q.get<bf16>(), kv, sv.batch, sv.items, l.items,
                                 buf_.attn.get<bf16>(), stream_,
                                 prefill_split_of(l.items, l.busy_items));
      if (l.singles > 0)
        attend(sh, kv, sv.singles, l.singles, false, nullptr);
    }
    project_residual(buf_.attn.get<bf16>(), t, dense(L.o, L.o4, h, q), q, L.o_bias, rc.o,
                     L.mlp_norm);
    gemm(xn, t, dense(L.gate_up, L.gate_up4, 2 * f, h), 2 * f, h, buf_.gate_up.get(), false,
         0.0f);
    launch_swiglu(buf_.gate_up.get<bf16>(), t, f, buf_.act.get<bf16>(), stream_);
    if (i + 1 < c.num_layers)
      project_residual(buf_.act.get<bf16>(), t, dense(L.down, L.down4, h, f), f, nullptr,
                       rc.down, layers[size_t(i) + 1].attn_norm);
    else {
      clear_partial(t);
      gemm(buf_.act.get<bf16>(), t, dense(L.down, L.down4, h, f), h, f, x, true, 1.0f);
      reduce_residual(t);
    }
  }
  if (sampled > 0) {
    // LM head on the last position of each sampled sequence only.
    launch_rms_norm(x, sv.sample_src, weights_.final_norm(), eps, sampled, h, xn, stream_);
    gemm(xn, sampled, weights_.lm_head(), v, h, buf_.logits.get(), true, 0.0f);
    enqueue_sampling(l, sampled, penalties);
  }
}

void forward_pass::enqueue_sampling(const step_layout& l, int32_t rows, int32_t penalties) {
  const auto& c = config_;
  const step_views sv = views(l);
  if (enqueue_logprobs_)
    launch_model_logprobs(buf_.logits.get<float>(), rows, c.vocab_size, sv.logprobs, stream_);
  if (penalties > 0)
    launch_penalties(buf_.logits.get<float>(), c.vocab_size, sv.penalties, sv.header + 1,
                     penalties, sv.repetition, sv.frequency, sv.presence, stream_);
  auto* out = buf_.outputs.get<unsigned char>();
  launch_sample(buf_.logits.get<float>(), rows, c.vocab_size, sv.sampling,
                reinterpret_cast<int32_t*>(out),
                reinterpret_cast<float*>(out + size_t(max_batch_) * 4), buf_.sample_ws.get(),
                stream_, enqueue_logprobs_ ? &sv.logprobs : nullptr);
  // Tensor parallelism: every rank's logits are the same up to the rounding
  // of its own kernel choices, so rank 0's ids are the group's; the others
  // feed them to their next step and report them.
  if (comm_)
    comm_->broadcast_from_first(reinterpret_cast<int32_t*>(out), size_t(rows), stream_);
}

} // namespace metronome::gpu
