// One step of the CUDA engine: packing the inputs, the decode and general
// forward passes, sampling, and the bounded wait for the ids.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "gpu/cuda_engine.hpp"

namespace metronome::gpu {

namespace {

constexpr size_t align16(size_t v) {
  return (v + 15) / 16 * 16;
}

int32_t updates_capacity(int32_t batch) {
  return 4 * batch + 16;
}

} // namespace

// -- the input block -----------------------------------------------------------------------

cuda_engine::layout cuda_engine::make_layout(int32_t tokens, int32_t seqs, int32_t updates,
                                             int32_t penalties, int32_t items,
                                             int32_t singles) const {
  layout l;
  l.singles = singles;
  l.tokens = tokens;
  l.seqs = seqs;
  l.updates = updates;
  l.penalties = penalties;
  l.items = items;
  l.busy_items = items;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    off = align16(off);
    const size_t at = off;
    off += bytes;
    return at;
  };
  const size_t t = size_t(tokens), b = size_t(seqs);
  l.header = take(16);
  l.ids = take(t * 4);
  l.positions = take(t * 4);
  l.token_seq = take(t * 4);
  l.seq_slot = take(b * 4);
  l.seq_q_start = take((b + 1) * 4);
  l.seq_len = take(b * 4);
  l.sample_src = take(b * 4);
  l.temperature = take(b * 4);
  l.top_p = take(b * 4);
  l.min_p = take(b * 4);
  l.top_k = take(b * 4);
  l.seed = take(b * 8);
  l.step = take(b * 4);
  l.repetition = take(b * 4);
  l.frequency = take(b * 4);
  l.presence = take(b * 4);
  l.logprobs = take(b * 4);
  l.update_data = take(size_t(updates) * 12);
  l.item_data = take(size_t(items) * sizeof(prefill_item));
  const size_t s = size_t(singles);
  l.single_slot = take(s * 4);
  l.single_q_start = take(s * 4);
  l.single_len = take(s * 4);
  // Work lists where the decode attention reads them: over a decode step's
  // batch (every row one token), and over a prompt step's singles.
  const attention_shape sh = attention_of(0);
  if (tokens == seqs && singles == 0 && items == 0)
    l.work_items = decode_attention_work_items(sh, seqs, num_sms_, attn_blocks_per_sm_);
  l.single_work_items = decode_attention_work_items(sh, singles, num_sms_, attn_blocks_per_sm_);
  l.work = take(size_t(l.work_items) * 4);
  l.single_work = take(size_t(l.single_work_items) * 4);
  l.bytes = align16(off);
  return l;
}

cuda_engine::step_views cuda_engine::views(const layout& l) const {
  auto* base = inputs_.get<unsigned char>();
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
  v.penalties = penalties_dev_.get<penalty_entry>();
  v.logprobs.count = i32(l.logprobs);
  v.logprobs.raw = raw_logits_.get<float>();
  v.logprobs.lse = logits_lse_.get<double>();
  v.logprobs.tokens = logprob_out_.get<int32_t>();
  v.logprobs.values =
    reinterpret_cast<float*>(logprob_out_.get<int32_t>() + size_t(max_batch_) * (1 + max_logprobs));
  return v;
}

