#include "gpu/cuda_engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

#include <cuda_profiler_api.h>

#include "model/model_error.hpp"

namespace metronome::gpu {

namespace {

/// Device time (ms) of what `launch` enqueues on `stream`, the mean of five
/// runs after two unmeasured ones. Synchronous; not while capturing.
template <class F>
double time_ms(cudaStream_t stream, F&& launch) {
  return mean_launch_ms(stream, 2, 5, launch, 60.0, "kernel timing");
}

constexpr size_t align_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

constexpr size_t cublas_workspace_bytes = 32ull << 20;
/// Memory left unplanned for the CUDA context's own growth and cuBLAS.
constexpr size_t reserve_bytes = 256ull << 20;

int32_t updates_capacity(int32_t batch) {
  return 4 * batch + 16;
}

void check_shape(bool ok, const std::string& field, const std::string& problem) {
  if (!ok)
    throw std::invalid_argument("cuda runner: " + field + ": " + problem);
}

} // namespace

// -- construction ------------------------------------------------------------------------

cuda_engine::cuda_engine(std::shared_ptr<const model_folder> model,
                         const cuda_runner_options& options)
  : model_(std::move(model)), options_(options) {
  const auto& c = model_->config;
  check_shape(attention_supports_head_dim(c.head_dim), "head_dim",
              std::to_string(c.head_dim) + " is not supported (16, 32, 64, 128, 256)");
  check_shape(c.hidden_size % 8 == 0, "hidden_size", "must be a multiple of 8");
  check_shape(c.intermediate_size % 8 == 0, "intermediate_size", "must be a multiple of 8");
  check_shape(c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0, "num_key_value_heads",
              "must divide num_attention_heads");
  const engine_limits& limits = options_.limits;
  check_shape(limits.page_size > 0 && limits.page_size <= 1024, "page_size",
              "must lie in 1..1024");
  check_shape(limits.max_batch_size >= 1 && limits.max_batch_size <= 1024, "max_batch_size",
              "must lie in 1..1024");
  check_shape(limits.max_num_batched_tokens >= 1, "max_num_batched_tokens",
              "must be positive");
  check_shape(options_.gpu_memory_fraction > 0 && options_.gpu_memory_fraction <= 1,
              "gpu_memory_fraction", "must lie in (0, 1]");
  check_shape(options_.small_batch_path == "auto" || options_.small_batch_path == "gemv"
                || options_.small_batch_path == "skinny" || options_.small_batch_path == "cublas",
              "small_batch_path", "must be auto, gemv, skinny or cublas");
  const std::string kv_problem = cuda_kv_cache_problem(c, options_.kv_cache_dtype);
  check_shape(kv_problem.empty(), "kv_cache_dtype", kv_problem);
  kv_fp8_ = options_.kv_cache_dtype == kv_cache_dtype_kind::fp8;

  int count = 0;
  METRONOME_CUDA(cudaGetDeviceCount(&count));
  check_shape(options_.device >= 0 && options_.device < count, "device",
              "cuda:" + std::to_string(options_.device) + " does not exist ("
                + std::to_string(count) + " devices)");
  METRONOME_CUDA(cudaSetDevice(options_.device));
  METRONOME_CUDA(
    cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, options_.device));
  METRONOME_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  METRONOME_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  // Timed (not DisableTiming): a step's device time is step_done_ - step_start_.
  for (auto& e : step_done_)
    METRONOME_CUDA(cudaEventCreate(&e));
  for (auto& e : step_start_)
    METRONOME_CUDA(cudaEventCreate(&e));
  METRONOME_CUBLAS(cublasCreate(&cublas_));
  METRONOME_CUBLAS(cublasSetStream(cublas_, stream_));
  graphs_enabled_ = options_.cuda_graphs;

  upload_weights();
  allocate_activations();
  plan_kv_and_capture();
}

cuda_engine::~cuda_engine() {
  // Steps still in flight finish first (bounded: a hung device is left).
  if (!flight_.empty()) {
    try {
      wait_event(step_done_[flight_.back().slot], options_.limits.step_timeout_s(),
                 "engine shutdown");
    } catch (...) {
    }
  }
  // Release in reverse: graphs and buffers free themselves; then handles.
  graphs_.clear();
  tuner_.reset();
  if (cublas_)
    cublasDestroy(cublas_);
  if (done_)
    cudaEventDestroy(done_);
  for (auto e : step_done_)
    if (e)
      cudaEventDestroy(e);
  for (auto e : step_start_)
    if (e)
      cudaEventDestroy(e);
  if (stream_)
    cudaStreamDestroy(stream_);
}

