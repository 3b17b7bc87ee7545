#pragma once
// The forward pass on one CUDA device: weights, activations, the paged KV
// pool, the captured decode graphs and the memory plan that sizes them.
//
// Design note. Every step's inputs (tokens, positions, sequence slots, page
// table updates, sampling settings) are packed by the host into one pinned
// block with a layout fixed by (tokens, sequences) capacities, copied to the
// device in one transfer and read by the kernels at fixed addresses. A decode
// step of B sequences is padded to the next captured size (1, 2, 4, 8, then
// steps of 8); pad rows decode a dummy token into a scratch page that no
// sequence owns. Its graph holds the input copy, the page-table update, the
// whole forward pass, sampling and the copy of ids back, so a decode step is
// one graph launch and one wait. Page tables live on the device per sequence
// slot and change only by the updates of each step.
//
// Two steps can be in flight (launch, then finish): each has its own pinned
// staging and result block (slots 0 and 1, alternating), and each decode
// size is captured twice, once per slot. A token the previous step samples
// reaches the next one on the device: the runner passes its row
// (engine_chunk::fed_row) and the embedding gather reads the id from that
// step's sampled ids, so the host never waits for it. A step with prompt
// chunks of up to 256 tokens in all beside at most max_batch_size - 4
// decodes replays a mixed graph, padded the same way to a grid of (decodes,
// prompt tokens) sizes: cuBLAS GEMMs, the flash-style attention for the
// chunks and the decode attention for the one-token rows, with padding items
// that return at once. Larger prompt steps run the same kernels uncaptured. The KV pool gets what the configured share of device memory
// leaves after weights, activations and (measured) graphs.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "gpu/cuda_runner.hpp"
#include "gpu/device_memory.hpp"
#include "gpu/gemm_tuner.hpp"
#include "gpu/kernels.hpp"
#include "model/model_weights.hpp"

namespace metronome::gpu {

/// One sequence's share of a step, as the runner describes it.
struct engine_chunk {
  int32_t slot = 0;
  int32_t start_pos = 0;                // tokens already cached
  std::span<const int32_t> tokens;      // tokens to compute; -1: fed (below)
  /// For a token of -1: the row of the previous step's sampled ids to read
  /// it from on the device (that step must be the last one launched).
  int32_t fed_row = -1;
  bool sample = false;                  // the chunk completes the sequence's tokens
  // Sampling (when sample).
  float temperature = 1.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  int32_t top_k = 0;
  /// sampling_params::logprobs: -1 none, else alternatives to report.
  int32_t logprobs = -1;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  uint64_t seed = 0;
  int32_t sample_step = 0;               // index in the random stream
  std::span<const penalty_entry> penalties; // row field ignored (set by the engine)
};

/// A page-table update: slot's entry `index` becomes `page`.
struct page_update {
  int32_t slot = 0;
  int32_t index = 0;
  int32_t page = 0;
};

/// What one step produced, in chunk order for the sampled chunks.
struct engine_result {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  /// Per sampled chunk: empty, or (where it asked) the sampled token's model
  /// log-probability, then its `logprobs` alternatives.
  std::vector<std::vector<token_logprob>> model_logprobs;
  /// Device time of the step in milliseconds: from its first operation on
  /// the stream to its last (CUDA event timing), so neither the host's share
  /// nor a wait behind the step before it counts.
  double device_ms = 0;
};

class cuda_engine {
public:
  /// Builds everything on options.device; see make_cuda_runner.
  cuda_engine(std::shared_ptr<const model_folder> model, const cuda_runner_options& options);
  ~cuda_engine();

  cuda_engine(const cuda_engine&) = delete;
  cuda_engine& operator=(const cuda_engine&) = delete;

  /// Runs one step and waits for its ids (bounded by the step timeout); none
  /// may be in flight.
  engine_result run(std::span<const engine_chunk> chunks, std::span<const page_update> updates);

  /// Enqueues one step and returns without waiting for it. At most two are
  /// in flight (std::logic_error beyond); a step with penalties only when
  /// none is (they share one pinned block). Throws std::invalid_argument for
  /// a step beyond the capacities, before enqueuing anything.
  void launch(std::span<const engine_chunk> chunks, std::span<const page_update> updates);

  /// Page-table entries one step's input block holds; a step with more
  /// launches only when none is in flight (they travel in a block of their
  /// own).
  int32_t update_capacity() const {
    return update_capacity_;
  }

  /// Tests and drills only: the next launch() first enqueues a kernel that
  /// reads an unmapped address (a sticky device error; model_runner::
  /// arm_device_fault). The caller's thread, as launch().
  void arm_device_fault() {
    fault_armed_ = true;
  }