void cuda_engine::pack(int32_t slot, const layout& l, std::span<const engine_chunk> chunks,
                       std::span<const page_update> updates, std::span<const prefill_item> items,
                       int32_t num_penalties, bool mixed) {
  auto* base = staging_[slot].get<unsigned char>();
  auto i32 = [&](size_t off) { return reinterpret_cast<int32_t*>(base + off); };
  auto f32 = [&](size_t off) { return reinterpret_cast<float*>(base + off); };
  int32_t* header = i32(l.header);
  header[0] = int32_t(updates.size());
  header[1] = num_penalties;
  int32_t* ids = i32(l.ids);
  int32_t* positions = i32(l.positions);
  int32_t* token_seq = i32(l.token_seq);
  int32_t* seq_slot = i32(l.seq_slot);
  int32_t* q_start = i32(l.seq_q_start);
  int32_t* seq_len = i32(l.seq_len);
  int32_t* sample_src = i32(l.sample_src);
  float* temperature = f32(l.temperature);
  float* top_p = f32(l.top_p);
  float* min_p = f32(l.min_p);
  int32_t* top_k = i32(l.top_k);
  auto* seed = reinterpret_cast<uint64_t*>(base + l.seed);
  int32_t* step = i32(l.step);
  float* repetition = f32(l.repetition);
  float* frequency = f32(l.frequency);
  float* presence = f32(l.presence);
  int32_t* logprobs = i32(l.logprobs);

  int32_t* single_slot = i32(l.single_slot);
  int32_t* single_q_start = i32(l.single_q_start);
  int32_t* single_len = i32(l.single_len);

  int32_t row = 0, sampled = 0, single = 0;
  // A greedy sampling row that nobody reads, for padding.
  auto pad_sample = [&](int32_t src) {
    const int32_t r = sampled++;
    sample_src[r] = src;
    temperature[r] = 0.0f;
    top_p[r] = 1.0f;
    min_p[r] = 0.0f;
    top_k[r] = 0;
    seed[r] = 0;
    step[r] = 0;
    repetition[r] = 1.0f;
    frequency[r] = 0.0f;
    presence[r] = 0.0f;
    logprobs[r] = -1;
  };
  const int32_t real = mixed ? int32_t(chunks.size()) : l.seqs;
  for (int32_t c = 0; c < real; ++c) {
    q_start[c] = row;
    if (size_t(c) < chunks.size()) {
      const auto& ch = chunks[size_t(c)];
      const int32_t n = int32_t(ch.tokens.size());
      if (n == 1 && single < l.singles) {
        single_slot[single] = ch.slot;
        single_q_start[single] = row;
        single_len[single] = ch.start_pos + 1;
        ++single;
      }
      for (int32_t i = 0; i < n; ++i, ++row) {
        const int32_t token = ch.tokens[size_t(i)];
        // A fed token: -1 - its row in the previous step's sampled ids,
        // which the embedding gather reads on the device.
        ids[row] = token >= 0 ? token : -1 - ch.fed_row;
        positions[row] = ch.start_pos + i;
        token_seq[row] = c;
      }
      seq_slot[c] = ch.slot;
      seq_len[c] = ch.start_pos + n;
      if (ch.sample) {
        const int32_t r = sampled++;
        sample_src[r] = row - 1;
        temperature[r] = ch.temperature;
        top_p[r] = ch.top_p;
        min_p[r] = ch.min_p;
        top_k[r] = ch.top_k;
        seed[r] = ch.seed;
        step[r] = ch.sample_step;
        repetition[r] = ch.repetition_penalty;
        frequency[r] = ch.frequency_penalty;
        presence[r] = ch.presence_penalty;
        logprobs[r] = ch.logprobs;
      }
    } else {
      // A padding row: token 0 at position 0 of the scratch slot, greedy.
      ids[row] = 0;
      positions[row] = 0;
      token_seq[row] = c;
      ++row;
      seq_slot[c] = max_seqs_;
      seq_len[c] = 1;
      pad_sample(row - 1);
    }
  }
  if (mixed) {
    // Padding of a mixed graph (mixed_layout): one-token rows in the
    // scratch slot up to its decode attention's count, empty prompt chunks,
    // then the prompt rows left in one sequence of the scratch slot (their
    // keys all go to its scratch row; no item reads them), and greedy
    // sampling rows up to its LM head's.
    int32_t c = real;
    for (; single < l.singles; ++single, ++c, ++row) {
      q_start[c] = row;
      ids[row] = 0;
      positions[row] = 0;
      token_seq[row] = c;
      seq_slot[c] = max_seqs_;
      seq_len[c] = 1;
      single_slot[single] = max_seqs_;
      single_q_start[single] = row;
      single_len[single] = 1;
      pad_sample(row);
    }
    for (; c < l.seqs - 1; ++c) {
      q_start[c] = row;
      seq_slot[c] = max_seqs_;
      seq_len[c] = 0;
    }
    q_start[c] = row;
    seq_slot[c] = max_seqs_;
    seq_len[c] = 1;
    for (; row < l.tokens; ++row) {
      ids[row] = 0;
      positions[row] = 0;
      token_seq[row] = c;
    }
    while (sampled < l.seqs - 1)
      pad_sample(0);
  }
  q_start[l.seqs] = row;
  int32_t* upd = i32(l.update_data);
  for (size_t i = 0; i < updates.size(); ++i) {
    upd[3 * i] = updates[i].slot;
    upd[3 * i + 1] = updates[i].index;
    upd[3 * i + 2] = updates[i].page;
  }
  if (l.work_items > 0 || l.single_work_items > 0) {
    const attention_shape sh = attention_of(0);
    if (l.work_items > 0)
      decode_attention_work(sh, seq_len, l.seqs, num_sms_, attn_blocks_per_sm_, i32(l.work),
                            l.work_items);
    if (l.single_work_items > 0)
      decode_attention_work(sh, i32(l.single_len), l.singles, num_sms_, attn_blocks_per_sm_,
                            i32(l.single_work), l.single_work_items);
  }
  if (!items.empty())
    std::memcpy(base + l.item_data, items.data(), items.size() * sizeof(prefill_item));
  if (mixed) {
    auto* it = reinterpret_cast<prefill_item*>(base + l.item_data);
    for (size_t i = items.size(); i < size_t(l.items); ++i)
      it[i] = prefill_item{-1, 0};
  }
}

