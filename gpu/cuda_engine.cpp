#include "gpu/cuda_engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "gpu/collective.hpp"
#include "gpu/startup_tuner.hpp"
#include "model/model_error.hpp"

namespace metronome::gpu {

namespace {

void check_shape(bool ok, const std::string& field, const std::string& problem) {
  if (!ok)
    throw std::invalid_argument("cuda runner: " + field + ": " + problem);
}

} // namespace

// -- construction ------------------------------------------------------------------------

cuda_engine::cuda_engine(std::shared_ptr<const model_folder> model,
                         const cuda_runner_options& options)
  : model_(std::move(model)), options_(options), planner_(model_->config, options_),
    packer_(work_list_rule{
      [this](int32_t seqs) {
        return decode_attention_work_items(fwd_->attention_of(0), seqs, num_sms_,
                                           fwd_->attn_blocks_per_sm());
      },
      [this](const int32_t* seq_len, int32_t seqs, int32_t* work, int32_t items) {
        decode_attention_work(fwd_->attention_of(0), seq_len, seqs, num_sms_,
                              fwd_->attn_blocks_per_sm(), work, items);
      }}) {
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
  kv_fp8_ = options_.kv_cache_dtype == kv_cache_dtype_kind::fp8
            || options_.kv_cache_dtype == kv_cache_dtype_kind::fp8_e5m2;

  int count = 0;
  METRONOME_CUDA(cudaGetDeviceCount(&count));
  check_shape(options_.device >= 0 && options_.device < count, "device",
              "cuda:" + std::to_string(options_.device) + " does not exist ("
                + std::to_string(count) + " devices)");
  METRONOME_CUDA(cudaSetDevice(options_.device));
  size_t device_total = 0;
  METRONOME_CUDA(cudaMemGetInfo(&free_at_start_, &device_total));
  METRONOME_CUDA(
    cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, options_.device));
  if (options_.sm_count > 0) {
    partition_ =
      std::make_unique<sm_partition>(options_.device, options_.sm_count, options_.sm_rest);
    stream_ = partition_->stream();
    num_sms_ = partition_->sms();
  } else {
    METRONOME_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  // One-wave grids launched from this (the engine's) thread fit its share.
  set_launch_sms(partition_ ? num_sms_ : 0);
  METRONOME_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  // Timed (not DisableTiming): a step's device time is step_done_ - step_start_.
  for (auto& e : step_done_)
    METRONOME_CUDA(cudaEventCreate(&e));
  for (auto& e : step_start_)
    METRONOME_CUDA(cudaEventCreate(&e));
  METRONOME_CUBLAS(cublasCreate(&cublas_));
  METRONOME_CUBLAS(cublasSetStream(cublas_, stream_));
  if (partition_)
    METRONOME_CUBLAS(cublasSetSmCountTarget(cublas_, num_sms_));
  graphs_enabled_ = options_.cuda_graphs;

  weights_ = std::make_unique<weight_store>(*model_, stream_, done_);
  planner_.record("weights", int64_t(weights_->bytes()));
  allocate_activations();
  plan_kv_and_capture();
  // Tensor parallelism: start-up timed and captured without the
  // collectives (the ranks do not start in step); from here every step
  // runs them, graphs included.
  if (options_.collective) {
    options_.collective->set_live(true);
    graphs_->recapture();
    METRONOME_CUDA(cudaStreamSynchronize(stream_));
  }
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
  if (graphs_)
    graphs_->decode_graphs().clear();
  if (fwd_)
    fwd_->release_tuner();
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
  if (stream_ && !partition_)
    cudaStreamDestroy(stream_);
  // partition_ (its stream, then its green context) goes after the members
  // declared below it: the graphs and buffers made in its context.
}

void cuda_engine::allocate_activations() {
  kv_ = std::make_unique<kv_pool>(model_->config, options_.limits.page_size, kv_fp8_,
                                  options_.kv_cache_dtype == kv_cache_dtype_kind::fp8_e5m2);
  fwd_ = std::make_unique<forward_pass>(model_->config, options_, *weights_, *kv_, stream_,
                                        cublas_, num_sms_, kv_fp8_);
  const int32_t max_tokens = fwd_->max_tokens(), max_batch = fwd_->max_batch();
  update_capacity_ = max_tokens + 4 * max_batch + 64;
  item_capacity_ = max_tokens / prefill_min_tile + max_batch + 1;
  packer_.shape.page_size = options_.limits.page_size;
  packer_.shape.update_capacity = update_capacity_;
  // Sequences: a mixed graph's padding adds one (step_packer::mixed_layout).
  input_capacity_ =
    packer_.layout(max_tokens, max_batch + 1, update_capacity_, 0, item_capacity_, max_batch)
      .bytes;
  fwd_->allocate_step_io(input_capacity_);
  for (int slot = 0; slot < 2; ++slot) {
    host_.staging[slot] = pinned_buffer(input_capacity_);
    host_.results[slot] = pinned_buffer(fwd_->buffers().outputs.bytes());
    host_.logprob_results[slot] = pinned_buffer(fwd_->buffers().logprob_out.bytes());
    std::memset(host_.staging[slot].get(), 0, input_capacity_);
  }
  graphs_ = std::make_unique<decode_graph_cache>(options_, *fwd_, packer_, host_, stream_);
  planner_.record("activations", int64_t(fwd_->activation_bytes()));
  planner_.record("workspaces", int64_t(fwd_->workspace_bytes()));
}

void cuda_engine::plan_kv_and_capture() {
  size_t free_b = 0, total_b = 0;
  METRONOME_CUDA(cudaMemGetInfo(&free_b, &total_b));
  const size_t budget = planner_.budget(total_b);
  max_seqs_ = planner_.max_seqs(fwd_->max_batch());
  // Padding rows use the page-table row past every sequence's.
  packer_.shape.scratch_slot = max_seqs_;

  graphs_->plan_sizes(graphs_enabled_);

  // Graph memory, measured on one capture of the largest size against a
  // placeholder pool (graphs are captured for real once the pool exists).
  size_t graph_estimate = 0;
  if (!graphs_->decode_graphs().empty()) {
    kv_->allocate_probe(max_seqs_, planner_.kv_layer_bytes(2));
    packer_.shape.page_stride = kv_->page_stride();
    METRONOME_CUDA(cudaDeviceSynchronize());
    size_t before = 0, after = 0;
    METRONOME_CUDA(cudaMemGetInfo(&before, &total_b));
    {
      graph_exec probe;
      graphs_->capture_one(graphs_->decode_graphs().back().size, decode_path::blas, probe);
      METRONOME_CUDA(cudaMemGetInfo(&after, &total_b));
    }
    const size_t one = before > after ? before - after : 0;
    // The largest mixed graph, for the mixed grid's share.
    size_t one_mixed = 0;
    if (const auto sizes = graphs_->mixed_sizes(graphs_enabled_); !sizes.empty()) {
      METRONOME_CUDA(cudaMemGetInfo(&before, &total_b));
      decode_graph_cache::mixed_graph probe;
      probe.singles = sizes.back().first;
      probe.prompt = sizes.back().second;
      graphs_->capture_mixed(probe, probe.exec[0], 0);
      METRONOME_CUDA(cudaMemGetInfo(&after, &total_b));
      one_mixed = before > after ? before - after : 0;
    }
    graph_estimate = memory_planner::graph_estimate(
      one, graphs_->decode_graphs().size(), options_.small_batch_path == "auto", one_mixed,
      graphs_->mixed_sizes(graphs_enabled_).size());
    kv_->release();
  }

  METRONOME_CUDA(cudaMemGetInfo(&free_b, &total_b));
  // Replicas sharing the device (data parallel): the others' memory is
  // theirs, and each has its own gpu_memory_fraction share of the total.
  size_t used = total_b - free_b;
  if (options_.device_replicas > 1)
    used = free_at_start_ > free_b ? free_at_start_ - free_b : 0;
  const int32_t num_pages = planner_.kv_pages(total_b, used, graph_estimate);
  const int32_t page_stride = planner_.page_stride(num_pages);
  packer_.shape.page_stride = page_stride;

  // The pool has one extra page: the scratch page of padding rows.
  kv_->allocate(num_pages, page_stride, max_seqs_,
                planner_.kv_layer_bytes(int64_t(num_pages) + 1), stream_);
  METRONOME_CUDA(cudaEventRecord(done_, stream_));
  wait_event(done_, options_.limits.step_timeout_s(), "KV pool initialisation");

  METRONOME_CUDA(cudaDeviceSynchronize());
  size_t before = 0, after = 0;
  METRONOME_CUDA(cudaMemGetInfo(&before, &total_b));
  startup_tuner(model_->config, options_, *fwd_, *weights_, *kv_, *graphs_, stream_)
    .capture_graphs(graphs_enabled_);
  METRONOME_CUDA(cudaDeviceSynchronize());
  METRONOME_CUDA(cudaMemGetInfo(&after, &total_b));
  planner_.record("graphs", int64_t(before > after ? before - after : 0));
  planner_.record("graphs_estimated", int64_t(graph_estimate));
  planner_.record("kv_pool", int64_t(kv_->pool().bytes()));
  planner_.record("page_tables", int64_t(kv_->page_tables().bytes()));
  planner_.record("budget", int64_t(budget));
  planner_.record("device_total", int64_t(total_b));
  planner_.record("device_free", int64_t(after));
}

// -- steps -------------------------------------------------------------------------------

void cuda_engine::require_idle(const char* what) const {
  if (!flight_.empty())
    throw std::logic_error(std::string("cuda runner: ") + what
                           + " while steps are in flight");
}

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
  const int32_t max_batch = fwd_->max_batch(), max_tokens = fwd_->max_tokens();
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
  if (n > max_batch)
    throw std::invalid_argument("cuda runner: " + std::to_string(n)
                                + " sequences in one step exceed max_batch_size "
                                + std::to_string(max_batch));
  if (tokens > max_tokens)
    throw std::invalid_argument("cuda runner: " + std::to_string(tokens)
                                + " tokens in one step exceed max_num_batched_tokens "
                                + std::to_string(max_tokens));
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
      fwd_->buffers().penalties = device_buffer(bytes * 2);
    }
    step_packer::pack_penalties(chunks, penalties_pinned_.get<penalty_entry>());
  }

  const bool all_sampled = sampled == n;
  const bool decode = all_single && all_sampled && n > 0;
  const auto& graphs = graphs_->decode_graphs();
  int32_t gi = -1;
  if (graphs_enabled_ && decode && penalties == 0) {
    gi = graphs_->graph_index(n);
    if (gi >= 0
        && int64_t(updates.size()) > step_packer::decode_updates(graphs[size_t(gi)].size))
      gi = -1;
  }
  flight f;
  f.slot = slot;
  f.sampled = sampled;
  f.seqs = n;
  f.launched = std::chrono::steady_clock::now();
  if (any_logprobs)
    for (const auto& ch : chunks)
      if (ch.sample)
        f.logprobs.push_back(ch.logprobs);
  unsigned char* staging = host_.staging[slot].get<unsigned char>();
  if (gi >= 0) {
    const step_layout l = packer_.decode_layout(graphs[size_t(gi)].size);
    packer_.pack(staging, l, chunks, updates, {}, 0);
    METRONOME_CUDA(cudaGraphLaunch(graphs[size_t(gi)].exec[slot].get(), stream_));
    last_graph_ = gi;
  } else {
    last_graph_ = -1;
    items_.clear();
    const int32_t tile = prefill_tile_rows();
    int32_t singles = 0;
    if (!all_single)
      singles = step_packer::cut_prefill_items(chunks, tile, items_);
    // A step with prompt chunks small enough for a mixed graph replays it.
    const int32_t mi = !decode && !all_single && penalties == 0 && graphs_enabled_
                           && mixed_enabled_
                         ? graphs_->mixed_index(singles, n - singles,
                                                int32_t(tokens) - singles,
                                                int32_t(updates.size()))
                         : -1;
    if (mi >= 0) {
      const auto& m = graphs_->mixed_graphs()[size_t(mi)];
      packer_.pack(staging, graphs_->mixed_layout(m.singles, m.prompt), chunks, updates, items_,
                   0, true);
      METRONOME_CUDA(cudaGraphLaunch(m.exec[slot].get(), stream_));
      ++mixed_launches_;
    } else {
      const step_layout l = packer_.layout(int32_t(tokens), n, int32_t(updates.size()),
                                           penalties, int32_t(items_.size()), singles);
      packer_.pack(staging, l, chunks, updates, items_, penalties);
      enqueue_eager(slot, l, sampled, penalties, all_single, decode, any_logprobs);
    }
  }
  if (any_logprobs) { // after the graph or the eager step, on the same stream
    const device_buffer& out = fwd_->buffers().logprob_out;
    METRONOME_CUDA(cudaMemcpyAsync(host_.logprob_results[slot].get(), out.get(), out.bytes(),
                                   cudaMemcpyDeviceToHost, stream_));
  }
  METRONOME_CUDA(cudaEventRecord(step_done_[slot], stream_));
  flight_.push_back(std::move(f));
  next_slot_ = 1 - slot;
}