void cuda_engine::upload_weights() {
  const auto& c = model_->config;
  const auto& w = model_->weights;
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), f = c.intermediate_size;
  const int64_t v = c.vocab_size, qkv = q + 2 * kv;

  // One allocation; every tensor at a 256-byte boundary.
  size_t total = 0;
  auto reserve = [&](int64_t elements) {
    const size_t off = total;
    total = align_up(total + size_t(elements) * 2, 256);
    return off;
  };
  struct offsets {
    size_t attn_norm, qkv, qkv_bias, o, o_bias, mlp_norm, gate_up, down;
  };
  std::vector<offsets> offs;
  const size_t embed_off = reserve(v * h);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    offsets o{};
    o.attn_norm = reserve(h);
    o.qkv = reserve(qkv * h);
    o.qkv_bias = c.qkv_bias ? reserve(qkv) : 0;
    o.o = reserve(h * q);
    o.o_bias = c.o_bias ? reserve(h) : 0;
    o.mlp_norm = reserve(h);
    o.gate_up = reserve(2 * f * h);
    o.down = reserve(h * f);
    offs.push_back(o);
  }
  const size_t final_norm_off = reserve(h);
  const size_t lm_head_off = c.tie_word_embeddings ? embed_off : reserve(v * h);
  weights_ = device_buffer(total);
  auto* base = weights_.get<unsigned char>();

  // Non-bf16 weights go through a device staging buffer and a conversion.
  size_t staging_bytes = 0;
  for (const auto& [_, t] : model_->store->tensors())
    if (t.type != dtype::bf16)
      staging_bytes = std::max(staging_bytes, t.nbytes);
  device_buffer staging(staging_bytes);

  auto upload = [&](const tensor_view* t, size_t dst_off) {
    auto* dst = reinterpret_cast<bf16*>(base + dst_off);
    if (t->type == dtype::bf16) {
      METRONOME_CUDA(cudaMemcpyAsync(dst, t->data, t->nbytes, cudaMemcpyHostToDevice, stream_));
    } else {
      METRONOME_CUDA(
        cudaMemcpyAsync(staging.get(), t->data, t->nbytes, cudaMemcpyHostToDevice, stream_));
      launch_to_bf16(staging.get(), t->type == dtype::f16, t->numel(), dst, stream_);
    }
  };
  upload(w.embed, embed_off);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const auto& lw = w.layers[size_t(l)];
    const auto& o = offs[size_t(l)];
    upload(lw.attn_norm, o.attn_norm);
    upload(lw.q, o.qkv);
    upload(lw.k, o.qkv + size_t(q * h) * 2);
    upload(lw.v, o.qkv + size_t((q + kv) * h) * 2);
    if (c.qkv_bias) {
      upload(lw.q_bias, o.qkv_bias);
      upload(lw.k_bias, o.qkv_bias + size_t(q) * 2);
      upload(lw.v_bias, o.qkv_bias + size_t(q + kv) * 2);
    }
    upload(lw.o, o.o);
    if (c.o_bias)
      upload(lw.o_bias, o.o_bias);
    upload(lw.mlp_norm, o.mlp_norm);
    upload(lw.gate, o.gate_up);
    upload(lw.up, o.gate_up + size_t(f * h) * 2);
    upload(lw.down, o.down);
    // The staging buffer is reused tensor by tensor: wait per layer.
    if (staging_bytes > 0) {
      METRONOME_CUDA(cudaEventRecord(done_, stream_));
      wait_event(done_, 600.0, "weight upload");
    }
  }
  upload(w.final_norm, final_norm_off);
  if (!c.tie_word_embeddings)
    upload(w.lm_head, lm_head_off);
  METRONOME_CUDA(cudaEventRecord(done_, stream_));
  wait_event(done_, 600.0, "weight upload");

  auto at = [&](size_t off) { return reinterpret_cast<const bf16*>(base + off); };
  embed_ = at(embed_off);
  final_norm_ = at(final_norm_off);
  lm_head_ = at(lm_head_off);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const auto& o = offs[size_t(l)];
    layer L;
    L.attn_norm = at(o.attn_norm);
    L.qkv = at(o.qkv);
    L.qkv_bias = c.qkv_bias ? at(o.qkv_bias) : nullptr;
    L.o = at(o.o);
    L.o_bias = c.o_bias ? at(o.o_bias) : nullptr;
    L.mlp_norm = at(o.mlp_norm);
    L.gate_up = at(o.gate_up);
    L.down = at(o.down);
    layers_.push_back(L);
  }

  auto inv = rope_inv_freq(c);
  inv_freq_ = device_buffer(inv.size() * sizeof(float));
  METRONOME_CUDA(cudaMemcpyAsync(inv_freq_.get(), inv.data(), inv.size() * sizeof(float),
                                 cudaMemcpyHostToDevice, stream_));
  METRONOME_CUDA(cudaEventRecord(done_, stream_));
  wait_event(done_, 60.0, "rope table upload");
  plan_.push_back({"weights", int64_t(weights_.bytes())});
}