void cuda_engine::fill_pad_inputs(int32_t batch) {
  const layout l = make_layout(batch, batch, updates_capacity(batch), 0, 0);
  for (int32_t slot = 0; slot < 2; ++slot)
    pack(slot, l, {}, {}, {}, 0);
}

// -- views of the model ------------------------------------------------------------------

kv_view cuda_engine::kv_of(int32_t layer_index) const {
  const auto& c = model_->config;
  kv_view kv;
  auto* base = kv_pool_.get<unsigned char>() + size_t(layer_index) * kv_layer_bytes_;
  if (kv_fp8_) {
    // [K bytes][V bytes][K scales][V scales] of the pool's rows (its pages,
    // the padding page included, x page_size x kv heads).
    const size_t rows =
      size_t(num_pages_ + 1) * size_t(options_.limits.page_size) * size_t(c.num_kv_heads);
    kv.k8 = base;
    kv.v8 = base + rows * size_t(c.head_dim);
    kv.k_scale = reinterpret_cast<float*>(base + 2 * rows * size_t(c.head_dim));
    kv.v_scale = kv.k_scale + rows;
  } else {
    kv.k = reinterpret_cast<bf16*>(base);
    kv.v = reinterpret_cast<bf16*>(base + kv_layer_bytes_ / 2);
  }
  kv.page_table = page_table_.get<int32_t>();
  kv.page_table_stride = page_stride_;
  kv.page_size = options_.limits.page_size;
  kv.kv_heads = c.num_kv_heads;
  kv.head_dim = c.head_dim;
  return kv;
}

attention_shape cuda_engine::attention_of(int32_t layer_index) const {
  const auto& c = model_->config;
  attention_shape sh;
  sh.num_heads = c.num_heads;
  sh.kv_heads = c.num_kv_heads;
  sh.head_dim = c.head_dim;
  sh.window = c.is_sliding(layer_index) ? *c.sliding_window : 0;
  sh.scale = 1.0f / std::sqrt(float(c.head_dim));
  return sh;
}

void cuda_engine::gemm(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, void* y,
                       bool y_f32, float beta) {
  tuner_->run(x, m, w, n, k, y, y_f32, beta, stream_);
}

// -- forward passes ----------------------------------------------------------------------

void cuda_engine::skinny(gemv_epilogue ep, const gemv_args& a) {
  skinny_gemm_scratch sc;
  sc.partials = skinny_partials_.get<float>();
  sc.partial_bytes = skinny_partials_.bytes();
  sc.counter_data = skinny_counters_.get<int32_t>();
  sc.counters = int32_t(skinny_counters_.bytes() / 4);
  launch_skinny_gemm(ep, a, sc, stream_);
}

void cuda_engine::attend(const attention_shape& sh, const kv_view& kv, const batch_view& batch,
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
  float* po = part_o_.get<float>();
  float* pml = part_ml_.get<float>();
  int32_t* counters = split_counters_.get<int32_t>();
  if (raw_qkv && decode_attention_fuses_rope(sh)) {
    rope_input rope{qkv_.get<bf16>(), qkv_bias, inv_freq_.get<float>()};
    if (qkv_splits > 0) {
      const auto& c = model_->config;
      rope.qkv = nullptr;
      rope.partials = split_partials_.get<float>();
      rope.splits = qkv_splits;
      rope.split_stride = int64_t(batch.num_tokens) * (c.q_size() + 2 * c.kv_size());
    }
    launch_decode_attention_rope(sh, rope, kv, batch, splits, warps, po, pml, counters,
                                 attn_.get<bf16>(), stream_);
    return;
  }
  if (qkv_splits > 0)
    throw cuda_error("cuda_engine: qkv partials need the fused-RoPE attention");
  if (raw_qkv)
    launch_rope_kv_write(qkv_.get<bf16>(), qkv_bias, inv_freq_.get<float>(), batch, kv,
                         sh.num_heads, q_.get<bf16>(), stream_);
  launch_decode_attention(sh, q_.get<bf16>(), kv, batch, splits, warps, po, pml, counters,
                          attn_.get<bf16>(), stream_);
}

