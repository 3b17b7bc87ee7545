#pragma once
// The one error type of server configuration: names the source (a YAML file
// or the command line), the dotted key path and the problem, so the CLI can
// print it as is.

#include <stdexcept>
#include <string>

namespace metronome {

/// Thrown by everything that reads or checks a server configuration.
/// what() reads "<source>: <key.path>: <problem>", or "<source>: <problem>"
/// when the problem is not tied to one key (a YAML syntax error, a missing
/// file).
class config_error : public std::runtime_error {
public:
  config_error(std::string source, std::string key_path, std::string problem)
    : std::runtime_error(compose(source, key_path, problem)),
      source_(std::move(source)),
      key_path_(std::move(key_path)),
      problem_(std::move(problem)) {
    // nop
  }

  /// The file name, or "--set" / "command line" for overrides.
  const std::string& source() const noexcept {
    return source_;
  }

  /// The dotted key path ("engine.max_batch_size"); empty when the problem is
  /// not tied to one key.
  const std::string& key_path() const noexcept {
    return key_path_;
  }

  /// The problem alone, without source and key path.
  const std::string& problem() const noexcept {
    return problem_;
  }

private:
  static std::string compose(const std::string& source,
                             const std::string& key_path,
                             const std::string& problem) {
    std::string out = source;
    if (!key_path.empty())
      out += ": " + key_path;
    out += ": " + problem;
    return out;
  }

  std::string source_;
  std::string key_path_;
  std::string problem_;
};

} // namespace metronome
