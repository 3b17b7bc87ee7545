#pragma once
// Which weight formats the CUDA runner serves. Host arithmetic on the
// config only, built with or without CUDA (metronome_gpu_host), so the
// refusal is the same everywhere and testable on any machine.

#include <string>

#include "model/model_config.hpp"

namespace metronome {

/// Why `serve` and `generate` do not put `config`'s weights on a CUDA device
/// ("" when they do). 4-bit weights (a GPTQ or AWQ checkpoint, or
/// --quantize int4) have CUDA kernels (gpu/gemv_int4.cu, gpu/weight_store)
/// whose tests have not yet run on a GPU: until gpu_tests pass on one, the
/// server and the CLI refuse them on CUDA, naming the method and pointing to
/// the CPU engine, rather than risk wrong tokens. make_cuda_runner takes them
/// (gpu_tests, gpu_bench). Any thread.
std::string cuda_weights_problem(const model_config& config);

} // namespace metronome
