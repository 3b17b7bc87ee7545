// The process-wide choice of kernel generation (see kernels.hpp), read once
// from METRONOME_KERNELS, and the programmatic-dependent-launch setting, from
// METRONOME_PDL, with its per-thread override.

#include <cstdlib>
#include <cstring>
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

namespace {
thread_local int pdl_override = -1; // -1: none; 0 off; 1 on
} // namespace

pdl_mode pdl_setting() {
  static const pdl_mode mode = [] {
    const char* v = std::getenv("METRONOME_PDL");
    if (v && std::strcmp(v, "1") == 0)
      return pdl_mode::on;
    if (v && std::strcmp(v, "auto") == 0)
      return pdl_mode::per_graph;
    return pdl_mode::off;
  }();
  return mode;
}

bool pdl_active() {
  return pdl_override >= 0 ? pdl_override == 1 : pdl_setting() == pdl_mode::on;
}

pdl_scope::pdl_scope(bool on) : saved_(pdl_override) {
  pdl_override = on ? 1 : 0;
}

pdl_scope::~pdl_scope() {
  pdl_override = saved_;
}

} // namespace metronome::gpu