void cuda_engine::apply_page_updates(std::span<const page_update> updates) {
  const size_t bytes = step_packer::page_update_block_bytes(updates.size());
  if (big_updates_pinned_.bytes() < bytes) {
    big_updates_pinned_ = pinned_buffer(bytes * 2);
    big_updates_dev_ = device_buffer(bytes * 2);
  }
  auto* h = big_updates_pinned_.get<int32_t>();
  step_packer::pack_page_updates(updates, h);
  METRONOME_CUDA(cudaMemcpyAsync(big_updates_dev_.get(), h, bytes, cudaMemcpyHostToDevice,
                                 stream_));
  const int32_t* d = big_updates_dev_.get<int32_t>();
  launch_page_updates(kv_->page_table(), kv_->page_stride(), d + 4, d,
                      int32_t(updates.size()), stream_);
}

void cuda_engine::enqueue_eager(int32_t slot, const step_layout& l, int32_t sampled,
                                int32_t penalties, bool all_single, bool decode,
                                bool any_logprobs) {
  forward_buffers& buf = fwd_->buffers();
  METRONOME_CUDA(cudaMemcpyAsync(buf.inputs.get(), host_.staging[slot].get(), l.bytes,
                                 cudaMemcpyHostToDevice, stream_));
  fwd_->set_logprobs(any_logprobs);
  if (penalties > 0)
    METRONOME_CUDA(cudaMemcpyAsync(buf.penalties.get(), penalties_pinned_.get(),
                                   size_t(penalties) * sizeof(penalty_entry),
                                   cudaMemcpyHostToDevice, stream_));
  if (decode) {
    fwd_->enqueue_decode(l, l.seqs, graphs_->eager_path(l.seqs), penalties);
  } else {
    // Long steps with prompt tokens launch with PDL (forward_pass::prompt_pdl).
    const pdl_scope with_pdl(forward_pass::prompt_pdl(l.tokens));
    fwd_->enqueue_general(l, sampled, all_single, penalties);
  }
  fwd_->set_logprobs(true);
  // The fp8_e5m2 cache's overflow counts ride in the outputs: every step
  // copies them.
  if (sampled > 0 || kv_->e5m2())
    METRONOME_CUDA(cudaMemcpyAsync(host_.results[slot].get(), buf.outputs.get(),
                                   buf.outputs.bytes(), cudaMemcpyDeviceToHost, stream_));
}