void cuda_engine::enqueue_decode(const layout& l, int32_t batch, decode_path path,
                                 int32_t penalties) {
  const auto& c = model_->config;
  const step_views sv = views(l);
  const int32_t h = c.hidden_size, q = c.q_size(), qkv = q + 2 * c.kv_size();
  const int32_t f = c.intermediate_size, v = c.vocab_size;
  const float eps = float(c.rms_norm_eps);
  float* x = x_.get<float>();
  bf16* xn = xn_.get<bf16>();
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
  auto project = [&](gemv_epilogue ep, const gemv_args& a) {
    if (gemv)
      launch_gemv(ep, a, stream_);
    else
      skinny(ep, a);
  };
  launch_page_updates(page_table_.get<int32_t>(), page_stride_, sv.updates, sv.header, l.updates,
                      stream_);
  launch_embed(embed_, sv.ids, outputs_.get<int32_t>(), batch, h, x, stream_);
  // The cuBLAS path: every layer's down projection ends by normalising the
  // residual for the next layer (or the LM head), so only the first layer
  // launches its norm.
  const split_choice rc = gemv || tc ? split_choice{} : splits_of(batch);
  if (!gemv && !tc)
    launch_rms_norm(x, nullptr, layers_.front().attn_norm, eps, batch, h, xn, stream_);
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const layer& L = layers_[size_t(i)];
    const kv_view kv = kv_of(i);
    const attention_shape sh = attention_of(i);
    if (gemv || tc) {
      gemv_args a;
      a.w = L.qkv;
      a.n = qkv;
      a.k = h;
      a.m = batch;
      input(a, L.attn_norm);
      a.bias = L.qkv_bias;
      a.out_bf16 = q_.get<bf16>();
      a.inv_freq = inv_freq_.get<float>();
      a.batch = sv.batch;
      a.kv = kv;
      // The fp8 cache: the rotated k and v rows go to the stage, which the
      // attention quantises into the cache (kv_view::stage).
      if (kv_fp8_)
        a.kv.stage = kv_stage_.get<float>();
      a.num_heads = c.num_heads;
      project(gemv_epilogue::qkv_rope, a);
      attend(sh, a.kv, sv.batch, batch, false);
    } else {
      if (rc.qkv > 0)
        tuner_->run_split(xn, batch, L.qkv, qkv, h, split_partials_.get<float>(), rc.qkv, stream_);
      else
        gemm(xn, batch, L.qkv, qkv, h, qkv_.get(), false, 0.0f);
      attend(sh, kv, sv.batch, batch, true, L.qkv_bias, rc.qkv);
    }
    if (gemv || tc) {
      gemv_args a;
      a.w = L.o;
      a.n = h;
      a.k = q;
      a.m = batch;
      a.bias = L.o_bias;
      a.x = attn_.get<bf16>();
      a.out_f32 = x;
      project(gemv_epilogue::residual_add, a);
      gemv_args g;
      g.w = L.gate_up;
      g.n = 2 * f;
      g.k = h;
      g.m = batch;
      input(g, L.mlp_norm);
      g.out_bf16 = act_.get<bf16>();
      project(gemv_epilogue::swiglu, g);
      gemv_args d;
      d.w = L.down;
      d.n = h;
      d.k = f;
      d.m = batch;
      d.x = act_.get<bf16>();
      d.out_f32 = x;
      project(gemv_epilogue::residual_add, d);
    } else {
      project_residual(attn_.get<bf16>(), batch, L.o, q, L.o_bias, rc.o, L.mlp_norm);
      gemm(xn, batch, L.gate_up, 2 * f, h, gate_up_.get(), false, 0.0f);
      launch_swiglu(gate_up_.get<bf16>(), batch, f, act_.get<bf16>(), stream_);
      const bool last = i + 1 == c.num_layers;
      project_residual(act_.get<bf16>(), batch, L.down, f, nullptr, rc.down,
                       last ? final_norm_ : layers_[size_t(i) + 1].attn_norm);
    }
  }
  if (gemv || tc) {
    gemv_args a;
    a.w = lm_head_;
    a.n = v;
    a.k = h;
    a.m = batch;
    input(a, final_norm_);
    a.out_f32 = logits_.get<float>();
    project(gemv_epilogue::store_f32, a);
  } else {
    gemm(xn, batch, lm_head_, v, h, logits_.get(), true, 0.0f);
  }
  enqueue_sampling(l, batch, penalties);
}

