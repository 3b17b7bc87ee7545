#pragma once
// Helpers shared by the config tests.

#include <functional>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "config/config_error.hpp"

namespace metronome::test {

/// YAML that sets the dotted `path` to the raw YAML text `value`, nesting one
/// mapping per section: ("supervisor.drift.window_s", "5") ->
/// "supervisor:\n  drift:\n    window_s: 5\n".
inline std::string nested_yaml(std::string_view path, std::string_view value) {
  std::string out;
  size_t depth = 0;
  for (auto dot = path.find('.'); dot != std::string_view::npos; dot = path.find('.')) {
    out += std::string(2 * depth, ' ') + std::string(path.substr(0, dot)) + ":\n";
    path.remove_prefix(dot + 1);
    ++depth;
  }
  out += std::string(2 * depth, ' ') + std::string(path) + ": " + std::string(value) + "\n";
  return out;
}

/// Runs `fn`, expects a config_error, and returns it (a default one, after
/// recording a failure, when none is thrown).
inline config_error catch_config_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const config_error& e) {
    return e;
  }
  ADD_FAILURE() << "no config_error thrown";
  return config_error("", "", "");
}

} // namespace metronome::test
