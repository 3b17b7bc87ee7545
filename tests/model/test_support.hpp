#pragma once
// Helpers shared by the model tests: scratch folders, making tiny models,
// running the CLI.

#include <cstdlib>
#include <filesystem>
#include <string>

#include "model/make_model.hpp"
#include "tests/test_env.hpp"

namespace metronome::test {

/// A fresh scratch folder under METRONOME_WORK_DIR (or the system temp dir).
std::filesystem::path scratch_dir(const std::string& name);

/// Makes (once per process) the preset with `seed` into a scratch folder.
std::filesystem::path tiny_model(const std::string& preset, uint64_t seed = 7);

/// Makes (once per process) `preset` with seed 7 and the tokenizer files of
/// testdata/tokenizers/<tokenizer>: a model an engine can serve.
std::filesystem::path served_model(const std::string& preset = "tiny-llama3",
                                   const std::string& tokenizer = "llama3");

/// Result of running a command.
struct command_result {
  int exit_code = -1;
  std::string output; // stdout and stderr
};

/// Runs a shell command, capturing its output.
command_result run_command(const std::string& cmd);

/// Quotes a string for the shell.
std::string shell_quote(const std::string& s);

} // namespace metronome::test