  /// Steps launched and not yet finished.
  size_t in_flight() const {
    return flight_.size();
  }

  /// True when the oldest step in flight has finished (false when none is).
  bool oldest_done();

  /// Seconds since the oldest step in flight was launched (0 when none).
  double oldest_age_s() const;

  /// Waits for the oldest step in flight, at most until the step timeout after
  /// its launch (then cuda_error), and returns its ids; std::logic_error
  /// when none is in flight.
  engine_result finish();

  const model_config& config() const {
    return model_->config;
  }

  int32_t num_pages() const {
    return num_pages_;
  }

  int32_t page_size() const {
    return options_.limits.page_size;
  }

  int32_t max_seqs() const {
    return max_seqs_;
  }

  int32_t max_pages_per_seq() const {
    return page_stride_;
  }

  const cuda_runner_options& options() const {
    return options_;
  }

  /// The stream every step runs on, in launch order (the runner records its
  /// step notifier's events on it).
  cudaStream_t stream() const {
    return stream_;
  }

  const std::vector<memory_plan_entry>& memory_plan() const {
    return plan_;
  }

  /// Between steps (none in flight).
  void set_graphs(bool on) {
    graphs_enabled_ = on;
  }

  /// Between steps: whether steps with prompt chunks may replay the mixed
  /// graphs (when graphs are on and were captured).
  void set_mixed_graphs(bool on) {
    mixed_enabled_ = on;
  }

  /// Mixed graphs captured (both slots' twins count as one).
  size_t mixed_graph_count() const {
    return mixed_graphs_.size();
  }

  /// Steps that replayed a mixed graph since start-up.
  uint64_t mixed_launches() const {
    return mixed_launches_;
  }

  /// The first `rows` rows of the last step's logits (synchronous; tests).
  std::vector<float> logits(int32_t rows);

  /// Device time per step of the decode graph serving `batch` sequences,
  /// replayed back to back (no host work between steps): on padding inputs,
  /// or, with repeat_last_step, on the last step's own inputs (a decode
  /// step is idempotent: it rewrites the same keys and values and samples
  /// the same ids). NaN when no graph serves that size, or the last step
  /// was not that graph. Synchronous; between steps, on the runner's thread
  /// (benchmarks).
  double graph_replay_ms(int32_t batch, bool repeat_last_step);

  /// How a decode step computes its projections: the fp32 GEMV with fused
  /// norms (up to 8 tokens), the tensor-core skinny GEMM (up to 64), or cuBLAS.
  enum class decode_path : uint8_t { gemv, skinny, blas };

  /// Which path each captured decode batch size takes ("1:gemv,16:skinny,...").
  std::string small_batch_choice() const;

private:
  struct layer {
    const bf16* attn_norm = nullptr;
    const bf16* qkv = nullptr;
    const bf16* qkv_bias = nullptr;
    const bf16* o = nullptr;
    const bf16* o_bias = nullptr;
    const bf16* mlp_norm = nullptr;
    const bf16* gate_up = nullptr;
    const bf16* down = nullptr;
  };

  /// Offsets (bytes) of the per-step arrays for given capacities.
  struct layout {
    int32_t tokens = 0, seqs = 0, updates = 0, penalties = 0, items = 0;
    /// Of items, those a step is expected to fill (a mixed graph's capacity
    /// has room for more; its padding items return at once).
    int32_t busy_items = 0;
    /// One-token chunks of a step with prompt chunks (0 otherwise): their
    /// attention runs in the decode kernel over the `single_*` arrays.
    int32_t singles = 0;
    /// Items of the decode attention's work lists (balanced splits) over the
    /// batch (a decode step's) and over the singles; 0: none.
    int32_t work_items = 0, single_work_items = 0;
    size_t work = 0, single_work = 0;
    size_t header = 0, ids = 0, positions = 0, token_seq = 0;
    size_t seq_slot = 0, seq_q_start = 0, seq_len = 0, sample_src = 0;
    size_t single_slot = 0, single_q_start = 0, single_len = 0;
    size_t temperature = 0, top_p = 0, min_p = 0, top_k = 0, seed = 0, step = 0;
    size_t repetition = 0, frequency = 0, presence = 0, logprobs = 0;
    size_t update_data = 0, item_data = 0;
    size_t bytes = 0;
  };

