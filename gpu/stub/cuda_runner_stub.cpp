// gpu/cuda_runner.hpp for builds without CUDA: no devices, and a clear error
// for anyone who asks for one, so callers need no #ifdef.

#include <cmath>
#include <stdexcept>

#include "gpu/cuda_runner.hpp"
#include "model/model_weights.hpp"

namespace metronome {

int cuda_device_count() {
  return 0;
}

int parse_cuda_device(const std::string& device) {
  if (device == "cuda")
    return 0;
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5)
    return -1;
  int n = 0;
  for (size_t i = 5; i < device.size(); ++i) {
    if (device[i] < '0' || device[i] > '9' || n > 100000)
      return -1;
    n = n * 10 + (device[i] - '0');
  }
  return n;
}

std::string cuda_device_problem(int) {
  return "this build of metronome has no CUDA support (configure with nvcc available, or "
         "-DMETRONOME_CUDA=ON)";
}

std::unique_ptr<model_runner> make_cuda_runner(std::shared_ptr<const model_folder>,
                                               const cuda_runner_options& options) {
  throw std::invalid_argument("make_cuda_runner: cuda:" + std::to_string(options.device) + ": "
                              + cuda_device_problem(options.device));
}

bool set_cuda_graphs(model_runner&, bool) {
  return false;
}

bool set_mixed_graphs(model_runner&, bool) {
  return false;
}

int64_t cuda_mixed_graph_launches(const model_runner&) {
  return -1;
}

double cuda_graph_replay_ms(model_runner&, int32_t, bool) {
  return std::nan("");
}

std::string describe_cuda_runner(const model_runner&) {
  return {};
}

std::vector<float> cuda_runner_logits(model_runner&, int32_t) {
  return {};
}

std::string cuda_kv_cache_problem(const model_config&, kv_cache_dtype_kind) {
  return {}; // no CUDA device can be opened here to use it
}

std::string format_memory_plan(const std::vector<memory_plan_entry>&) {
  return {};
}

} // namespace metronome
