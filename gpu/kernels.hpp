#pragma once
// Launchers of the GPU executor's kernels, callable from host C++ (the engine
// and the kernel tests). Every launcher enqueues on `stream`, checks the launch
// and throws cuda_error on failure; none synchronises.
//
// Layouts (row-major throughout):
// - weights W [n][k] bf16 as Hugging Face stores them (y = x W^T);
// - the residual stream x [tokens][hidden] fp32; GEMM inputs bf16;
// - the KV cache of one layer: K and V pools [pages][kv_heads][page_size][head_dim] bf16,
//   so one (page, kv head) is a contiguous block of page_size * head_dim values;
// - a page table [slots][stride] int32 per sequence slot.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "gpu/step_inputs.hpp"

namespace metronome::gpu {

using bf16 = __nv_bfloat16;

// -- views passed to kernels by value ----------------------------------------------

/// One layer's KV pools and the page tables that index them.
struct kv_view {
  bf16* k = nullptr;
  bf16* v = nullptr;
  /// The cache's fp8 form, where k8 is set (k and v are then unused): the
  /// same pools in e4m3 bytes (model/dtype.hpp), and one float scale per
  /// (page, kv head, row) [pages][kv_heads][page_size] for each, so a row's
  /// values are its bytes times its scale (the row's largest |value| / 448:
  /// no row can overflow). Only the second-generation decode attention
  /// reads this form so far.
  uint8_t* k8 = nullptr;
  uint8_t* v8 = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
  /// fp8 form only: the bytes are e5m2 and each row's scale is its window's
  /// (kv_e5m2.cuh: kv_e5m2_window positions of a sequence share a power-of-
  /// two scale, which saturates what exceeds it), not e4m3 with the row's own.
  bool e5m2 = false;
  /// e5m2 only, or null: the step's counts of values the writers could not
  /// store, [batch rows][2] (saturated, not finite), by the sequence's index
  /// in the step's batch_view (seq_slot's order); zeroed by the step.
  uint32_t* overflow = nullptr;
  /// e5m2 only, for launch_rope_kv_write: scratch of [tokens][kv_heads][2]
  /// [2] floats (K, V; the row's largest |value| with infinity as the
  /// largest float, then its largest finite |value|).
  float* e5m2_rows = nullptr;
  /// fp8 only, on the GEMV and skinny decode paths: the qkv_rope epilogue
  /// leaves each token's rotated k and v rows here, [tokens][2][kv_heads]
  /// [head_dim] fp32 (a row's scale needs the whole row, which that
  /// epilogue spreads over warps), and the decode attention's block that
  /// holds the token quantises them into the cache before it reads.
  float* stage = nullptr;
  const int32_t* page_table = nullptr; // [slots][page_table_stride]
  int32_t page_table_stride = 0;
  int32_t page_size = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
};

/// The tokens and sequences of one step (device arrays).
struct batch_view {
  int32_t num_tokens = 0;
  int32_t num_seqs = 0;
  const int32_t* positions = nullptr;   // [num_tokens] position of each token
  const int32_t* token_seq = nullptr;   // [num_tokens] batch index of each token
  const int32_t* seq_slot = nullptr;    // [num_seqs] page-table row of each sequence
  const int32_t* seq_q_start = nullptr; // [num_seqs + 1] first token row of each sequence
  const int32_t* seq_len = nullptr;     // [num_seqs] KV length after this step
  /// The decode attention's work list (balanced splits), or null for its
  /// device rule. With it the grid is (kv heads, work_items) and block
  /// (h, x) takes work[x]: -1 (nothing), or seq << 16 | splits << 8 | split,
  /// each sequence's items contiguous, as decode_attention_work() makes them.
  const int32_t* work = nullptr;
  int32_t work_items = 0;
};

/// Attention shapes shared by the decode and prefill kernels.
struct attention_shape {
  int32_t num_heads = 0;
  int32_t kv_heads = 0;
  int32_t head_dim = 0;
  /// Sliding window (keys j with pos - window < j <= pos); 0 = none.
  int32_t window = 0;
  float scale = 1.0f;
};

// -- elementwise -----------------------------------------------------------------------

/// x[t] = float(table[id]) for t < rows, with id = ids[t], or, where ids[t]
/// is negative, fed[-1 - ids[t]]: a token the previous step sampled on the
/// device (fed may be null when no id is negative).
void launch_embed(const bf16* table, const int32_t* ids, const int32_t* fed, int32_t rows,
                  int32_t hidden, float* x, cudaStream_t stream);

/// out[r] = bf16(x[src] * rsqrt(mean(x[src]^2) + eps) * weight) with
/// src = row_map ? row_map[r] : r.
void launch_rms_norm(const float* x, const int32_t* row_map, const bf16* weight, float eps,
                     int32_t rows, int32_t n, bf16* out, cudaStream_t stream);

/// x[r] += sum over s < splits of partials[s][r] (+ bias), then out[r] =
/// bf16(RMSNorm(x[r]) * weight), in one launch: the reduction of a projection
/// split along k (gemm_tuner::run_split) fused with the residual add and the
/// next norm. partials is [splits][rows][n] fp32: the splits rows * n
/// elements apart, as gemm_tuner::run_split writes them for m = rows
/// (1 to 4 splits).
void launch_residual_rms_norm(const float* partials, int32_t splits, const bf16* bias, float* x,
                              const bf16* weight, float eps, int32_t rows, int32_t n, bf16* out,
                              cudaStream_t stream);
/// Whether launch_residual_rms_norm takes rows of n (n % 4 == 0, n <= 8,192).
bool residual_rms_norm_supports(int32_t n);

/// Splits qkv [tokens][q + 2 kv] (plus bias), rotates q and k (Hugging Face
/// half-split RoPE with inv_freq [head_dim / 2]) and writes q to q_out
/// [tokens][q] and k, v into the paged cache at each token's position (into
/// its fp8 form where kv.k8 is set: each row's scale, then its bytes;
/// head_dim <= 128).
void launch_rope_kv_write(const bf16* qkv, const bf16* bias, const float* inv_freq,
                          const batch_view& batch, const kv_view& kv, int32_t num_heads,
                          bf16* q_out, cudaStream_t stream);

/// act[t][j] = bf16(silu(gu[t][j]) * gu[t][inter + j]).
void launch_swiglu(const bf16* gate_up, int32_t rows, int32_t inter, bf16* act,
                   cudaStream_t stream);

/// x[t][i] += bias[i].
void launch_add_bias(float* x, const bf16* bias, int32_t rows, int32_t n, cudaStream_t stream);

/// Applies page-table updates (slot, index, page) triples; the count is read
/// from device memory (*count), at most `capacity` are applied.
void launch_page_updates(int32_t* page_table, int32_t stride, const int32_t* updates,
                         const int32_t* count, int32_t capacity, cudaStream_t stream);

/// Fills n int32 with value.
void launch_fill_i32(int32_t* p, int64_t n, int32_t value, cudaStream_t stream);

/// Fault injection only: one thread reads an unmapped device address, a
/// sticky error (cudaErrorIllegalAddress) for the context and every later
/// call on it.
void launch_invalid_read(cudaStream_t stream);

/// Converts n elements of fp16 (src_is_f16) or fp32 to bf16.
void launch_to_bf16(const void* src, bool src_is_f16, int64_t n, bf16* dst, cudaStream_t stream);

/// Fills n bf16 with a NaN pattern / n floats with NaN (tests poison outputs).
void launch_poison(void* p, size_t bytes, cudaStream_t stream);

// -- matrix-vector products for small batches (m <= 8) ----------------------------------

/// What a GEMV does with the two output rows each warp computes.
enum class gemv_epilogue : uint8_t {
  /// out_f32[t][r] = y (+ bias).
  store_f32,
  /// residual[t][r] += y (+ bias).
  residual_add,
  /// rows (j, inter + j): out_bf16[t][j] = silu(y_j) * y_{inter + j}.
  swiglu,
  /// rows of the fused qkv projection: bias, RoPE, q to q_out, k/v into the cache.
  qkv_rope,
};

/// A GEMV y[t] = W x[t] over m <= 8 tokens with a fused prologue/epilogue
/// (also the arguments of the skinny GEMM, up to 64 tokens).
struct gemv_args {
  const bf16* w = nullptr; // [n][k]
  int32_t n = 0;
  int32_t k = 0;
  int32_t m = 1; // tokens: 1 to 8 (GEMV), 1 to 64 (skinny GEMM)
  const bf16* bias = nullptr; // [n] or null
  // Input: bf16 x [m][k], or the fp32 residual [m][k] normalised on the fly.
  const bf16* x = nullptr;
  const float* residual_in = nullptr;
  const bf16* norm_weight = nullptr;
  float eps = 1e-6f;
  // Outputs.
  float* out_f32 = nullptr;  // store_f32 [m][n], residual_add [m][n]
  bf16* out_bf16 = nullptr;  // swiglu [m][n / 2], qkv_rope: q [m][num_heads * head_dim]
  // qkv_rope only.
  const float* inv_freq = nullptr;
  batch_view batch;
  kv_view kv;
  int32_t num_heads = 0;
};

void launch_gemv(gemv_epilogue epilogue, const gemv_args& args, cudaStream_t stream);

/// Largest m the GEMV supports.
constexpr int32_t gemv_max_m = 8;

// -- 4-bit weights (W4A16; gpu/int4_layout.hpp) --------------------------------------------

/// A 4-bit matrix [n][k] on the device, in int4_layout's form: w[r][perm[j]] =
/// scale(r, g) * (q(r, j) - zero(r, g)), g = j / group_size.
struct int4_weights {
  const uint32_t* q = nullptr;     // [n][k / 8], nibble e of word j: stored column 8j + e
  const uint32_t* sz = nullptr;    // [n][groups]: fp16 scale bits | zero << 16
  const int32_t* perm = nullptr;   // [k] or null: stored column j is input perm[j]
  int32_t group_size = 0;          // stored columns per group, a multiple of 32
  int32_t groups = 0;