void cuda_engine::allocate_activations() {
  const auto& c = model_->config;
  max_batch_ = options_.limits.max_batch_size;
  max_tokens_ = std::max(options_.limits.max_num_batched_tokens, max_batch_);
  const size_t t = size_t(max_tokens_), b = size_t(max_batch_);
  const size_t h = size_t(c.hidden_size), q = size_t(c.q_size()), kv = size_t(c.kv_size());
  const size_t f = size_t(c.intermediate_size), v = size_t(c.vocab_size);
  x_ = device_buffer(t * h * 4);
  xn_ = device_buffer(t * h * 2);
  qkv_ = device_buffer(t * (q + 2 * kv) * 2);
  q_ = device_buffer(t * q * 2);
  attn_ = device_buffer(t * q * 2);
  gate_up_ = device_buffer(t * 2 * f * 2);
  act_ = device_buffer(t * f * 2);
  logits_ = device_buffer(b * v * 4);
  raw_logits_ = device_buffer(b * v * 4);
  const size_t activations = x_.bytes() + xn_.bytes() + qkv_.bytes() + q_.bytes()
                             + attn_.bytes() + gate_up_.bytes() + act_.bytes() + logits_.bytes()
                             + raw_logits_.bytes();

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
  part_o_ = device_buffer(size_t(max_splits_product_) * size_t(c.num_heads)
                          * size_t(c.head_dim) * 4);
  part_ml_ = device_buffer(size_t(max_splits_product_) * size_t(c.num_heads) * 2 * 4);
  split_counters_ = device_buffer(b * size_t(c.num_heads) * 4);
  METRONOME_CUDA(cudaMemset(split_counters_.get(), 0, split_counters_.bytes()));
  if (kv_fp8_)
    kv_stage_ = device_buffer(b * 2 * kv * 4);
  // Rows: a decode batch, or a mixed graph's singles and prompt rows (at most
  // max_batch_size + 256, mixed_sizes), whose o and down projections may
  // split the same way.
  split_rows_ = int32_t(std::min<size_t>(t, b + 256));
  if (residual_rms_norm_supports(c.hidden_size))
    split_partials_ =
      device_buffer(size_t(max_gemm_splits) * size_t(split_rows_) * std::max(h, q + 2 * kv) * 4);
  sample_ws_ = device_buffer(sample_workspace_bytes(max_batch_));
  cublas_ws_ = device_buffer(cublas_workspace_bytes);
  METRONOME_CUBLAS(cublasSetWorkspace(cublas_, cublas_ws_.get(), cublas_ws_.bytes()));
  tuner_ = std::make_unique<gemm_tuner>(cublas_, stream_, cublas_ws_.get(), cublas_ws_.bytes());

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
    skinny_partials_ = device_buffer(std::max<size_t>(skinny_ws.partial_bytes, 4));
    skinny_counters_ = device_buffer(size_t(std::max(skinny_ws.counters, 1)) * 4);
    METRONOME_CUDA(cudaMemset(skinny_counters_.get(), 0, skinny_counters_.bytes()));
  }

  // The prefill attention's split-key scratch (tile rows: 128 or fewer).
  {
    const size_t cells = size_t(prefill_split_parts) * size_t(c.num_heads) * 128;
    prefill_part_o_ = device_buffer(cells * size_t(c.head_dim) * 4);
    prefill_part_ml_ = device_buffer(cells * 2 * 4);
  }
  update_capacity_ = max_tokens_ + 4 * max_batch_ + 64;
  item_capacity_ = max_tokens_ / prefill_min_tile + max_batch_ + 1;
  // Sequences: a mixed graph's padding adds one (mixed_layout).
  input_capacity_ =
    make_layout(max_tokens_, max_batch_ + 1, update_capacity_, 0, item_capacity_, max_batch_)
      .bytes;
  inputs_ = device_buffer(input_capacity_);
  outputs_ = device_buffer(b * 8);
  logits_lse_ = device_buffer(b * 8);
  logprob_out_ = device_buffer(b * (1 + size_t(max_logprobs)) * 8);
  for (int slot = 0; slot < 2; ++slot) {
    staging_[slot] = pinned_buffer(input_capacity_);
    results_[slot] = pinned_buffer(b * 8);
    logprob_results_[slot] = pinned_buffer(logprob_out_.bytes());
    std::memset(staging_[slot].get(), 0, input_capacity_);
  }
  const size_t workspaces = part_o_.bytes() + part_ml_.bytes() + split_counters_.bytes()
                            + sample_ws_.bytes() + cublas_ws_.bytes() + inputs_.bytes()
                            + outputs_.bytes() + skinny_partials_.bytes()
                            + skinny_counters_.bytes() + split_partials_.bytes()
                            + kv_stage_.bytes() + logits_lse_.bytes() + logprob_out_.bytes();
  plan_.push_back({"activations", int64_t(activations)});
  plan_.push_back({"workspaces", int64_t(workspaces)});
}

