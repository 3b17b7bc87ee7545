#pragma once
// Registry of the subcommands of the `metronome` executable.

#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

namespace metronome::cli {

/// Adds one subcommand (with its options and callback) to the application.
using setup_fn = void (*)(CLI::App& app);

/// Registers a subcommand; called from a static initialiser in cmd_*.cpp.
/// `order` sorts the help listing.
int register_command(int order, setup_fn setup);

/// A failure a subcommand reports to the user: main prints "error: <what>"
/// and exits with `code`.
class command_error : public std::runtime_error {
public:
  explicit command_error(const std::string& what, int code = 1)
    : std::runtime_error(what), code_(code) {}

  int code() const noexcept {
    return code_;
  }

private:
  int code_;
};

/// `text` as a finite number when all of it is one (std::stod's syntax);
/// nullopt otherwise. Callers name the option and the range in their error.
inline std::optional<double> parse_decimal(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (text.empty() || used != text.size() || !std::isfinite(v))
    return std::nullopt;
  return v;
}

} // namespace metronome::cli
