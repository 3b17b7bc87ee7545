#pragma once
// Which weight formats the CUDA runner serves. Host arithmetic on the
// config only, built with or without CUDA (metronome_gpu_host), so the
// refusal is the same everywhere and testable on any machine.

#include <string>

#include "model/model_config.hpp"

namespace metronome {

/// Why the CUDA runner cannot serve `config`'s weights ("" when it can): it
/// has no 4-bit kernels yet, so a checkpoint with a quantization_config is
/// refused, naming the method and pointing to the CPU engine. spawn_engine
/// and `metronome generate` ask before anything else about the device;
/// make_cuda_runner asks again. Any thread.
std::string cuda_weights_problem(const model_config& config);

} // namespace metronome