size_t cuda_engine::kv_row_bytes() const {
  const size_t d = size_t(model_->config.head_dim);
  return kv_fp8_ ? d + 4 : d * 2;
}

size_t cuda_engine::kv_layer_bytes(int64_t pages) const {
  const size_t rows =
    size_t(pages) * size_t(options_.limits.page_size) * size_t(model_->config.num_kv_heads);
  // The fp8 pools rounded up to 256 bytes, so that every layer's pools start
  // 16-byte aligned (the prefill copies 16 bytes at a time) whatever the row
  // count.
  return kv_fp8_ ? (2 * rows * kv_row_bytes() + 255) / 256 * 256 : 2 * rows * kv_row_bytes();
}

void cuda_engine::plan_kv_and_capture() {
  const auto& c = model_->config;
  size_t free_b = 0, total_b = 0;
  METRONOME_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const size_t budget = size_t(double(total_b) * options_.gpu_memory_fraction);
  const size_t ps = size_t(options_.limits.page_size);
  const size_t token_bytes =
    size_t(c.num_layers) * 2 * size_t(c.num_kv_heads) * kv_row_bytes();
  max_seqs_ = options_.max_seqs > 0 ? options_.max_seqs : 4 * max_batch_;
  check_shape(max_seqs_ >= max_batch_, "max_seqs", "must be at least max_batch_size");

  graphs_.clear();
  if (graphs_enabled_)
    for (int32_t n = 1; n <= max_batch_;) {
      graphs_.emplace_back().size = n;
      const int32_t next = n < 8 ? n * 2 : n + 8;
      n = next > max_batch_ && n < max_batch_ ? max_batch_ : next;
    }

  // Graph memory, measured on one capture of the largest size against a
  // placeholder pool (graphs are captured for real once the pool exists).
  size_t graph_estimate = 0;
  if (!graphs_.empty()) {
    num_pages_ = 1;
    page_stride_ = 1;
    kv_layer_bytes_ = kv_layer_bytes(2);
    kv_pool_ = device_buffer(size_t(c.num_layers) * kv_layer_bytes_);
    page_table_ = device_buffer(size_t(max_seqs_ + 1) * 4);
    METRONOME_CUDA(cudaDeviceSynchronize());
    size_t before = 0, after = 0;
    METRONOME_CUDA(cudaMemGetInfo(&before, &total_b));
    {
      graph_exec probe;
      capture_one(graphs_.back().size, decode_path::blas, probe);
      METRONOME_CUDA(cudaMemGetInfo(&after, &total_b));
    }
    const size_t one = before > after ? before - after : 0;
    // The largest mixed graph, for the mixed grid's share.
    size_t one_mixed = 0;
    if (const auto sizes = mixed_sizes(); !sizes.empty()) {
      METRONOME_CUDA(cudaMemGetInfo(&before, &total_b));
      mixed_graph probe;
      probe.singles = sizes.back().first;
      probe.prompt = sizes.back().second;
      capture_mixed(probe, probe.exec[0], 0);
      METRONOME_CUDA(cudaMemGetInfo(&after, &total_b));
      one_mixed = before > after ? before - after : 0;
    }
    // Every size twice (a twin per staging slot), plus the candidates "auto"
    // holds at once while it times one size (the best so far, the new one,
    // its unsplit variant). METRONOME_PDL=auto's extra graphs (with PDL, then
    // with late triggers) each live beside the best alone (two of those
    // three), and the twins are captured after all candidates are gone, so
    // they need no share of their own.
    const size_t count = 2 * graphs_.size() + (options_.small_batch_path == "auto" ? 3 : 0);
    graph_estimate = (one + (2ull << 20)) * count
                     + (one_mixed + (2ull << 20)) * 2 * mixed_sizes().size();
    kv_pool_.reset();
    page_table_.reset();
  }

  METRONOME_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const size_t used = total_b - free_b;
  int64_t pages = 0;
  if (options_.limits.kv_cache_tokens > 0) {
    pages = (options_.limits.kv_cache_tokens + int64_t(ps) - 1) / int64_t(ps);
  } else {
    const int64_t left =
      int64_t(budget) - int64_t(used) - int64_t(graph_estimate) - int64_t(reserve_bytes);
    pages = left > 0 ? left / int64_t(ps * token_bytes) - 1 : 0;
  }
  if (pages < 1)
    throw std::runtime_error(
      "cuda runner: no memory left for the KV cache: budget " + std::to_string(budget >> 20)
      + " MiB (" + std::to_string(options_.gpu_memory_fraction) + " of "
      + std::to_string(total_b >> 20) + " MiB), already used " + std::to_string(used >> 20)
      + " MiB, graphs ~" + std::to_string(graph_estimate >> 20) + " MiB");
  pages = std::min<int64_t>(pages, INT32_MAX - 1);
  num_pages_ = int32_t(pages);
  int64_t max_len = options_.limits.max_model_len > 0 ? options_.limits.max_model_len
                                                      : c.max_position_embeddings;
  max_len = std::min<int64_t>(max_len, int64_t(num_pages_) * int64_t(ps));
  page_stride_ = int32_t((max_len + int64_t(ps) - 1) / int64_t(ps));

  // The pool has one extra page: the scratch page of padding rows.
  kv_layer_bytes_ = kv_layer_bytes(int64_t(num_pages_) + 1);
  kv_pool_ = device_buffer(size_t(c.num_layers) * kv_layer_bytes_);
  METRONOME_CUDA(cudaMemsetAsync(kv_pool_.get(), 0, kv_pool_.bytes(), stream_));
  page_table_ = device_buffer(size_t(max_seqs_ + 1) * size_t(page_stride_) * 4);
  launch_fill_i32(page_table_.get<int32_t>(), int64_t(max_seqs_ + 1) * page_stride_, num_pages_,
                  stream_);
  METRONOME_CUDA(cudaEventRecord(done_, stream_));
  wait_event(done_, options_.limits.step_timeout_s(), "KV pool initialisation");

  METRONOME_CUDA(cudaDeviceSynchronize());
  size_t before = 0, after = 0;
  METRONOME_CUDA(cudaMemGetInfo(&before, &total_b));
  capture_graphs();
  METRONOME_CUDA(cudaDeviceSynchronize());
  METRONOME_CUDA(cudaMemGetInfo(&after, &total_b));
  plan_.push_back({"graphs", int64_t(before > after ? before - after : 0)});
  plan_.push_back({"graphs_estimated", int64_t(graph_estimate)});
  plan_.push_back({"kv_pool", int64_t(kv_pool_.bytes())});
  plan_.push_back({"page_tables", int64_t(page_table_.bytes())});
  plan_.push_back({"budget", int64_t(budget)});
  plan_.push_back({"device_total", int64_t(total_b)});
  plan_.push_back({"device_free", int64_t(after)});
}