void cuda_engine::project_residual(const bf16* in_x, int32_t m, const bf16* w, int32_t k,
                                   const bf16* bias, int32_t splits, const bf16* norm) {
  const auto& c = model_->config;
  const int32_t h = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  float* x = x_.get<float>();
  if (splits > 0) {
    float* partials = split_partials_.get<float>();
    tuner_->run_split(in_x, m, w, h, k, partials, splits, stream_);
    launch_residual_rms_norm(partials, splits, bias, x, norm, eps, m, h, xn_.get<bf16>(), stream_);
    return;
  }
  gemm(in_x, m, w, h, k, x, true, 1.0f);
  if (bias)
    launch_add_bias(x, bias, m, h, stream_);
  launch_rms_norm(x, nullptr, norm, eps, m, h, xn_.get<bf16>(), stream_);
}

void cuda_engine::enqueue_general(const layout& l, int32_t sampled, bool all_single,
                                  int32_t penalties) {
  const auto& c = model_->config;
  const step_views sv = views(l);
  const int32_t t = l.tokens;
  const int32_t h = c.hidden_size, q = c.q_size(), qkv = q + 2 * c.kv_size();
  const int32_t f = c.intermediate_size, v = c.vocab_size;
  const float eps = float(c.rms_norm_eps);
  float* x = x_.get<float>();
  bf16* xn = xn_.get<bf16>();
  launch_page_updates(page_table_.get<int32_t>(), page_stride_, sv.updates, sv.header, l.updates,
                      stream_);
  launch_embed(embed_, sv.ids, outputs_.get<int32_t>(), t, h, x, stream_);
  // As the cuBLAS decode path: o and down end by adding into the residual
  // and normalising it for the next projection, as split-K partials reduced
  // in that norm where the tuner chose so for t rows (the mixed graphs'
  // sizes; other sizes run whole). The last down projection stays whole:
  // the LM head normalises only the sampled rows.
  const split_choice rc = splits_of(t);
  launch_rms_norm(x, nullptr, layers_.front().attn_norm, eps, t, h, xn, stream_);
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const layer& L = layers_[size_t(i)];
    const kv_view kv = kv_of(i);
    const attention_shape sh = attention_of(i);
    gemm(xn, t, L.qkv, qkv, h, qkv_.get(), false, 0.0f);
    if (all_single) {
      attend(sh, kv, sv.batch, l.seqs, true, L.qkv_bias);
    } else {
      // Prompt chunks attend in the prefill kernel, tiles of query rows;
      // one-token chunks (the decodes sharing the step) in the decode
      // kernel, split over their keys: in the prefill kernel each would
      // fill a whole tile and read its context without a split.
      launch_rope_kv_write(qkv_.get<bf16>(), L.qkv_bias, inv_freq_.get<float>(), sv.batch, kv,
                           c.num_heads, q_.get<bf16>(), stream_);
      if (l.items > 0)
        launch_prefill_attention(sh, q_.get<bf16>(), kv, sv.batch, sv.items, l.items,
                                 attn_.get<bf16>(), stream_,
                                 prefill_split_of(l.items, l.busy_items));
      if (l.singles > 0)
        attend(sh, kv, sv.singles, l.singles, false, nullptr);
    }
    project_residual(attn_.get<bf16>(), t, L.o, q, L.o_bias, rc.o, L.mlp_norm);
    gemm(xn, t, L.gate_up, 2 * f, h, gate_up_.get(), false, 0.0f);
    launch_swiglu(gate_up_.get<bf16>(), t, f, act_.get<bf16>(), stream_);
    if (i + 1 < c.num_layers)
      project_residual(act_.get<bf16>(), t, L.down, f, nullptr, rc.down,
                       layers_[size_t(i) + 1].attn_norm);
    else
      gemm(act_.get<bf16>(), t, L.down, h, f, x, true, 1.0f);
  }
  if (sampled > 0) {
    // LM head on the last position of each sampled sequence only.
    launch_rms_norm(x, sv.sample_src, final_norm_, eps, sampled, h, xn, stream_);
    gemm(xn, sampled, lm_head_, v, h, logits_.get(), true, 0.0f);
    enqueue_sampling(l, sampled, penalties);
  }
}

