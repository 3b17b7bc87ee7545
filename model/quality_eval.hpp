#pragma once
// What a precision costs a model: held-out perplexity, KL divergence to the
// baseline's next-token distributions and top-1 agreement, measured with the
// CPU reference engine (`metronome eval-quality`, docs/performance.md,
// "Quality of the precisions").
//
// Design note. The baseline is the model as stored (its float weights) with
// the CPU engine's fp32 KV cache. Each variant changes one thing: the
// projections quantized at load (int4 RTN, AWQ or GPTQ layout, group 128) or
// the cache rounded as fp8 (e4m3 rows) or fp8_e5m2 stores it. One engine per
// variant and one for the baseline run in lockstep over the same windows,
// teacher-forced: a window's first token (BOS) is prefilled, then every
// later token is decoded one at a time at its position, so each position's
// logits come from attention over the cache as written, its earlier keys
// and values read back rounded exactly as a decode step reads them. Each
// step compares every variant's distribution with the baseline's at once,
// so no logits are kept. Windows are decoded `batch` at a time (one row
// each per call; the engine gives a sequence the same logits alone or
// batched), and the statistics are summed in window order, so the numbers
// do not depend on the batch or the thread count. Nothing here is tuned on
// the numbers it reports.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/cpu_ops.hpp"
#include "model/dtype.hpp"
#include "model/quantization_config.hpp"
#include "model/weight_quantization.hpp"

namespace metronome {

class tokenizer;

/// One precision measured against the baseline.
struct quality_variant {
  std::string name;
  /// int4: every decoder projection quantized at load (round to nearest,
  /// group 128, model/rtn_quantize.hpp) in `int4_layout`.
  weight_quantization weights = weight_quantization::none;
  quant_method int4_layout = quant_method::awq;
  /// bf16 keeps the CPU's fp32 cache unrounded (cpu_engine::set_kv_dtype).
  kv_cache_dtype_kind kv = kv_cache_dtype_kind::bf16;
};

/// The variants by name: "baseline" (the baseline once more: KL 0 and
/// agreement 1 check the measurement itself), "int4-awq" (what `--quantize
/// int4` serves), "int4-gptq" (RTN into GPTQ v1's symmetric layout), "kv-fp8"
/// (e4m3 rows), "kv-fp8_e5m2". nullopt for any other name.
std::optional<quality_variant> quality_variant_named(std::string_view name);

/// All the names quality_variant_named knows, "baseline" first.
const std::vector<std::string>& quality_variant_names();

/// One teacher-forced window: ids[0] (BOS) is given, each later id is
/// predicted from those before it.
struct quality_window {
  std::string source; ///< where it was cut from (a corpus name), for messages
  std::vector<int32_t> ids;
};

/// The windows of held_out.json's "test" object (tools/default_model_held_out.py
/// or tools/train_default_model.py write it: corpus name -> paragraphs), as
/// tools/golden/default_model_reference.py scores them: per corpus, in the
/// file's order, the paragraphs encoded without special tokens, each followed
/// by EOS, then BOS + each run of window - 1 tokens (the last run shorter).
/// Throws model_error naming the file and the field (a missing "test", a
/// paragraph that is not a string, a tokenizer without BOS or EOS) and
/// std::invalid_argument for a window below 2.
std::vector<quality_window> held_out_windows(const std::filesystem::path& held_out,
                                             const tokenizer& tok, int32_t window);

/// The figures of one engine over all positions.
struct quality_result {
  std::string name;
  /// What the weights are (model_folder::weights_description) and the KV
  /// cache's element type ("fp32" for the baseline's).
  std::string weights, kv;
  int64_t positions = 0;
  double nll = 0;         ///< sum of -log p(the next token)
  double kl = 0;          ///< sum of KL(baseline || this), nats
  double kl_p99 = 0;      ///< 99th percentile of one position's KL (nearest rank)
  double kl_max = 0;
  int64_t agree = 0;      ///< positions whose argmax is the baseline's
  int64_t correct = 0;    ///< positions whose argmax is the next token
  /// fp8_e5m2: values that saturated or were not finite, summed over the
  /// windows, and the windows with any.
  kv_overflow_count overflow;
  int64_t windows_overflowed = 0;

  double perplexity() const;
  double mean_kl() const;
  double agreement() const;
  double accuracy() const;
};

struct quality_report {
  quality_result baseline; ///< kl and agree against itself: 0 and all
  std::vector<quality_result> variants;
  int64_t windows = 0;
  int32_t max_window = 0;
  double seconds = 0;
};

struct quality_options {
  /// Windows decoded together (each engine's cache holds this many).
  int32_t batch = 16;
  /// Called on the caller's thread after each step with the positions
  /// scored so far and in all.
  std::function<void(int64_t done, int64_t total)> progress;
};

/// Scores `windows` with the model of `model_dir` as stored and with each
/// variant (the design note above), on the calling thread (the engines
/// parallelise inside). Throws model_error for a folder that cannot be
/// opened or quantized, std::invalid_argument for no windows, a window
/// shorter than 2 ids or longer than the model's context, an id outside the
/// vocabulary (naming the window's source and index), or a batch below 1.
quality_report evaluate_quality(const std::filesystem::path& model_dir,
                                std::span<const quality_variant> variants,
                                std::span<const quality_window> windows,
                                const quality_options& options = {});

} // namespace metronome