// -- graphs ------------------------------------------------------------------------------

prefill_split cuda_engine::prefill_split_of(int32_t items, int32_t busy) const {
  prefill_split s;
  const int32_t heads = model_->config.num_heads;
  if (items <= 0 || busy <= 0 || active_kernels().prefill_attention == 1)
    return s;
  const int32_t blocks = busy * heads;
  // Two blocks of the kernel fit an SM: splits until the grid fills it.
  int32_t splits = (2 * num_sms_ + blocks - 1) / blocks;
  splits = std::min({splits, prefill_max_splits, prefill_split_parts / items});
  if (splits <= 1)
    return s;
  s.o = prefill_part_o_.get<float>();
  s.ml = prefill_part_ml_.get<float>();
  s.splits = splits;
  return s;
}

cuda_engine::layout cuda_engine::mixed_layout(int32_t singles, int32_t prompt) const {
  const int32_t tile = prefill_tile_rows();
  const int32_t items = (prompt + tile - 1) / tile + mixed_max_chunks;
  // New pages: at most one per decode, a chunk's own plus one, and the
  // cached pages a newly admitted sequence starts on (a prefix of up to
  // 1,024 pages; 12 bytes each in the step's copy).
  const int32_t base = singles + prompt / options_.limits.page_size + 2 * mixed_max_chunks + 16;
  const int32_t updates =
    base + std::max(0, std::min({page_stride_, 1024, update_capacity_ - base}));
  layout l = make_layout(singles + prompt, singles + mixed_max_chunks + 1, updates, 0, items,
                         singles);
  l.busy_items = (prompt + tile - 1) / tile;
  return l;
}

int32_t cuda_engine::mixed_index(int32_t singles, int32_t chunks, int32_t prompt,
                                 int32_t updates) const {
  if (chunks > mixed_max_chunks)
    return -1;
  for (size_t i = 0; i < mixed_graphs_.size(); ++i) {
    const mixed_graph& m = mixed_graphs_[i];
    if (m.singles >= singles && m.prompt >= prompt
        && updates <= mixed_layout(m.singles, m.prompt).updates)
      return int32_t(i);
  }
  return -1;
}

