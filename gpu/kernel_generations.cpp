// The process-wide choice of kernel generation (see kernels.hpp) and the
// programmatic-dependent-launch setting with its per-thread override. Both
// start at their defaults; only benchmarks and tests change them
// (bench/gpu/environment_switches.hpp), never the server.

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "gpu/kernels.hpp"

namespace metronome::gpu {

kernel_generations parse_kernel_generations(const std::string& s,
                                            std::vector<std::string>* ignored_items) {
  kernel_generations g;
  size_t at = 0;
  while (at < s.size()) {
    size_t end = s.find(',', at);
    if (end == std::string::npos)
      end = s.size();
    const std::string item = s.substr(at, end - at);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    // Each key and the generation it sets; splits also takes 3; awarps
    // takes warps, 2 or 4.
    static const std::pair<const char*, int kernel_generations::*> fields[] = {
      {"gemv", &kernel_generations::gemv},
      {"decode", &kernel_generations::decode_attention},
      {"prefill", &kernel_generations::prefill_attention},
      {"rope", &kernel_generations::decode_rope},
      {"int4", &kernel_generations::gemv_int4},
      {"splits", &kernel_generations::gemm_splits},
      {"awarps", &kernel_generations::attention_warps}};
    int kernel_generations::*field = nullptr;
    for (const auto& [name, member] : fields)
      if (key == name)
        field = member;
    const bool known_value = key == "awarps"
                               ? value == "2" || value == "4"
                               : value == "1" || value == "2" || (key == "splits" && value == "3");
    if (field && known_value)
      g.*field = value[0] - '0';
    else if (!item.empty() && ignored_items)
      ignored_items->push_back(item);
    at = end + 1;
  }
  return g;
}

kernel_generations& active_kernels() {
  static kernel_generations g;
  return g;
}

/// The innermost live launch_choice_scope's choice on this thread: -1
/// none, 0 off, 1 on.
template <class Choice>
thread_local int choice_override = -1;

pdl_mode parse_pdl_mode(const char* v, bool* ignored_value) {
  if (ignored_value)
    *ignored_value = false;
  const std::string s = v ? v : "";
  if (s.empty() || s == "auto")
    return pdl_mode::per_graph;
  if (s == "1" || s == "on" || s == "true" || s == "yes")
    return pdl_mode::on;
  if (s == "0" || s == "off" || s == "false" || s == "no")
    return pdl_mode::off;
  if (s == "late")
    return pdl_mode::late;
  if (ignored_value)
    *ignored_value = true;
  return pdl_mode::per_graph;
}

namespace {
std::atomic<pdl_mode> process_pdl_mode{pdl_mode::per_graph};
} // namespace

pdl_mode pdl_setting() {
  return process_pdl_mode.load(std::memory_order_relaxed);
}

void set_pdl_mode(pdl_mode mode) {
  process_pdl_mode.store(mode, std::memory_order_relaxed);
}

bool pdl_active() {
  const int o = choice_override<pdl_choice>;
  return o >= 0 ? o == 1 : pdl_setting() == pdl_mode::on || pdl_setting() == pdl_mode::late;
}

bool late_triggers() {
  const int o = choice_override<late_trigger_choice>;
  return o >= 0 ? o == 1 : pdl_setting() == pdl_mode::late;
}

template <class Choice>
launch_choice_scope<Choice>::launch_choice_scope(bool on) : saved_(choice_override<Choice>) {
  choice_override<Choice> = on ? 1 : 0;
}

template <class Choice>
launch_choice_scope<Choice>::~launch_choice_scope() {
  choice_override<Choice> = saved_;
}

template class launch_choice_scope<pdl_choice>;
template class launch_choice_scope<late_trigger_choice>;

} // namespace metronome::gpu