  /// Device pointers of one layout at the input block.
  struct step_views {
    batch_view batch;
    /// The one-token chunks of a step with prompt chunks, as the decode
    /// attention reads a batch (their rows in the step's tokens).
    batch_view singles;
    const int32_t* ids = nullptr;
    const int32_t* sample_src = nullptr;
    const int32_t* header = nullptr; // [0] updates, [1] penalties
    const int32_t* updates = nullptr;
    const penalty_entry* penalties = nullptr;
    const prefill_item* items = nullptr;
    sample_rows sampling;
    const float* repetition = nullptr;
    const float* frequency = nullptr;
    const float* presence = nullptr;
    logprob_rows logprobs;
  };

  layout make_layout(int32_t tokens, int32_t seqs, int32_t updates, int32_t penalties,
                     int32_t items, int32_t singles = 0) const;
  step_views views(const layout& l) const;

  void upload_weights();
  void allocate_activations();
  void plan_kv_and_capture();
  void capture_graphs();
  /// Captures what `enqueue` launches (a step of layout l) into `out`,
  /// between the copy of its inputs from staging block `slot` and of its
  /// results to result block `slot`, and uploads it. Returns its node count.
  size_t capture(const layout& l, int32_t slot, graph_exec& out,
                 const std::function<void()>& enqueue);
  /// Captures the decode step of `batch` sequences copying its inputs from
  /// staging block `slot` and its ids to result block `slot`.
  size_t capture_one(int32_t batch, decode_path path, graph_exec& out, int32_t slot = 0);
  /// A captured step with prompt chunks: `singles` one-token rows (decodes,
  /// padded), at most mixed_max_chunks prompt chunks of `prompt` rows in all
  /// (padded), its items and sampling rows padded to their capacities.
  /// Launch gaps of the ~360 kernels of an uncaptured mixed step cost the
  /// 8B shape ~1.4 ms on the H200 (kernel sum 7.8 ms, wall 9.1 ms beside
  /// 64 decodes): every step that carries a prompt chunk was a long
  /// inter-token gap. Only small chunks (stall-free steps) are captured;
  /// larger ones run eagerly, where the gaps weigh little.
  struct mixed_graph {
    int32_t singles = 0, prompt = 0;
    graph_exec exec[2];
  };
  static constexpr int32_t mixed_max_chunks = 4;
  /// METRONOME_PDL=auto: steps with prompt tokens launch with PDL from this
  /// many rows (uncaptured long prefills, 1-6% faster with it); the mixed
  /// graphs and smaller steps without (7-15% faster without:
  /// bench/results/h200-2026-12-03-pdl.md).
  static constexpr int32_t prompt_pdl_min_rows = 320;
  /// Captures the mixed step of graph `m` (mixed_graphs_) through slot `slot`.
  size_t capture_mixed(const mixed_graph& m, graph_exec& out, int32_t slot);
  /// The layout of the mixed graph for `singles` one-token rows and `prompt`
  /// prompt rows.
  layout mixed_layout(int32_t singles, int32_t prompt) const;
  /// The (singles, prompt) sizes of the mixed graphs to capture, ascending.
  std::vector<std::pair<int32_t, int32_t>> mixed_sizes() const;
  /// The smallest mixed graph for a step (-1: none fits).
  int32_t mixed_index(int32_t singles, int32_t chunks, int32_t prompt, int32_t updates) const;
  /// Times g replayed back to back; pads the inputs first unless `pad` is false.
  double time_graph(const graph_exec& g, int32_t batch, bool pad = true);
  /// Whether `challenger` beats `incumbent` (graphs of `batch`) by
  /// pdl_margin over four timings each in alternating order, so that a drift
  /// within the start-up favours neither.
  bool wins_by_margin(const graph_exec& challenger, const graph_exec& incumbent, int32_t batch);