std::vector<std::pair<int32_t, int32_t>> cuda_engine::mixed_sizes() const {
  std::vector<std::pair<int32_t, int32_t>> sizes;
  if (!graphs_enabled_ || !options_.mixed_graphs)
    return sizes;
  // One-token rows padded to these counts (the largest: what max_batch_size
  // leaves beside the chunks), prompt rows to these; a grid of 8 x 6 at the
  // server's defaults, each captured twice (per staging slot).
  // None (a small prefill alone) gets graphs of its own: padding rows would
  // cost it GEMM rows (a 128-token prefill with 8 took 5.67 ms against 5.41
  // uncaptured on the H200).
  std::vector<int32_t> singles = {0};
  const int32_t top = max_batch_ - mixed_max_chunks;
  for (int32_t s : {8, 16, 32, 48, 64, 96, 128})
    if (s < top)
      singles.push_back(s);
  if (top >= 1)
    singles.push_back(top);
  for (int32_t s : singles)
    for (int32_t p : {16, 32, 64, 128, 192, 256})
      if (s + p <= max_tokens_)
        sizes.emplace_back(s, p);
  return sizes;
}

size_t cuda_engine::capture_mixed(const mixed_graph& m, graph_exec& out, int32_t slot) {
  const layout l = mixed_layout(m.singles, m.prompt);
  return capture(l, slot, out, [&] {
    // As the eager steps with prompt tokens launch (enqueue_eager): with
    // METRONOME_PDL=auto, PDL only for graphs of prompt_pdl_min_rows rows
    // or more.
    const pdl_scope with_pdl(prompt_pdl(l.tokens));
    enqueue_general(l, l.seqs - 1, false, 0);
  });
}

size_t cuda_engine::capture(const layout& l, int32_t slot, graph_exec& out,
                            const std::function<void()>& enqueue) {
  METRONOME_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    METRONOME_CUDA(cudaMemcpyAsync(inputs_.get(), staging_[slot].get(), l.bytes,
                                   cudaMemcpyHostToDevice, stream_));
    enqueue();
    METRONOME_CUDA(cudaMemcpyAsync(results_[slot].get(), outputs_.get(), outputs_.bytes(),
                                   cudaMemcpyDeviceToHost, stream_));
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);
    if (graph)
      cudaGraphDestroy(graph);
    throw;
  }
  METRONOME_CUDA(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t st = cudaGraphInstantiate(&exec, graph, 0);
  size_t nodes = 0;
  cudaGraphGetNodes(graph, nullptr, &nodes);
  cudaGraphDestroy(graph);
  METRONOME_CUDA(st);
  out = graph_exec(exec);
  // Uploaded now: a graph's first launch would otherwise carry it (about
  // half a millisecond at batch 64 on the H200), on a serving step.
  METRONOME_CUDA(cudaGraphUpload(out.get(), stream_));
  return nodes;
}

int32_t cuda_engine::graph_index(int32_t batch) const {
  for (size_t i = 0; i < graphs_.size(); ++i)
    if (graphs_[i].size >= batch && graphs_[i].captured())
      return int32_t(i);
  return -1;
}

size_t cuda_engine::capture_one(int32_t batch, decode_path path, graph_exec& out, int32_t slot) {
  const layout l = make_layout(batch, batch, updates_capacity(batch), 0, 0);
  return capture(l, slot, out, [&] { enqueue_decode(l, batch, path, 0); });
}

double cuda_engine::graph_replay_ms(int32_t batch, bool repeat_last_step) {
  const int32_t gi = graph_index(batch);
  if (gi < 0 || (repeat_last_step && gi != last_graph_))
    return std::nan("");
  require_idle("graph timing");
  if (repeat_last_step) {
    // Fed ids become the ids they stood for (the step before the last one
    // sampled them into the other slot's results): replays read the ids
    // their own sampling writes, and must rewrite the same keys and values.
    const int32_t b = graphs_[size_t(gi)].size;
    const layout l = make_layout(b, b, updates_capacity(b), 0, 0);
    const int32_t slot = 1 - next_slot_; // the last step's
    auto* ids = reinterpret_cast<int32_t*>(staging_[slot].get<unsigned char>() + l.ids);
    const auto* earlier = results_[1 - slot].get<int32_t>();
    for (int32_t r = 0; r < b; ++r)
      if (ids[r] < 0)
        ids[r] = earlier[-1 - ids[r]];
  }
  const decode_graph& g = graphs_[size_t(gi)];
  return time_graph(g.exec[repeat_last_step && next_slot_ == 0 ? 1 : 0], g.size,
                    !repeat_last_step);
}

double cuda_engine::time_graph(const graph_exec& g, int32_t batch, bool pad) {
  require_idle("graph timing");
  if (pad) {
    fill_pad_inputs(batch);
    last_graph_ = -1;
  }
  const double ms = mean_launch_ms(
    stream_, 3, 10, [&] { METRONOME_CUDA(cudaGraphLaunch(g.get(), stream_)); },
    options_.limits.step_timeout_s(), "graph timing");
  // One more replay inside a profiler range, for `ncu --profile-from-start
  // off` (options.profile_batch: that size's step on real inputs).
  static bool profiled = false; // the first such replay of the process
  if (!pad && !profiled && options_.profile_batch > 0 && options_.profile_batch == batch) {
    profiled = true;
    METRONOME_CUDA(cudaStreamSynchronize(stream_));
    METRONOME_CUDA(cudaProfilerStart());
    METRONOME_CUDA(cudaGraphLaunch(g.get(), stream_));
    METRONOME_CUDA(cudaStreamSynchronize(stream_));
    METRONOME_CUDA(cudaProfilerStop());
  }
  return ms;
}