void cuda_engine::enqueue_sampling(const layout& l, int32_t rows, int32_t penalties) {
  const auto& c = model_->config;
  const step_views sv = views(l);
  if (enqueue_logprobs_)
    launch_model_logprobs(logits_.get<float>(), rows, c.vocab_size, sv.logprobs, stream_);
  if (penalties > 0)
    launch_penalties(logits_.get<float>(), c.vocab_size, sv.penalties, sv.header + 1, penalties,
                     sv.repetition, sv.frequency, sv.presence, stream_);
  auto* out = outputs_.get<unsigned char>();
  launch_sample(logits_.get<float>(), rows, c.vocab_size, sv.sampling,
                reinterpret_cast<int32_t*>(out),
                reinterpret_cast<float*>(out + size_t(max_batch_) * 4), sample_ws_.get(),
                stream_, enqueue_logprobs_ ? &sv.logprobs : nullptr);
}

// -- a step ------------------------------------------------------------------------------

engine_result cuda_engine::run(std::span<const engine_chunk> chunks,
                               std::span<const page_update> updates) {
  require_idle("a synchronous step");
  launch(chunks, updates);
  if (flight_.empty())
    return {};
  return finish();
}

void cuda_engine::launch(std::span<const engine_chunk> chunks,
                         std::span<const page_update> updates) {
  const int32_t n = int32_t(chunks.size());
  int64_t tokens = 0;
  int32_t sampled = 0, penalties = 0;
  bool all_single = true, fed_unknown = false, any_logprobs = false;
  // Fed tokens (negative ids) come from the step launched last, still in
  // flight, at the chunk's fed_row of its sampled ids.
  const int32_t fed_rows = flight_.empty() ? 0 : flight_.back().sampled;
  for (const auto& ch : chunks) {
    tokens += int64_t(ch.tokens.size());
    all_single = all_single && ch.tokens.size() == 1;
    for (auto t : ch.tokens)
      fed_unknown = fed_unknown || (t < 0 && (ch.fed_row < 0 || ch.fed_row >= fed_rows));
    if (ch.sample) {
      ++sampled;
      penalties += int32_t(ch.penalties.size());
      any_logprobs = any_logprobs || ch.logprobs >= 0;
    }
  }
  if (n > max_batch_)
    throw std::invalid_argument("cuda runner: " + std::to_string(n)
                                + " sequences in one step exceed max_batch_size "
                                + std::to_string(max_batch_));
  if (tokens > max_tokens_)
    throw std::invalid_argument("cuda runner: " + std::to_string(tokens)
                                + " tokens in one step exceed max_num_batched_tokens "
                                + std::to_string(max_tokens_));
  if (int64_t(updates.size()) > update_capacity_ && !flight_.empty())
    throw std::logic_error("cuda runner: a step with " + std::to_string(updates.size())
                           + " new pages (more than its block holds) launched behind another");
  if (flight_.size() >= 2)
    throw std::logic_error("cuda runner: a third step launched while two are in flight");
  if (penalties > 0 && !flight_.empty())
    throw std::logic_error("cuda runner: a step with penalties launched behind another");
  if (fed_unknown)
    throw std::logic_error("cuda runner: a fed token without its row in the step in flight");
  if (n == 0 && updates.empty())
    return;
  const int32_t slot = next_slot_;
  METRONOME_CUDA(cudaEventRecord(step_start_[slot], stream_));
  if (fault_armed_) {
    fault_armed_ = false;
    launch_invalid_read(stream_);
  }
  // More page-table entries than a step's block holds (a long cached prefix
  // shared at admission): applied first, from a block of their own.
  if (int64_t(updates.size()) > update_capacity_) {
    apply_page_updates(updates);
    updates = {};
  }

  // Penalty entries travel in their own block (rare; grown on demand; only
  // with no other step in flight, checked above).
  if (penalties > 0) {
    const size_t bytes = size_t(penalties) * sizeof(penalty_entry);
    if (penalties_pinned_.bytes() < bytes) {
      penalties_pinned_ = pinned_buffer(bytes * 2);
      penalties_dev_ = device_buffer(bytes * 2);
    }
    auto* e = penalties_pinned_.get<penalty_entry>();
    int32_t row = 0;
    for (const auto& ch : chunks) {
      if (!ch.sample)
        continue;
      for (auto p : ch.penalties) {
        p.row = row;
        *e++ = p;
      }
      ++row;
    }
  }

  const bool all_sampled = sampled == n;
  const bool decode = all_single && all_sampled && n > 0;
  int32_t gi = -1;
  if (graphs_enabled_ && decode && penalties == 0) {
    gi = graph_index(n);
    if (gi >= 0 && int64_t(updates.size()) > updates_capacity(graphs_[size_t(gi)].size))
      gi = -1;
  }
  flight f;
  f.slot = slot;
  f.sampled = sampled;
  f.launched = std::chrono::steady_clock::now();
  if (any_logprobs)
    for (const auto& ch : chunks)
      if (ch.sample)
        f.logprobs.push_back(ch.logprobs);
  if (gi >= 0) {
    const int32_t b = graphs_[size_t(gi)].size;
    const layout l = make_layout(b, b, updates_capacity(b), 0, 0);
    pack(slot, l, chunks, updates, {}, 0);
    METRONOME_CUDA(cudaGraphLaunch(graphs_[size_t(gi)].exec[slot].get(), stream_));
    last_graph_ = gi;
  } else {
    last_graph_ = -1;
    items_.clear();
    const int32_t tile = prefill_tile_rows();
    int32_t singles = 0;
    if (!all_single) {
      for (int32_t c = 0; c < n; ++c) {
        const int32_t len = int32_t(chunks[size_t(c)].tokens.size());
        if (len == 1) {
          ++singles; // the decode attention's (see enqueue_general)
          continue;
        }
        for (int32_t r = 0; r < len; r += tile)
          items_.push_back({c, r});
      }
      // Longest first: the tile's last key position decides its work.
      std::stable_sort(items_.begin(), items_.end(), [&](const auto& a, const auto& b) {
        auto end = [&](const prefill_item& it) {
          const auto& ch = chunks[size_t(it.seq)];
          return ch.start_pos + std::min<int32_t>(it.row + tile, int32_t(ch.tokens.size()));
        };
        return end(a) > end(b);
      });
    }
    // A step with prompt chunks small enough for a mixed graph replays it.
    const int32_t mi = !decode && !all_single && penalties == 0 && graphs_enabled_
                           && mixed_enabled_
                         ? mixed_index(singles, n - singles, int32_t(tokens) - singles,
                                       int32_t(updates.size()))
                         : -1;
    if (mi >= 0) {
      const mixed_graph& m = mixed_graphs_[size_t(mi)];
      pack(slot, mixed_layout(m.singles, m.prompt), chunks, updates, items_, 0, true);
      METRONOME_CUDA(cudaGraphLaunch(m.exec[slot].get(), stream_));
      ++mixed_launches_;
    } else {
      const layout l = make_layout(int32_t(tokens), n, int32_t(updates.size()), penalties,
                                   int32_t(items_.size()), singles);
      pack(slot, l, chunks, updates, items_, penalties);
      enqueue_eager(slot, l, sampled, penalties, all_single, decode, any_logprobs);
    }
  }
  if (any_logprobs) // after the graph or the eager step, on the same stream
    METRONOME_CUDA(cudaMemcpyAsync(logprob_results_[slot].get(), logprob_out_.get(),
                                   logprob_out_.bytes(), cudaMemcpyDeviceToHost, stream_));
  METRONOME_CUDA(cudaEventRecord(step_done_[slot], stream_));
  flight_.push_back(std::move(f));
  next_slot_ = 1 - slot;
}