  explicit operator bool() const {
    return q != nullptr;
  }
};

/// Whether launch_gemv_int4 takes m tokens of k inputs with `epilogue`: their
/// bf16 staging fits one block's shared memory, or (any epilogue but
/// qkv_rope) that of 4 tokens, which it then runs as launches of 4 tokens
/// each (the 8B shape's down projection at 5-8 tokens). Host arithmetic;
/// any thread.
bool gemv_int4_takes(gemv_epilogue epilogue, int32_t m, int32_t k);

/// The decode GEMV (launch_gemv's arguments, epilogues and prologue; args.w
/// unused) on 4-bit weights: each weight dequantized in registers, in fp32,
/// exactly. m <= 8, k a multiple of 32; cuda_error where gemv_int4_takes is
/// false.
void launch_gemv_int4(gemv_epilogue epilogue, const gemv_args& args, const int4_weights& w,
                      cudaStream_t stream);

/// Whether launch_gemv_int4 runs `w` (k inputs) on the tensor-core
/// generation (gemv_int4_tc.cu's note): the active generation is 2 and k and
/// the group size are multiples of 128; otherwise the fp32 one. Any thread.
bool gemv_int4_tensor_cores(const int4_weights& w, int32_t k);

/// out [n][k] = bf16 of the dequantized weights, in the inputs' own order:
/// what the cuBLAS and tensor-core paths read in place of a bf16 matrix.
void launch_dequantize_int4(const int4_weights& w, int32_t n, int32_t k, bf16* out,
                            cudaStream_t stream);

// -- tensor-core GEMM for decode batches of up to 64 tokens ------------------------------

/// Largest m the skinny GEMM supports.
constexpr int32_t skinny_gemm_max_m = 64;

/// Scratch the skinny GEMM needs to split k across blocks.
struct skinny_gemm_workspace_size {
  size_t partial_bytes = 0;
  int32_t counters = 0;
};

/// Device scratch for the skinny GEMM: partial sums and one counter per row
/// group (zero at first use; every launch leaves them at zero). With too
/// little (or none) the launch does not split k: slower, never wrong.
struct skinny_gemm_scratch {
  float* partials = nullptr;
  size_t partial_bytes = 0;
  int32_t* counter_data = nullptr;
  int32_t counters = 0;
};

/// Whether the skinny GEMM takes this shape (k a multiple of 16; for
/// qkv_rope, n whole heads of an even head_dim).
bool skinny_gemm_supports(gemv_epilogue epilogue, int32_t n, int32_t k, int32_t head_dim);

/// Scratch that launches of up to max_m tokens of this shape use (queries
/// the current device).
skinny_gemm_workspace_size skinny_gemm_workspace(gemv_epilogue epilogue, int32_t n, int32_t k,
                                                 int32_t max_m);

/// How many blocks share each row group's k (1: no split; benchmarks).
int32_t skinny_gemm_splits(gemv_epilogue epilogue, int32_t n, int32_t k, int32_t m);

/// y[t] = W x[t] for 1 <= m <= 64 tokens on tensor cores, with the GEMV's
/// epilogues (gemv_args; x must be bf16: no norm prologue; w and x 16-byte
/// aligned). Deterministic. Throws cuda_error on arguments it cannot take.
void launch_skinny_gemm(gemv_epilogue epilogue, const gemv_args& args,
                        const skinny_gemm_scratch& scratch, cudaStream_t stream);

/// Whether launch_skinny_gemm_int4 takes `w` with k inputs: k and the group
/// size multiples of 32, no act-order permutation (those run dequantized).
/// Any thread.
bool skinny_gemm_int4_takes(const int4_weights& w, int32_t k);

/// launch_skinny_gemm on 4-bit weights (args.w unused): the nibbles turned
/// into bf16 (q - zero) in registers, exactly, and each group's fp16 scale
/// applied to its fp32 sums. Deterministic; the same split-k scratch as the
/// bf16 form (skinny_gemm_workspace). Throws cuda_error where
/// skinny_gemm_int4_takes is false or launch_skinny_gemm would throw.
void launch_skinny_gemm_int4(gemv_epilogue epilogue, const gemv_args& args,
                             const int4_weights& w, const skinny_gemm_scratch& scratch,
                             cudaStream_t stream);

// -- attention ---------------------------------------------------------------------------

/// Blocks of the decode attention for `shape` that one SM holds at once (the
/// occupancy of its kernels, with and without the fused RoPE: the smaller),
/// reading the bf16 cache or (fp8) its fp8 form, whose kernels need fewer
/// registers. Needs the device current on the calling thread; any thread.
int32_t decode_attention_blocks_per_sm(const attention_shape& shape, bool fp8 = false);

/// Splits along the context the decode kernel will use for `num_seqs`
/// sequences on `num_sms` SMs that hold `blocks_per_sm` of its blocks each
/// (decode_attention_blocks_per_sm). Host arithmetic only; any thread.
int32_t decode_attention_splits(const attention_shape& shape, int32_t num_seqs,
                                int32_t num_sms, int32_t blocks_per_sm);

/// Size of the decode attention's work list (batch_view::work) for a batch
/// of num_seqs sequences (padding rows included), or 0 where the kernel
/// keeps its device rule (small batches, the first generation). Host
/// arithmetic only; any thread.
int32_t decode_attention_work_items(const attention_shape& shape, int32_t num_seqs,
                                    int32_t num_sms, int32_t blocks_per_sm);

/// Most splits a work list gives one sequence: the `splits` (partials'
/// stride) to launch a listed batch with.
int32_t decode_attention_work_splits();

/// Fills the work list `work` [items] for the batch's KV lengths seq_len
/// [num_seqs] (balanced splits: see its design note) and returns the items
/// used; the rest become -1. Throws cuda_error when `items`
/// (decode_attention_work_items) cannot hold them. Host only; any thread.
int32_t decode_attention_work(const attention_shape& shape, const int32_t* seq_len,
                              int32_t num_seqs, int32_t num_sms, int32_t blocks_per_sm,
                              int32_t* work, int32_t items);

/// Warps a block of the decode kernel: 4, or 2 where the grid of num_seqs x
/// kv_heads x splits blocks needs more than one wave of 4-warp blocks
/// (blocks_per_sm of them an SM, as for decode_attention_splits) and at
/// least twice the waves of 2-warp blocks (twice as many an SM).
/// METRONOME_KERNELS=awarps=2 or 4 forces either. Host arithmetic only; any
/// thread.
int32_t decode_attention_warps(const attention_shape& shape, int32_t num_seqs, int32_t splits,
                               int32_t num_sms, int32_t blocks_per_sm);

/// Paged decode attention: one query token per sequence (the token at
/// position seq_len - 1, row seq_q_start of q) into out [tokens][heads * head_dim].
/// Up to `splits` parts of the context are computed in parallel (partials in
/// part_o [seqs][heads][splits][head_dim] and part_ml [seqs][heads][splits][2])
/// and merged by the last part to finish; counters (one int32 per sequence and
/// kv-head block, at least seqs * num_heads) must start at zero and are left
/// at zero. `warps` (2 or 4: decode_attention_warps) a block; the first
/// generation ignores it. The output's bits depend on splits and warps (the
/// order of the softmax merges) and on nothing else: the same every run.
/// Reads the cache's fp8 form where kv.k8 is set (the second generation).
void launch_decode_attention(const attention_shape& shape, const bf16* q, const kv_view& kv,
                             const batch_view& batch, int32_t splits, int32_t warps,
                             float* part_o, float* part_ml, int32_t* counters, bf16* out,
                             cudaStream_t stream);

/// The raw qkv projection of a decode step, for decode attention with RoPE
/// and the cache write fused in.
struct rope_input {
  const bf16* qkv = nullptr;       // [tokens][(heads + 2 kv_heads) * head_dim], before bias and RoPE
  const bf16* bias = nullptr;      // [(heads + 2 kv_heads) * head_dim], or null
  const float* inv_freq = nullptr; // [head_dim / 2]
  /// Instead of qkv: the projection split along k (gemm_tuner::run_split),
  /// `splits` fp32 blocks `split_stride` elements apart, each laid out as qkv.
  /// The kernel sums them and rounds to bf16, the projection qkv would hold.
  const float* partials = nullptr;
  int32_t splits = 0;
  int64_t split_stride = 0;
};

/// Whether launch_decode_attention_rope serves `shape` with the active kernels
/// (METRONOME_KERNELS=rope=1 turns it off for A/B runs); otherwise a step runs
/// launch_rope_kv_write, then launch_decode_attention.
bool decode_attention_fuses_rope(const attention_shape& shape);

/// launch_rope_kv_write and launch_decode_attention in one kernel, for steps
/// whose every sequence has one token, at position seq_len - 1 (seq_len >= 1).
/// q is rotated as it is loaded (no q_out is written), and the block that
/// reads the current token's cache row writes its rotated k and its v there
/// first: the same arithmetic and the same cache contents as the two kernels.
/// Called on the executor's thread, while a step is enqueued or captured.
void launch_decode_attention_rope(const attention_shape& shape, const rope_input& rope,
                                  const kv_view& kv, const batch_view& batch, int32_t splits,
                                  int32_t warps, float* part_o, float* part_ml,
                                  int32_t* counters, bf16* out, cudaStream_t stream);

/// Query rows per prefill tile of the active prefill kernel (64 or 128); the
/// host cuts each prompt chunk into items of this many rows.
int32_t prefill_tile_rows();

/// The smallest tile any prefill kernel uses (sizes the item arrays).
constexpr int32_t prefill_min_tile = 64;

/// Splitting each tile's keys over `splits` blocks (the second generation):
/// when few tiles (a short chunk) attend to a long context, one block per
/// tile and head would leave most of the device idle; a second launch merges
/// the splits. Scratch for num_items x heads x splits partial tiles: o (tile
/// rows x head_dim fp32) and ml (tile rows x 2 fp32), read and written only
/// by the two launches of one call (a later call on the same stream may
/// reuse it).
struct prefill_split {
  float* o = nullptr;
  float* ml = nullptr;
  int32_t splits = 1;
};

/// The most splits a tile's keys are cut into.
constexpr int32_t prefill_max_splits = 8;

/// Flash-style causal attention of every token of the step over its
/// sequence's cached keys (chunked prefill continues from cached pages), from
/// the bf16 cache or its fp8 form (kv.k8; head_dim <= 128, the second
/// generation).
void launch_prefill_attention(const attention_shape& shape, const bf16* q, const kv_view& kv,
                              const batch_view& batch, const prefill_item* items,
                              int32_t num_items, bf16* out, cudaStream_t stream,
                              const prefill_split& split = {});

/// Whether the attention kernels support this head_dim.
bool attention_supports_head_dim(int32_t head_dim);

// -- kernel generations ------------------------------------------------------------------

/// Which generation of the GEMV and attention kernels the launchers above use.
/// 2 (the default) is current; 1 is the first version, kept so a benchmark
/// can compare both in one run and as a fallback. Process-wide; the server
/// never changes it (no environment is read for it). Tests and benchmarks
/// may change it between launches (gpu_bench and gpu_tests take
/// METRONOME_KERNELS, bench/gpu/environment_switches.hpp), never while an
/// engine enqueues a step or captures graphs; an engine sizes its split-K
/// buffers and prefill items for the generation active when it starts.
struct kernel_generations {
  int gemv = 2;
  int decode_attention = 2;
  int prefill_attention = 2;
  int decode_rope = 2; // 1: RoPE as its own kernel before the decode attention
  /// The 4-bit GEMV: 2 on tensor cores where the groups allow, 1 in fp32 on
  /// the CUDA cores always (gemv_int4_tc.cu, gemv_int4.cu).
  int gemv_int4 = 2;
  /// The cuBLAS decode path's split-K projections (cuda_engine::splits_of):
  /// 1 never, 2 where timing favours them, 3 always (2 splits where k allows;
  /// tests).
  int gemm_splits = 2;
  /// Warps a block of the decode attention: 0 by decode_attention_warps's
  /// rule, 2 or 4 forced (awarps=2, awarps=4).
  int attention_warps = 0;
  /// Which once-read streams carry the L2 evict-first hint (stream_hint in
  /// launch.cuh): all by default (METRONOME_STREAM_HINTS in benchmarks).
  unsigned stream_hints = 7;
};
kernel_generations& active_kernels();

/// The benchmark switch METRONOME_KERNELS's syntax (e.g. "gemv=1,decode=2,
/// prefill=2,rope=1,int4=1", any subset): comma-separated key=value items; items it does
/// not understand are left out of the result and appended to ignored_items
/// (if given), in order. Any thread.
kernel_generations parse_kernel_generations(const std::string& spec,
                                            std::vector<std::string>* ignored_items);

// -- programmatic dependent launch ---------------------------------------------------------

/// How launches on a stream use programmatic dependent launch (launch.cuh):
/// per_graph unless a benchmark or a test sets another with set_pdl_mode()
/// (gpu_bench and gpu_tests take METRONOME_PDL: "0" (off, false, no) off
/// everywhere, "1" (on, true, yes) on everywhere, unset or "auto"
/// per_graph; the server reads no environment for it). per_graph: off except
/// where an engine turns it on with a pdl_scope: in long steps with prompt
/// tokens (cuda_engine::prompt_pdl), and in the decode
/// graphs that win with it: where a batch size takes the GEMV path, the
/// engine times that graph with and without PDL at start-up (four
/// alternating timings each) and keeps PDL if it wins by 1% (a fixed
/// choice was a loss at one shape or another), then that graph again with late
/// triggers (late_triggers()), kept if they win by 1% too. "late": on
/// everywhere, with late triggers.
enum class pdl_mode { off, on, per_graph, late };
pdl_mode pdl_setting();

/// Benchmarks and tests only, before any engine starts: the process's PDL
/// mode from now on.
void set_pdl_mode(pdl_mode mode);

/// The benchmark switch METRONOME_PDL's syntax (value may be null: unset);
/// *ignored_value tells
/// whether the value was not understood (and auto used). Any thread.
pdl_mode parse_pdl_mode(const char* value, bool* ignored_value);

/// Whether a kernel launched now from this thread on a stream uses PDL: the
/// innermost live pdl_scope's choice, else pdl_setting() is on or late.
bool pdl_active();

/// Sets one launch choice (Choice: pdl_choice, late_trigger_choice) for the
/// launches of this thread while alive (an engine capturing one decode
/// graph); nests. Not for use while another thread's launches should see it:
/// the choice is per thread.
template <class Choice>
class launch_choice_scope {
public:
  explicit launch_choice_scope(bool on);
  ~launch_choice_scope();
  launch_choice_scope(const launch_choice_scope&) = delete;
  launch_choice_scope& operator=(const launch_choice_scope&) = delete;

private:
  int saved_;
};

/// PDL for this thread's launches while alive (pdl_active()).
struct pdl_choice;
using pdl_scope = launch_choice_scope<pdl_choice>;

/// Late triggers: the residual-adding GEMVs (o, down), which otherwise never
/// launch early, launch with PDL like the rest, and the kernels right before
/// them (the decode attention and the SwiGLU GEMV) trigger their dependents
/// at the end of each block's work instead of right after their wait, so the
/// o and down grids become resident as the kernel before them drains and
/// request their first weights while it finishes. Batch 1, 1B shape: 3% less
/// time a step; 8B: 2.4 to 2.8% more (H200); so the engine times it per
/// decode graph. Only where PDL is active. The innermost
/// live late_trigger_scope's choice, else pdl_setting() == late. Any thread.
bool late_triggers();

/// Late triggers for this thread's launches while alive (late_triggers()).
struct late_trigger_choice;
using late_trigger_scope = launch_choice_scope<late_trigger_choice>;

// -- sampling ----------------------------------------------------------------------------

/// Per-row sampling settings (device arrays of `rows` entries).
struct sample_rows {
  const float* temperature = nullptr;
  const float* top_p = nullptr;
  const float* min_p = nullptr;
  const int32_t* top_k = nullptr;
  const uint64_t* seed = nullptr;
  const int32_t* step = nullptr; // index in the sequence's random stream
};

/// Applies repetition, frequency and presence penalties in place (count read
/// from device memory, at most `capacity` entries).
void launch_penalties(float* logits, int32_t vocab, const penalty_entry* entries,
                      const int32_t* count, int32_t capacity, const float* repetition,
                      const float* frequency, const float* presence, cudaStream_t stream);

/// Device scratch launch_sample needs for `rows` rows.
size_t sample_workspace_bytes(int32_t rows);

/// The model's log-probabilities for the rows that ask for them
/// (sampling_params::logprobs; model/sampling.hpp's design note).
struct logprob_rows {
  /// Per row: -1 none, else how many alternatives (at most max_logprobs).
  const int32_t* count = nullptr;
  /// [rows][vocab] scratch: the rows' logits as the model made them.
  float* raw = nullptr;
  /// [rows] scratch: log(sum(exp(raw))).
  double* lse = nullptr;
  /// [rows][1 + max_logprobs]: the sampled token, then the alternatives,
  /// most likely first (ties by index).
  int32_t* tokens = nullptr;
  float* values = nullptr;
};

/// Before the penalties: for each row that asks, keeps its logits in
/// lp.raw, their log-sum-exp, and its lp.count most likely tokens with their
/// log-probabilities (from entry 1 of its lp.tokens / lp.values row). Rows
/// that do not ask return at once (the kernel sits in every decode graph).
void launch_model_logprobs(const float* logits, int32_t rows, int32_t vocab,
                           const logprob_rows& lp, cudaStream_t stream);

/// Samples one token per row of logits [rows][vocab] (modified in place) with
/// the semantics of sequence_sampler; writes token ids and log-probabilities.
/// With `lp` (launch_model_logprobs ran before), rows that ask also get the
/// sampled token's model log-probability in entry 0 of their lp row.
void launch_sample(float* logits, int32_t rows, int32_t vocab, const sample_rows& params,
                   int32_t* tokens, float* logprobs, void* workspace, cudaStream_t stream,
                   const logprob_rows* lp = nullptr);

} // namespace metronome::gpu
