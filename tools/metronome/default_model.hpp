#pragma once
// Where `metronome serve` and `metronome generate` find the model they use
// when given no --model: the build's models/default beside the executable
// (CMake copies models/metronome-tiny there), else the installed
// <prefix>/share/metronome/models/default for <prefix>/bin/metronome.

#include <filesystem>
#include <string>
#include <system_error>

#include "tools/metronome/command.hpp"

namespace metronome::cli {

/// The default model's folder: the first candidate holding a config.json.
/// Throws command_error naming the places looked at when none does.
inline std::filesystem::path default_model_dir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const fs::path bin = ec ? fs::current_path() : exe.parent_path();
  const fs::path candidates[] = {bin / "models" / "default",
                                 bin.parent_path() / "share" / "metronome" / "models" / "default"};
  for (const auto& dir : candidates)
    if (fs::exists(dir / "config.json", ec))
      return dir;
  throw command_error("no --model given and no default model at " + candidates[0].string()
                      + " or " + candidates[1].string() + " (rebuild, or pass --model DIR)");
}

} // namespace metronome::cli
