#pragma once
// Reading metronome.yaml and command-line overrides into a server_config,
// and printing the effective configuration back as YAML.
//
// Order of precedence: defaults < the YAML file < overrides, applied in the
// order given. Every value, from the file or the command line, passes the
// same per-key checks (config_schema.hpp); the cross-field checks
// (validate()) run once at the end. All errors are config_error with what()
// = "<source>: <key.path>: <problem>".

#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/config_error.hpp"
#include "config/server_config.hpp"

namespace metronome {

// -- loading ---------------------------------------------------------------------

/// Reads the YAML file at `path` over the defaults and validates the result.
/// Errors name the file as given. Called on the main thread at start-up.
server_config load_config_file(const std::filesystem::path& path);

/// Parses YAML text over the defaults and validates the result; `source`
/// names the text in errors.
server_config load_config_string(std::string_view yaml, const std::string& source);

/// Applies the keys present in YAML text to `cfg`, leaving absent keys as
/// they are. Checks each key's type and range but not the cross-field rules:
/// call validate() after the last layer.
void merge_config_yaml(server_config& cfg, std::string_view yaml, const std::string& source);

// -- command-line overrides ------------------------------------------------------

/// Sets the key at `key_path` ("engine.max_batch_size") from its command-line
/// text ("32"), with the same type and range checks as the YAML file; throws
/// config_error naming `source` and the key (with a suggestion for a
/// misspelt key). Cross-field rules are left to validate().
void apply_override(server_config& cfg, std::string_view key_path, std::string_view value,
                    const std::string& source = "--set");

/// `--set key.path=value`: splits at the first '=' and calls apply_override.
void apply_set(server_config& cfg, std::string_view assignment,
               const std::string& source = "--set");

/// A shorthand flag of `metronome serve` and the key it sets.
struct config_flag {
  /// With the dashes: "--port".
  std::string_view flag;
  std::string_view key_path;
  std::string_view help;
};

/// The shorthand flags (--host, --port, --model, --device, ...), so the CLI
/// can register them in a loop and pass each given one to apply_override.
std::span<const config_flag> config_flags();

/// The key a shorthand flag sets ("--port" or "port" -> "server.port").
std::optional<std::string_view> flag_key_path(std::string_view flag);

/// One override from the command line.
struct config_override {
  std::string key_path;
  std::string value;
  /// How errors name it: "--set" or the flag ("--port").
  std::string source = "--set";
};

/// Everything `metronome serve` does: defaults, then `file` if given, then
/// `overrides` in order, then validate(). Cross-field errors name the file,
/// "command line", or both.
server_config load_config(const std::optional<std::filesystem::path>& file,
                          const std::vector<config_override>& overrides);

// -- printing --------------------------------------------------------------------

/// The configuration as a complete metronome.yaml that loads back to an equal
/// server_config (`--dump-config`). With `with_docs`, each key is preceded by
/// its one-line documentation as a comment.
std::string to_yaml(const server_config& cfg, bool with_docs = false);

/// The text after "unknown key" for a path that names no key: a suggestion
/// such as " (did you mean max_batch_size?)", or the keys known there.
std::string unknown_key_hint(std::string_view key_path);

} // namespace metronome
