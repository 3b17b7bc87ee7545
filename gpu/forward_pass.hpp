#pragma once
// The forward pass: what one step enqueues on the engine's stream, from the
// input block's copy on the device to the sampled ids in the output block,
// over the activations and workspaces it owns.
//
// Design note. Two passes share the model's layers: the decode pass (one
// token per sequence, all sampled), whose projections run the fp32 GEMV with
// fused norms, the tensor-core skinny GEMM or cuBLAS (decode_path), and the
// general pass (prefill and mixed steps) on cuBLAS, where prompt chunks
// attend in the prefill kernel and one-token chunks in the decode kernel
// after one shared RoPE and cache write. Both read their inputs at the fixed
// offsets of a step_layout, so the same enqueue serves an eager step and a
// graph capture; nothing here synchronises or reads the host's clock. On the
// cuBLAS paths a projection into the residual may run as split-K partials
// that the next kernel reduces (split_choice, chosen at start-up by the
// startup_tuner). Called on the engine's thread only: while it captures
// graphs at start-up and for every step launched.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "gpu/collective.hpp"
#include "gpu/cuda_runner.hpp"
#include "gpu/device_memory.hpp"
#include "gpu/gemm_tuner.hpp"
#include "gpu/kernels.hpp"
#include "gpu/kv_pool.hpp"
#include "gpu/step_packer.hpp"
#include "gpu/weight_store.hpp"

namespace metronome::gpu {

/// How a decode step computes its projections: the fp32 GEMV with fused
/// norms (up to 8 tokens), the tensor-core skinny GEMM (up to 64), or cuBLAS.
enum class decode_path : uint8_t { gemv, skinny, blas };

/// How the cuBLAS paths of m tokens run three projections, each either
/// whole (0) or as s >= 1 split-K partials (gemm_tuner::run_split) that the
/// next kernel reduces where it reads them, so that no reduction launch is
/// needed: qkv's by the fused-RoPE attention; o's and down's by
/// launch_residual_rms_norm, which adds them into the residual and
/// normalises it for the next projection (whole: cuBLAS's epilogue adds,
/// then a norm launch). Chosen by timing at capture.
struct split_choice {
  int32_t qkv = 0, o = 0, down = 0;
};

/// The device buffers of the forward pass. The activations are scratch for
/// the startup_tuner's timings before any step; the engine copies each
/// step's inputs into `inputs` (and its penalty entries into `penalties`)
/// and its results out of `outputs` and `logprob_out`.
struct forward_buffers {
  // Activations [tokens][...] (logits and raw_logits [max_batch][vocab]).
  device_buffer x, xn, qkv, q, attn, gate_up, act, logits;
  // The model's log-probabilities (launch_model_logprobs): the asking rows'
  // logits before the penalties, their log-sum-exp, and per row the sampled
  // token then max_logprobs alternatives (ids, then values).
  device_buffer raw_logits, logits_lse, logprob_out;
  // The decode attention's split partials and their counters.
  device_buffer part_o, part_ml, split_counters;
  device_buffer sample_ws, cublas_ws;
  device_buffer skinny_partials, skinny_counters;
  // [max_gemm_splits][split_rows][max(hidden, qkv width)] fp32
  device_buffer split_partials;
  // The prefill attention's split-key partials (prefill_split): tiles x
  // splits <= prefill_split_parts, per head.
  device_buffer prefill_part_o, prefill_part_ml;
  // fp8 cache, GEMV and skinny paths: rotated k, v rows [max_batch][2][kv_size] fp32.
  device_buffer kv_stage;
  device_buffer kv_e5m2_rows; // kv_view::e5m2_rows (fp8_e5m2 only)
  // 4-bit models: the bf16 form of one 4-bit projection at a time, for the
  // paths that multiply bf16 matrices (weight_store::largest_int4 elements).
  device_buffer dequant;
  // One step's input block (the largest layout), its sampled ids and
  // log-probabilities ([max_batch] int32, then [max_batch] fp32), and its
  // penalty entries (grown on demand by the engine).
  device_buffer inputs, outputs, penalties;
};

/// The pinned host side of a step's blocks, per staging slot (two steps
/// in flight): the packed inputs, the sampled ids and log-probabilities,
/// and the model's log-probabilities where a row asks.
struct host_blocks {
  pinned_buffer staging[2], results[2], logprob_results[2];
};

class forward_pass {
public:
  /// Most split-K partials of one projection.
  static constexpr int32_t max_gemm_splits = 4;
  /// Tiles x splits the prefill attention's split scratch holds.
  static constexpr int32_t prefill_split_parts = 64;
  /// METRONOME_PDL=auto: steps with prompt tokens launch with PDL from this
  /// many rows (uncaptured long prefills, 1-6% faster with it); the mixed
  /// graphs and smaller steps without (7-15% faster without:
  /// bench/results/h200-2026-12-03-pdl.md).
  static constexpr int32_t prompt_pdl_min_rows = 320;

