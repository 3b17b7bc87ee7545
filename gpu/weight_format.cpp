#include "gpu/weight_format.hpp"

namespace metronome {

std::string cuda_weights_problem(const model_config& config) {
  if (!config.quantization)
    return {};
  return "int4 weights (" + std::string(quant_method_name(config.quantization->method))
         + ") are not supported by the CUDA runner yet; use --device cpu";
}

} // namespace metronome
