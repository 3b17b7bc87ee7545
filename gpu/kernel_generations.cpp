// The process-wide choice of kernel generation (see kernels.hpp), read once
// from METRONOME_KERNELS, and the programmatic-dependent-launch setting, from
// METRONOME_PDL, with its per-thread override.

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "gpu/kernels.hpp"
#include "model/environment.hpp"

namespace metronome::gpu {

namespace {

kernel_generations from_environment() {
  const char* env = std::getenv("METRONOME_KERNELS");
  std::vector<std::string> bad;
  const kernel_generations g = parse_kernel_generations(env ? env : "", &bad);
  for (const std::string& item : bad)
    warn_ignored_setting("METRONOME_KERNELS", item,
                         "expected gemv, decode, prefill, rope or splits = 1 or 2, splits=3, "
                         "or awarps = 2 or 4");
  return g;
}

} // namespace

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
  static kernel_generations g = from_environment();
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

pdl_mode pdl_setting() {
  static const pdl_mode mode = [] {
    const char* v = std::getenv("METRONOME_PDL");
    bool bad = false;
    const pdl_mode m = parse_pdl_mode(v, &bad);
    if (bad)
      warn_ignored_setting("METRONOME_PDL", v, "expected auto, 0 (off), 1 (on) or late; auto");
    return m;
  }();
  return mode;
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