  /// Allocates the activations and workspaces for steps of up to
  /// max_num_batched_tokens tokens and max_batch_size sequences, and the
  /// gemm tuner on `cublas` (whose workspace it sets). The engine's
  /// constructor thread, with the device current.
  forward_pass(const model_config& config, const cuda_runner_options& options,
               const weight_store& weights, const kv_pool& kv, cudaStream_t stream,
               cublasHandle_t cublas, int32_t num_sms, bool kv_fp8);

  forward_pass(const forward_pass&) = delete;
  forward_pass& operator=(const forward_pass&) = delete;

  /// Allocates the step's device blocks: inputs of `input_bytes` (the
  /// largest layout), outputs, and the log-probabilities' results.
  void allocate_step_io(size_t input_bytes);

  /// Enqueues the decode forward of layout l (one token per sequence, all
  /// sampled): page updates, embedding, layers, LM head, sampling.
  void enqueue_decode(const step_layout& l, int32_t batch, decode_path path, int32_t penalties);

  /// Enqueues the general forward (prefill, mixed) of layout l; `sampled`
  /// rows reach the LM head and sampling.
  void enqueue_general(const step_layout& l, int32_t sampled, bool all_single, int32_t penalties);

  /// Whether the passes enqueued from now run launch_model_logprobs: every
  /// captured graph does (the default); an eager step only where a row asks.
  void set_logprobs(bool on) {
    enqueue_logprobs_ = on;
  }

  /// Whether a step with prompt tokens of `rows` rows launches with PDL:
  /// METRONOME_PDL on or late, or auto from prompt_pdl_min_rows.
  static bool prompt_pdl(int32_t rows);

  /// The split-K choice for m rows on the cuBLAS paths (none where the
  /// active kernels or the shapes rule them out).
  split_choice splits_of(int32_t m) const;

  /// The choices by rows, as the startup_tuner times them.
  std::map<int32_t, split_choice>& split_choices() {
    return splits_;
  }

  /// The attention shape of layer `layer_index` (its sliding window).
  attention_shape attention_of(int32_t layer_index) const;

  forward_buffers& buffers() {
    return buf_;
  }

  const forward_buffers& buffers() const {
    return buf_;
  }

  gemm_tuner& tuner() {
    return *tuner_;
  }

  /// Releases the gemm tuner before the cuBLAS handle it uses goes.
  void release_tuner() {
    tuner_.reset();
  }

  int32_t max_batch() const {
    return max_batch_;
  }

  int32_t max_tokens() const {
    return max_tokens_;
  }

  /// Rows up to which the projections may split (split_partials' rows).
  int32_t split_rows() const {
    return split_rows_;
  }

  int32_t num_sms() const {
    return num_sms_;
  }

  /// decode_attention_blocks_per_sm of layer 0's shape.
  int32_t attn_blocks_per_sm() const {
    return attn_blocks_per_sm_;
  }

  /// Whether the model's shapes suit the skinny GEMM.
  bool skinny_ok() const {
    return skinny_ok_;
  }

  /// Whether decode batches of n sequences may take the GEMV path: n <=
  /// gemv_max_m and, for 4-bit projections, launch_gemv_int4 takes them.
  bool gemv_ok(int32_t n) const;