void cuda_engine::apply_page_updates(std::span<const page_update> updates) {
  const size_t bytes = 16 + updates.size() * 12;
  if (big_updates_pinned_.bytes() < bytes) {
    big_updates_pinned_ = pinned_buffer(bytes * 2);
    big_updates_dev_ = device_buffer(bytes * 2);
  }
  auto* h = big_updates_pinned_.get<int32_t>();
  h[0] = int32_t(updates.size());
  for (size_t i = 0; i < updates.size(); ++i) {
    h[4 + 3 * i] = updates[i].slot;
    h[4 + 3 * i + 1] = updates[i].index;
    h[4 + 3 * i + 2] = updates[i].page;
  }
  METRONOME_CUDA(cudaMemcpyAsync(big_updates_dev_.get(), h, bytes, cudaMemcpyHostToDevice,
                                 stream_));
  const int32_t* d = big_updates_dev_.get<int32_t>();
  launch_page_updates(page_table_.get<int32_t>(), page_stride_, d + 4, d,
                      int32_t(updates.size()), stream_);
}

bool cuda_engine::prompt_pdl(int32_t rows) {
  // A 2,048-token prefill took 1-6% less time with PDL on the H200
  // (bench/results/h200-2026-12-01-r12.md); steps of decodes beside a chunk
  // of up to 128 tokens 7-15% more, captured or not (h200-2026-12-03-pdl.md).
  const pdl_mode mode = pdl_setting();
  return mode == pdl_mode::per_graph ? rows >= prompt_pdl_min_rows : mode != pdl_mode::off;
}

