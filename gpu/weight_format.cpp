#include "gpu/weight_format.hpp"

namespace metronome {

std::string cuda_weights_problem(const model_config& config) {
  if (!config.quantization)
    return {};
  return "int4 weights (" + std::string(quant_method_name(config.quantization->method))
         + ") on CUDA are not yet verified on a GPU (docs/quantization.md); use --device cpu";
}

} // namespace metronome