  /// Bytes of the activations and of the workspaces (the memory plan).
  size_t activation_bytes() const;
  size_t workspace_bytes() const;

private:
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

  step_views views(const step_layout& l) const;
  void enqueue_sampling(const step_layout& l, int32_t rows, int32_t penalties);
  /// One projection of the skinny path.
  void skinny(gemv_epilogue ep, const gemv_args& a, const int4_weights* w4 = nullptr);
  /// Decode attention of `seqs` one-token sequences into attn. raw_qkv: qkv
  /// holds the projection before bias and RoPE (the cuBLAS path), which the
  /// fused kernel applies where it can (qkv_splits > 0: split_partials holds
  /// it as that many partials, for the fused kernel only); otherwise q holds
  /// q already rotated and the cache holds this step's k and v.
  void attend(const attention_shape& sh, const kv_view& kv, const batch_view& batch,
              int32_t seqs, bool raw_qkv, const bf16* qkv_bias = nullptr,
              int32_t qkv_splits = 0);
  /// How the prefill attention of `items` tiles (`busy` of them real; the
  /// rest a mixed graph's padding) splits its keys: over enough blocks for
  /// the busy tiles to fill the device (at most prefill_max_splits, items x
  /// splits within the scratch), or not at all.
  prefill_split prefill_split_of(int32_t items, int32_t busy) const;
  void gemm(const bf16* x, int32_t m, const bf16* w, int32_t n, int32_t k, void* y, bool y_f32,
            float beta);
  /// The bf16 form of a projection [n][k] for the paths that multiply bf16
  /// matrices: `w` itself, or for a 4-bit one (w4) its dequantization into
  /// buf_.dequant, enqueued now (so call it right before the product that
  /// reads it: the next 4-bit projection overwrites it).
  const bf16* dense(const bf16* w, const int4_weights& w4, int32_t n, int32_t k);
  /// Tensor parallelism: before a projection into the residual x of `rows`
  /// rows, ranks other than 0 clear x, so that what they add is their
  /// partial sum alone (rank 0 adds the residual, and the all-reduce then
  /// gives every rank residual + every partial).
  void clear_partial(int32_t rows);
  /// Tensor parallelism: sums x's first `rows` rows over the ranks.
  void reduce_residual(int32_t rows);
  /// Ends a projection of the cuBLAS paths whose input is in_x (k
  /// wide): x += in_x W^T (+ bias), then xn = RMSNorm(x) * norm. Under
  /// tensor parallelism the rank's partial is all-reduced before the norm
  /// (and splits must be 0: their reduction is fused into the norm).
  void project_residual(const bf16* in_x, int32_t m, const bf16* w, int32_t k,
                        const bf16* bias, int32_t splits, const bf16* norm);
  // Layer `layer`'s cache, with the step's overflow counters where the cache
  // is fp8_e5m2 (kv_view::overflow: in `outputs`, after the ids and
  // log-probabilities); clear_overflow zeroes them at a step's start.
  kv_view layer_kv(int32_t layer) const;
  void clear_overflow();

  const model_config& config_;
  const weight_store& weights_;
  const kv_pool& kv_;
  cudaStream_t stream_ = nullptr;
  int32_t num_sms_ = 0;
  // decode_attention_blocks_per_sm(layer 0's shape).
  int32_t attn_blocks_per_sm_ = 0;
  // kv_cache_dtype "fp8" or "fp8_e5m2": the pools hold fp8 bytes and scales
  // (kv_view::k8); the qkv GEMV and skinny GEMM leave the rotated rows in
  // kv_stage for the attention to quantise (kv_view::stage).
  bool kv_fp8_ = false;
  int32_t max_tokens_ = 0, max_batch_ = 0, max_splits_product_ = 0;
  int32_t split_rows_ = 0;
  bool skinny_ok_ = false;
  bool enqueue_logprobs_ = true;
  // Tensor parallelism: this rank's endpoint (null: the engine runs alone).
  collective* comm_ = nullptr;
  forward_buffers buf_;
  std::unique_ptr<gemm_tuner> tuner_;
  std::map<int32_t, split_choice> splits_;
};

} // namespace metronome::gpu
