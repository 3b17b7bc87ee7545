#pragma once
// The one error type of model loading: says which file, and which field or
// tensor in it, is wrong, so a CLI can print it as is.

#include <stdexcept>
#include <string>

namespace metronome {

/// Thrown by everything that reads a model folder (config, weights, tokenizer).
/// what() reads "<file>: <field or tensor>: <problem>".
class model_error : public std::runtime_error {
public:
  model_error(std::string file, std::string field, std::string problem)
    : std::runtime_error(compose(file, field, problem)),
      file_(std::move(file)),
      field_(std::move(field)) {
    // nop
  }

  /// The file that holds the problem.
  const std::string& file() const noexcept {
    return file_;
  }

  /// The field or tensor name, empty when the whole file is wrong.
  const std::string& field() const noexcept {
    return field_;
  }

private:
  static std::string compose(const std::string& file, const std::string& field,
                             const std::string& problem) {
    std::string out = file;
    if (!field.empty())
      out += ": " + field;
    out += ": " + problem;
    return out;
  }

  std::string file_;
  std::string field_;
};

} // namespace metronome
