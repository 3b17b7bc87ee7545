// The process-wide choice of kernel generation (see kernels.hpp), read once
// from METRONOME_KERNELS.

#include <cstdlib>
#include <string>

#include "gpu/kernels.hpp"

namespace metronome::gpu {

namespace {

kernel_generations from_environment() {
  kernel_generations g;
  const char* env = std::getenv("METRONOME_KERNELS");
  if (!env)
    return g;
  const std::string s = env;
  size_t at = 0;
  while (at < s.size()) {
    size_t end = s.find(',', at);
    if (end == std::string::npos)
      end = s.size();
    const std::string item = s.substr(at, end - at);
    const size_t eq = item.find('=');
    if (eq != std::string::npos) {
      const std::string key = item.substr(0, eq);
      const std::string value = item.substr(eq + 1);
      const int v = value == "1" ? 1 : 2;
      if (key == "gemv")
        g.gemv = v;
      else if (key == "decode")
        g.decode_attention = v;
      else if (key == "prefill")
        g.prefill_attention = v;
      else if (key == "rope")
        g.decode_rope = v;
      else if (key == "splits")
        g.gemm_splits = value == "3" ? 3 : v;
    }
    at = end + 1;
  }
  return g;
}

} // namespace

kernel_generations& active_kernels() {
  static kernel_generations g = from_environment();
  return g;
}

} // namespace metronome::gpu
