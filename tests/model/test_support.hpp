#pragma once
// Helpers shared by the model tests: scratch folders, making tiny models,
// running the CLI.

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "model/make_model.hpp"
#include "model/sampling.hpp"
#include "tests/test_env.hpp"

namespace metronome::test {

/// A fresh scratch folder under METRONOME_WORK_DIR (or the system temp dir).
std::filesystem::path scratch_dir(const std::string& name);

/// Makes (once per process) the preset with `seed` into a scratch folder.
std::filesystem::path tiny_model(const std::string& preset, uint64_t seed = 7);

/// Makes (once per process) a Llama shape with its projections rounded to
/// nearest into `layout` (GPTQ or AWQ, groups of 128): hidden 256, 4 heads
/// of 64, 2 kv heads, MLP 512, 2 layers, tiny-llama3's vocabulary. Each
/// projection's inputs are whole groups, and stay so on each of two
/// tensor-parallel ranks (o_proj 128, down_proj 256 inputs a rank).
std::filesystem::path int4_model(quant_method layout);

/// Makes (once per process) `preset` with seed 7 and the tokenizer files of
/// testdata/tokenizers/<tokenizer>: a model an engine can serve.
std::filesystem::path served_model(const std::string& preset = "tiny-llama3",
                                   const std::string& tokenizer = "llama3");

/// Rewrites in place the values of F32 tensor `name` of safetensors `file`
/// through `edit(values, shape)`: a test's way to give a model chosen
/// weights. Throws std::runtime_error when there is no such tensor.
void overwrite_f32_tensor(const std::filesystem::path& file, const std::string& name,
                          const std::function<void(float*, const std::vector<int64_t>&)>& edit);

/// The token of overflowing_model() whose values overflow fp8_e5m2.
inline constexpr int32_t overflow_token = 6;

/// Fault injection for the fp8_e5m2 KV cache (made once per process): the
/// tiny-llama3 preset (seed 11, f32, the llama3 tokenizer) where every
/// token's embedding is 0 along dimension 0 except overflow_token's, which
/// lies along it alone, and layer 0's value projection reads that dimension
/// into head 0, dim 0 with a weight of 1e5. So a sequence's values stay
/// ordinary until overflow_token comes, whose value there is ~1e5 times
/// larger than the window's first row set its scale for: it saturates
/// (the CPU engine's own kv_overflow count fires), mid-window, in the
/// prompt or wherever the token appears. In llama3's vocabulary it is "'".
std::filesystem::path overflowing_model();

/// The folder of tools/golden/int4_goldens.tar.xz unpacked (once per
/// process; removed when it ends): seven tiny GPTQ and AWQ checkpoints and,
/// per variant, <variant>.json, transformers' logits on their weights
/// dequantized with the layouts' published formulas.
std::filesystem::path int4_goldens();

/// The variants of int4_goldens(), by folder name.
const std::vector<std::string>& int4_golden_variants();

/// The message of the model_error `f` throws, or "<no model_error>".
std::string error_of(const std::function<void()>& f);

/// Whether `text` contains `part`.
bool contains(const std::string& text, const std::string& part);

/// Result of running a command.
struct command_result {
  int exit_code = -1;
  std::string output; // stdout and stderr
};

/// Runs a shell command, capturing its output.
command_result run_command(const std::string& cmd);

/// Quotes a string for the shell.
std::string shell_quote(const std::string& s);

/// The reference log-probabilities of transformers for `preset`
/// (tools/golden/<preset>-logprobs.json, made by tools/golden/hf_logprobs.py).
struct reference_logprobs {
  struct step {
    int32_t token = 0;
    double logprob = 0;
    std::vector<int32_t> top_ids;
    std::vector<double> top_logprobs;
  };
  struct run {
    std::vector<int32_t> prompt;
    std::vector<step> steps;
  };
  std::vector<run> runs;
  int32_t top = 0;
};
reference_logprobs load_reference_logprobs(const std::string& preset);

/// Checks what a runner reported for one step (sampled_token::logprobs:
/// the sampled token, then the top n <= ref.top_ids.size()) against the
/// reference, within `tolerance` (absolute, in nats). Near-ties may order
/// the top entries differently: each k-th value must match the reference's
/// k-th, and each reported token the reference's value for it where the
/// reference lists it. Returns false (after adding failures) on a mismatch.
bool expect_logprobs_near(const reference_logprobs::step& ref,
                          const std::vector<token_logprob>& got, size_t n, double tolerance,
                          const std::string& where);

} // namespace metronome::test