void cuda_engine::enqueue_eager(int32_t slot, const layout& l, int32_t sampled, int32_t penalties,
                                bool all_single, bool decode, bool any_logprobs) {
  METRONOME_CUDA(cudaMemcpyAsync(inputs_.get(), staging_[slot].get(), l.bytes,
                                 cudaMemcpyHostToDevice, stream_));
  enqueue_logprobs_ = any_logprobs;
  if (penalties > 0)
    METRONOME_CUDA(cudaMemcpyAsync(penalties_dev_.get(), penalties_pinned_.get(),
                                   size_t(penalties) * sizeof(penalty_entry),
                                   cudaMemcpyHostToDevice, stream_));
  if (decode) {
    enqueue_decode(l, l.seqs, eager_path(l.seqs), penalties);
  } else {
    // Long steps with prompt tokens launch with PDL (prompt_pdl).
    const pdl_scope with_pdl(prompt_pdl(l.tokens));
    enqueue_general(l, sampled, all_single, penalties);
  }
  enqueue_logprobs_ = true;
  if (sampled > 0)
    METRONOME_CUDA(cudaMemcpyAsync(results_[slot].get(), outputs_.get(), outputs_.bytes(),
                                   cudaMemcpyDeviceToHost, stream_));
}

bool cuda_engine::oldest_done() {
  if (flight_.empty())
    return false;
  const cudaError_t st = cudaEventQuery(step_done_[flight_.front().slot]);
  if (st == cudaSuccess)
    return true;
  if (st != cudaErrorNotReady)
    METRONOME_CUDA(st);
  return false;
}

double cuda_engine::oldest_age_s() const {
  if (flight_.empty())
    return 0.0;
  return std::chrono::duration<double>(std::chrono::steady_clock::now()
                                       - flight_.front().launched)
    .count();
}

engine_result cuda_engine::finish() {
  if (flight_.empty())
    throw std::logic_error("cuda runner: no step in flight to finish");
  const flight f = std::move(flight_.front());
  // The step's timeout runs from its launch (a step queued behind another
  // waits for it within its own timeout).
  const double left = std::max(options_.limits.step_timeout_s() - oldest_age_s(), 1e-3);
  wait_event(step_done_[f.slot], left, "cuda runner step");
  flight_.erase(flight_.begin());
  engine_result result;
  const auto* out = results_[f.slot].get<unsigned char>();
  const auto* ids = reinterpret_cast<const int32_t*>(out);
  const auto* lp = reinterpret_cast<const float*>(out + size_t(max_batch_) * 4);
  float device_ms = 0;
  if (cudaEventElapsedTime(&device_ms, step_start_[f.slot], step_done_[f.slot]) == cudaSuccess)
    result.device_ms = device_ms;
  else
    (void)cudaGetLastError(); // a timing that cannot be read is no step error
  result.tokens.assign(ids, ids + f.sampled);
  result.logprobs.assign(lp, lp + f.sampled);
  if (!f.logprobs.empty()) {
    const size_t stride = 1 + max_logprobs;
    const auto* lt = logprob_results_[f.slot].get<int32_t>();
    const auto* lv = reinterpret_cast<const float*>(lt + size_t(max_batch_) * stride);
    result.model_logprobs.resize(size_t(f.sampled));
    for (size_t r = 0; r < f.logprobs.size() && r < size_t(f.sampled); ++r) {
      if (f.logprobs[r] < 0)
        continue;
      auto& row = result.model_logprobs[r];
      for (size_t k = 0; k <= size_t(std::min(f.logprobs[r], max_logprobs)); ++k)
        row.push_back({lt[r * stride + k], lv[r * stride + k]});
    }
  }
  return result;
}

} // namespace metronome::gpu

namespace metronome::gpu {

std::vector<float> cuda_engine::logits(int32_t rows) {
  require_idle("reading logits");
  rows = std::max(0, std::min(rows, max_batch_));
  std::vector<float> out(size_t(rows) * size_t(model_->config.vocab_size));
  METRONOME_CUDA(cudaMemcpyAsync(out.data(), logits_.get(), out.size() * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream_));
  METRONOME_CUDA(cudaEventRecord(done_, stream_));
  wait_event(done_, options_.limits.step_timeout_s(), "logits copy");
  return out;
}

} // namespace metronome::gpu