void cuda_engine::tune_gemms(int32_t m) {
  const auto& c = model_->config;
  const int32_t h = c.hidden_size, q = c.q_size(), qkv = q + 2 * c.kv_size();
  const int32_t f = c.intermediate_size;
  const layer& L = layers_.front();
  // Scratch use of the activation buffers, filled with a non-zero constant
  // (bf16 0x3c3c ~ 0.0115; all-zero inputs would flatter the timings).
  for (auto* b : {&xn_, &attn_, &act_})
    METRONOME_CUDA(cudaMemsetAsync(b->get(), 0x3c, b->bytes(), stream_));
  const double qkv_ms = tuner_->tune(xn_.get<bf16>(), m, L.qkv, qkv, h, qkv_.get(), false, 0.0f);
  const double o_ms = tuner_->tune(attn_.get<bf16>(), m, L.o, h, q, x_.get(), true, 1.0f);
  tuner_->tune(xn_.get<bf16>(), m, L.gate_up, 2 * f, h, gate_up_.get(), false, 0.0f);
  const double down_ms = tuner_->tune(act_.get<bf16>(), m, L.down, h, f, x_.get(), true, 1.0f);
  if (m <= max_batch_)
    tuner_->tune(xn_.get<bf16>(), m, lm_head_, c.vocab_size, h, logits_.get(), true, 0.0f);
  if (m <= split_rows_) {
    if (split_partials_.bytes() > 0 && !splits_.contains(m)) {
      // Each projection whole or as split-K partials, by timing. A split
      // must win by 2%, or the simpler launch stays.
      float* parts = split_partials_.get<float>();
      auto better = [](double ms, double best_ms) { return ms < 0.98 * best_ms; };
      split_choice r;
      // qkv: its partials cost the fused attention a few KB more to read.
      if (decode_attention_fuses_rope(attention_of(0))) {
        double best_ms = qkv_ms;
        for (int32_t s = 1; s <= max_gemm_splits; s *= 2)
          if (gemm_tuner::split_ok(h, s)) {
            const double ms = tuner_->tune_split(xn_.get<bf16>(), m, L.qkv, qkv, h, parts, s);
            if (better(ms, best_ms)) {
              r.qkv = s;
              best_ms = ms;
            }
          }
      }
      // o and down: cuBLAS's epilogue adding into the residual and a norm
      // launch, or the partials and launch_residual_rms_norm.
      const double norm_ms = time_ms(stream_, [&] {
        launch_rms_norm(x_.get<float>(), nullptr, L.mlp_norm, 1e-5f, m, h, xn_.get<bf16>(),
                        stream_);
      });
      auto best_split = [&](const bf16* in, const bf16* w, int32_t k, const bf16* bias,
                            double whole_ms) {
        int32_t best = 0;
        double best_ms = whole_ms + norm_ms;
        for (int32_t s = 1; s <= max_gemm_splits; s *= 2) {
          if (!gemm_tuner::split_ok(k, s))
            continue;
          const double ms = tuner_->tune_split(in, m, w, h, k, parts, s) + time_ms(stream_, [&] {
                              launch_residual_rms_norm(parts, s, bias, x_.get<float>(),
                                                       L.mlp_norm, 1e-5f, m, h,
                                                       xn_.get<bf16>(), stream_);
                            });
          if (better(ms, best_ms)) {
            best = s;
            best_ms = ms;
          }
        }
        return best;
      };
      const double o_bias_ms =
        L.o_bias ? time_ms(stream_, [&] { launch_add_bias(x_.get<float>(), L.o_bias, m, h, stream_); })
                 : 0.0;
      r.o = best_split(attn_.get<bf16>(), L.o, q, L.o_bias, o_ms + o_bias_ms);
      r.down = best_split(act_.get<bf16>(), L.down, f, nullptr, down_ms);
      splits_[m] = r;
    }
  }
  METRONOME_CUDA(cudaMemsetAsync(x_.get(), 0, x_.bytes(), stream_));
}

