#pragma once
// The comparison of the CPU engine against a golden of
// tools/golden/hf_reference.py's layout (per prompt: the prefill and each
// greedy step's top logits, probe logits, largest |logit| and argmax), shared
// by the bf16 goldens (golden_test.cpp) and the int4 ones
// (quantized_model_test.cpp).

#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model_weights.hpp"

namespace metronome::test {

/// Largest error allowed, relative to the reference's largest |logit|.
inline constexpr double golden_tolerance = 1e-4;

/// Reads a golden JSON file (adds a failure when it cannot).
nlohmann::json load_golden(const std::filesystem::path& path);

/// tools/golden/<preset>.json of the source tree.
nlohmann::json load_golden(const std::string& preset);

/// Largest |ours - ref| over the reference's top and probe entries (and the
/// largest |logit| itself), relative to the reference's largest |logit|.
double golden_relative_error(std::span<const float> ours, const nlohmann::json& ref_step,
                             const nlohmann::json& probe_ids);

/// Runs the golden's prompts as ONE batch through a cpu_engine on `model`
/// (interleaved, non-contiguous pages), the prefill then each greedy step,
/// feeding the reference's token so one miss cannot cascade; expects each
/// step's argmax to be the reference's and its logits within
/// golden_tolerance. Returns every logit row, step-major ([step][prompt]
/// [vocab]), for comparisons between models.
std::vector<float> expect_engine_matches_golden(std::shared_ptr<const model_folder> model,
                                                const nlohmann::json& ref,
                                                const std::string& label);

/// Runs the golden's prompts greedily through the CPU runner
/// (make_cpu_runner) and expects the reference's greedy ids.
void expect_runner_greedy_ids(std::shared_ptr<const model_folder> model,
                              const nlohmann::json& ref, const std::string& label);

} // namespace metronome::test