  /// Enqueues the decode forward (one token per sequence, all sampled).
  void enqueue_decode(const layout& l, int32_t batch, decode_path path, int32_t penalties);
  /// The path of an uncaptured decode step of `batch` sequences.
  decode_path eager_path(int32_t batch) const;
  /// Whether a step with prompt tokens of `rows` rows launches with PDL:
  /// METRONOME_PDL on or late, or auto from prompt_pdl_min_rows.
  static bool prompt_pdl(int32_t rows);
  /// One projection of the skinny path.
  void skinny(gemv_epilogue ep, const gemv_args& a);
  /// Decode attention of `seqs` one-token sequences into attn_. raw_qkv: qkv_
  /// holds the projection before bias and RoPE (the cuBLAS path), which the
  /// fused kernel applies where it can (qkv_splits > 0: split_partials_ holds
  /// it as that many partials, for the fused kernel only); otherwise q_ holds
  /// q already rotated and the cache holds this step's k and v.
  void attend(const attention_shape& sh, const kv_view& kv, const batch_view& batch,
              int32_t seqs, bool raw_qkv, const bf16* qkv_bias = nullptr,
              int32_t qkv_splits = 0);
  /// Enqueues an uncaptured step packed in staging slot `slot` with layout
  /// l: its input copy, the decode or general forward, the ids' copy back.
  void enqueue_eager(int32_t slot, const layout& l, int32_t sampled, int32_t penalties,
                     bool all_single, bool decode, bool any_logprobs);
  /// Enqueues page-table updates from big_updates_ (none in flight).
  void apply_page_updates(std::span<const page_update> updates);
  /// How the prefill attention of `items` tiles (`busy` of them real; the
  /// rest a mixed graph's padding) splits its keys: over enough blocks for
  /// the busy tiles to fill the device (at most prefill_max_splits, items x
  /// splits within the scratch), or not at all.
  prefill_split prefill_split_of(int32_t items, int32_t busy) const;
  /// Enqueues the general forward (prefill, mixed) for the layout's tokens.
  void enqueue_general(const layout& l, int32_t sampled, bool all_single, int32_t penalties);
  void enqueue_sampling(const layout& l, int32_t rows, int32_t penalties);
  void gemm(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, void* y, bool y_f32,
            float beta);
  /// Tunes the five projection shapes for m tokens (before capturing); for a
  /// decode batch or a mixed graph's rows, also chooses how the cuBLAS path
  /// splits its projections (splits_of).
  void tune_gemms(int32_t m);
  /// How the cuBLAS decode path of m tokens runs three projections, each
  /// either whole (0) or as s >= 1 split-K partials (gemm_tuner::run_split)
  /// that the next kernel reduces where it reads them, so that no reduction
  /// launch is needed: qkv's by the fused-RoPE attention; o's and down's by
  /// launch_residual_rms_norm, which adds them into the residual and
  /// normalises it for the next projection (whole: cuBLAS's epilogue adds,
  /// then a norm launch). Chosen by timing at capture.
  struct split_choice {
    int32_t qkv = 0, o = 0, down = 0;
  };
  split_choice splits_of(int32_t m) const;
  /// Ends a projection of the cuBLAS paths whose input is in_x (k
  /// wide): x += in_x W^T (+ bias), then xn_ = RMSNorm(x) * norm.
  void project_residual(const bf16* in_x, int32_t m, const bf16* w, int32_t k,
                        const bf16* bias, int32_t splits, const bf16* norm);

  /// Packs the step into pinned staging block `slot` with layout l;
  /// sequences past the chunks (up to l.seqs) become padding rows. With
  /// `mixed` (a mixed graph's layout) the padding is instead: one-token rows
  /// up to l.singles, empty prompt chunks, then one sequence holding the
  /// prompt rows left, and sampling rows up to l.seqs - 1; items past the
  /// step's are padding items.
  void pack(int32_t slot, const layout& l, std::span<const engine_chunk> chunks,
            std::span<const page_update> updates, std::span<const prefill_item> items,
            int32_t num_penalties, bool mixed = false);
  void require_idle(const char* what) const;
  void fill_pad_inputs(int32_t batch);

  kv_view kv_of(int32_t layer_index) const;
  attention_shape attention_of(int32_t layer_index) const;
  int32_t graph_index(int32_t batch) const;

  std::shared_ptr<const model_folder> model_;
  cuda_runner_options options_;
  int32_t num_sms_ = 0;
  // decode_attention_blocks_per_sm(layer 0's shape), set by allocate_activations.
  int32_t attn_blocks_per_sm_ = 0;
  // kv_cache_dtype "fp8": the pools hold e4m3 bytes and row scales
  // (kv_view::k8); the qkv GEMV and skinny GEMM leave the rotated rows in
  // kv_stage_ for the attention to quantise (kv_view::stage).
  bool kv_fp8_ = false;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  cudaEvent_t step_done_[2] = {nullptr, nullptr}; // per staging slot
  cudaEvent_t step_start_[2] = {nullptr, nullptr}; // per staging slot; with step_done_: device_ms
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<gemm_tuner> tuner_;

  // Weights.
  device_buffer weights_;
  std::vector<layer> layers_;
  const bf16* embed_ = nullptr;
  const bf16* final_norm_ = nullptr;
  const bf16* lm_head_ = nullptr;
  device_buffer inv_freq_;