cuda_engine::split_choice cuda_engine::splits_of(int32_t m) const {
  const int mode = active_kernels().gemm_splits;
  if (mode == 1 || split_partials_.bytes() == 0 || m > split_rows_)
    return {};
  split_choice r;
  if (mode == 3) {
    const auto& c = model_->config;
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
  return r;
}

void cuda_engine::capture_graphs() {
  for (decode_graph& dg : graphs_)
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
  } unset{*tuner_};
  tuner_->set_flush(kv_pool_.get(), std::min(kv_pool_.bytes(), 2 * size_t(l2)));
  // Full prefill chunks have exactly max_num_batched_tokens tokens.
  tune_gemms(max_tokens_);
  const std::string& want = options_.small_batch_path;
  for (decode_graph& dg : graphs_) {
    const int32_t n = dg.size;
    // The candidates for this size; "auto" times each captured graph and
    // keeps the fastest, the other settings force a path where it applies.
    std::vector<decode_path> candidates;
    if (n <= gemv_max_m && (want == "auto" || want == "gemv"))
      candidates.push_back(decode_path::gemv);
    if (skinny_ok_ && n <= skinny_gemm_max_m && (want == "auto" || want == "skinny"))
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
        tune_gemms(n);
      graph_exec g;
      capture_one(n, path, g);
      // cuBLAS with the split-K projections the tuner chose, against all
      // whole: timed in the step, where the tuner timed each kernel alone.
      double ms = std::nan("");
      const split_choice chosen = splits_of(n);
      if (path == decode_path::blas && active_kernels().gemm_splits == 2
          && (chosen.qkv || chosen.o || chosen.down)) {
        ms = time_graph(g, n);
        splits_[n] = split_choice{};
        graph_exec whole;
        capture_one(n, path, whole);
        const double whole_ms = time_graph(whole, n);
        if (whole_ms <= ms) {
          g = std::move(whole);
          ms = whole_ms;
        } else {
          splits_[n] = chosen;
        }
      }
      if (candidates.size() == 1) {
        dg.exec[0] = std::move(g);
        break;
      }
      if (std::isnan(ms))
        ms = time_graph(g, n);
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
        capture_one(n, dg.path, gp);
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
        capture_one(n, dg.path, gl);
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
  for (decode_graph& dg : graphs_) {
    const pdl_scope same_pdl(dg.pdl);
    const late_trigger_scope same_late(dg.late);
    capture_one(dg.size, dg.path, dg.exec[1], 1);
  }
  mixed_graphs_.clear();
  for (const auto& [singles, prompt] : mixed_sizes()) {
    mixed_graph& m = mixed_graphs_.emplace_back();
    m.singles = singles;
    m.prompt = prompt;
    // Its projections' algorithms and splits, timed for its rows as the
    // decode sizes' are (a shape already tuned is not timed again).
    tune_gemms(singles + prompt);
    for (int32_t slot = 0; slot < 2; ++slot)
      capture_mixed(m, m.exec[slot], slot);
  }
}

bool cuda_engine::wins_by_margin(const graph_exec& challenger, const graph_exec& incumbent,
                                 int32_t batch) {
  double inc_ms = 0.0, ch_ms = 0.0;
  for (int round = 0; round < 4; ++round) {
    const bool ch_first = round % 3 != 0; // inc ch | ch inc | ch inc | inc ch
    (ch_first ? ch_ms : inc_ms) += time_graph(ch_first ? challenger : incumbent, batch);
    (ch_first ? inc_ms : ch_ms) += time_graph(ch_first ? incumbent : challenger, batch);
  }
  return ch_ms < (1.0 - pdl_margin) * inc_ms;
}

void cuda_engine::require_idle(const char* what) const {
  if (!flight_.empty())
    throw std::logic_error(std::string("cuda runner: ") + what
                           + " while steps are in flight");
}

cuda_engine::decode_path cuda_engine::eager_path(int32_t batch) const {
  const int32_t i = graph_index(batch);
  if (i >= 0)
    return graphs_[size_t(i)].path;
  // No graph timed this size: forced paths where they apply, else what won
  // on the H200 (the GEMV up to 2 sequences, cuBLAS beyond).
  const std::string& want = options_.small_batch_path;
  if (batch <= gemv_max_m && (want == "gemv" || (want == "auto" && batch <= 2)))
    return decode_path::gemv;
  if (skinny_ok_ && batch <= skinny_gemm_max_m && want == "skinny")
    return decode_path::skinny;
  return decode_path::blas;
}

std::string cuda_engine::small_batch_choice() const {
  std::string s;
  for (const decode_graph& dg : graphs_) {
    if (dg.size > skinny_gemm_max_m || !dg.captured())
      break;
    const decode_path p = dg.path;
    s += (s.empty() ? "" : ",") + std::to_string(dg.size) + ":"
         + (p == decode_path::gemv ? "gemv" : p == decode_path::skinny ? "skinny" : "cublas")
         + (dg.pdl ? "+pdl" : "") + (dg.late ? "+late" : "");
  }
  if (s.empty())
    s = "eager";
  return s;
}

} // namespace metronome::gpu
