#pragma once
// The `pattern` of Split, Replace and friends in tokenizer.json: either a
// literal string or a regular expression.

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/tokenizer/regex.hpp"

namespace metronome {

class text_pattern {
public:
  static text_pattern literal(std::string text);
  static text_pattern regular(const std::string& expression);

  /// Non-overlapping matches, left to right, as byte ranges. Thread-safe.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  /// Replaces every match with `content`.
  std::string replace_all(std::string_view text, std::string_view content) const;

private:
  std::string literal_;
  std::shared_ptr<const regex> regex_;
};

} // namespace metronome