  // Activations and workspaces.
  int32_t max_tokens_ = 0, max_batch_ = 0, max_splits_product_ = 0;
  device_buffer x_, xn_, qkv_, q_, attn_, gate_up_, act_, logits_;
  device_buffer part_o_, part_ml_, split_counters_, sample_ws_, cublas_ws_;
  device_buffer skinny_partials_, skinny_counters_;
  // [max_gemm_splits][split_rows_][max(hidden, qkv width)] fp32
  device_buffer split_partials_;
  int32_t split_rows_ = 0;
  // The prefill attention's split-key partials (prefill_split): tiles x
  // splits <= prefill_split_parts, per head.
  static constexpr int32_t prefill_split_parts = 64;
  device_buffer prefill_part_o_, prefill_part_ml_;
  // fp8 cache, GEMV and skinny paths: rotated k, v rows [max_batch][2][kv_size] fp32.
  device_buffer kv_stage_;
  std::map<int32_t, split_choice> splits_;
  static constexpr int32_t max_gemm_splits = 4;
  /// METRONOME_PDL=auto keeps a decode graph with PDL (then with late
  /// triggers) only if its mean of four timings beats the graph without by
  /// this fraction.
  static constexpr double pdl_margin = 0.01;
  bool skinny_ok_ = false; // the model's shapes suit the skinny GEMM
  device_buffer inputs_, outputs_;
  pinned_buffer staging_[2], results_[2]; // per slot: two steps in flight
  // The model's log-probabilities (launch_model_logprobs): the asking rows'
  // logits before the penalties, their log-sum-exp, and per row the sampled
  // token then max_logprobs alternatives (ids, then values), copied back
  // only for steps where a row asks.
  device_buffer raw_logits_, logits_lse_, logprob_out_;
  pinned_buffer logprob_results_[2];
  /// Whether the step being enqueued runs launch_model_logprobs: every
  /// captured graph does; an eager step only where a row asks.
  bool enqueue_logprobs_ = true;
  device_buffer penalties_dev_;
  pinned_buffer penalties_pinned_;
  // Page updates beyond a step's block (apply_page_updates; grown on demand).
  device_buffer big_updates_dev_;
  pinned_buffer big_updates_pinned_;
  std::vector<prefill_item> items_;
  size_t input_capacity_ = 0;
  int32_t update_capacity_ = 0, penalty_capacity_ = 0, item_capacity_ = 0;

  // KV pool and page tables.
  int32_t num_pages_ = 0, max_seqs_ = 0, page_stride_ = 0;
  device_buffer kv_pool_, page_table_;
  // One layer's share of kv_pool_: K then V ([pages + 1][kv_heads][page_size]
  // rows of head_dim bf16, or of head_dim bytes followed by the K and V row
  // scales with the fp8 cache).
  size_t kv_layer_bytes_ = 0;
  /// Bytes of one token row of one kv head, in K and in V each: head_dim
  /// bf16, or head_dim e4m3 and its scale.
  size_t kv_row_bytes() const;
  /// Bytes of one layer's pools for `pages` pages.
  size_t kv_layer_bytes(int64_t pages) const;

  /// One padded decode batch size and its captured step.
  struct decode_graph {
    int32_t size = 0;
    /// [slot]: the step copying through staging/result slot 0, and its twin
    /// through slot 1 (empty until captured).
    graph_exec exec[2];
    decode_path path = decode_path::blas;
    bool pdl = false;  // whether its launches use PDL (kernels.hpp)
    bool late = false; // and late triggers (late_triggers(), kernels.hpp)
    /// Both slots' graphs exist: steps of this size may replay it.
    bool captured() const {
      return exec[0] && exec[1];
    }
  };
  std::vector<decode_graph> graphs_; // ascending sizes

  std::vector<mixed_graph> mixed_graphs_; // by singles, then prompt
  bool mixed_enabled_ = true;
  uint64_t mixed_launches_ = 0;
  bool graphs_enabled_ = true;
  bool fault_armed_ = false; // arm_device_fault()
  int32_t last_graph_ = -1; // the graph the last step replayed (-1: none)

  /// Steps launched and not finished, oldest first.
  struct flight {
    int32_t slot = 0;
    int32_t sampled = 0;
    /// Per sampled row, the alternatives it asked for (-1: none); empty
    /// when no row asked, and then no log-probabilities were copied back.
    std::vector<int32_t> logprobs;
    std::chrono::steady_clock::time_point launched;
  };
  std::vector<flight> flight_; // at most two
  int32_t next_slot_ = 0; // the staging slot of the next step (after one: the last used 1 - it)

  std::vector<memory_plan_entry> plan_;
};

} // namespace metronome::gpu