// -- steps in flight ---------------------------------------------------------------------

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
  const int32_t max_batch = fwd_->max_batch();
  const flight f = std::move(flight_.front());
  // The step's timeout runs from its launch (a step queued behind another
  // waits for it within its own timeout).
  const double left = std::max(options_.limits.step_timeout_s() - oldest_age_s(), 1e-3);
  wait_event(step_done_[f.slot], left, "cuda runner step");
  flight_.erase(flight_.begin());
  engine_result result;
  const auto* out = host_.results[f.slot].get<unsigned char>();
  const auto* ids = reinterpret_cast<const int32_t*>(out);
  const auto* lp = reinterpret_cast<const float*>(out + size_t(max_batch) * 4);
  float device_ms = 0;
  if (cudaEventElapsedTime(&device_ms, step_start_[f.slot], step_done_[f.slot]) == cudaSuccess)
    result.device_ms = device_ms;
  else
    (void)cudaGetLastError(); // a timing that cannot be read is no step error
  result.tokens.assign(ids, ids + f.sampled);
  if (kv_->e5m2()) {
    const auto* counts = reinterpret_cast<const uint32_t*>(out + size_t(max_batch) * 8);
    result.kv_overflow.assign(counts, counts + 2 * size_t(f.seqs));
  }
  result.logprobs.assign(lp, lp + f.sampled);
  if (!f.logprobs.empty()) {
    const size_t stride = 1 + max_logprobs;
    const auto* lt = host_.logprob_results[f.slot].get<int32_t>();
    const auto* lv = reinterpret_cast<const float*>(lt + size_t(max_batch) * stride);
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

// -- between steps -----------------------------------------------------------------------

std::vector<float> cuda_engine::logits(int32_t rows) {
  require_idle("reading logits");
  rows = std::max(0, std::min(rows, fwd_->max_batch()));
  std::vector<float> out(size_t(rows) * size_t(model_->config.vocab_size));
  METRONOME_CUDA(cudaMemcpyAsync(out.data(), fwd_->buffers().logits.get(),
                                 out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  METRONOME_CUDA(cudaEventRecord(done_, stream_));
  wait_event(done_, options_.limits.step_timeout_s(), "logits copy");
  return out;
}

double cuda_engine::graph_replay_ms(int32_t batch, bool repeat_last_step) {
  const int32_t gi = graphs_->graph_index(batch);
  if (gi < 0 || (repeat_last_step && gi != last_graph_))
    return std::nan("");
  require_idle("graph timing");
  const auto& g = graphs_->decode_graphs()[size_t(gi)];
  if (repeat_last_step) {
    // Fed ids become the ids they stood for (the step before the last one
    // sampled them into the other slot's results): replays read the ids
    // their own sampling writes, and must rewrite the same keys and values.
    const step_layout l = packer_.decode_layout(g.size);
    const int32_t slot = 1 - next_slot_; // the last step's
    auto* ids = reinterpret_cast<int32_t*>(host_.staging[slot].get<unsigned char>() + l.ids);
    const auto* earlier = host_.results[1 - slot].get<int32_t>();
    for (int32_t r = 0; r < g.size; ++r)
      if (ids[r] < 0)
        ids[r] = earlier[-1 - ids[r]];
  } else {
    last_graph_ = -1; // the replays run on padding inputs
  }
  return graphs_->time(g.exec[repeat_last_step && next_slot_ == 0 ? 1 : 0], g.size,
                       !repeat_last_step);
}

std::string cuda_engine::weights_choice() const {
  const auto& q = model_->config.quantization;
  if (!q)
    return "bf16";
  const auto& fallbacks = weights_->int4_fallbacks();
  const size_t total = 4 * size_t(model_->config.num_layers);
  std::string s = "int4 (" + q->describe() + "): " + std::to_string(total - fallbacks.size())
                  + " of " + std::to_string(total) + " matrices in 4 bits";
  for (const auto& f : fallbacks)
    s += "; bf16 " + f;
  return s;
}

} // namespace metronome::gpu
