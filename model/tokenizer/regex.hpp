#pragma once
// A compiled Unicode regular expression (PCRE2 with JIT) for the Split and
// ByteLevel pre-tokenizers and the Replace normalizer/decoder.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace metronome {

class regex {
public:
  /// Compiles `pattern` written in the Oniguruma dialect of tokenizer.json
  /// (`\s` means the Unicode White_Space property there, as in Oniguruma).
  /// Throws std::invalid_argument with PCRE2's message when it does not compile.
  explicit regex(const std::string& pattern);
  ~regex();
  regex(const regex&) = delete;
  regex& operator=(const regex&) = delete;

  /// Byte ranges [begin, end) of all non-overlapping matches in `text`
  /// (valid UTF-8), left to right. Thread-safe: any thread may call it.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  /// Quotes `literal` so that it matches itself.
  static std::string escape(std::string_view literal);

  const std::string& pattern() const noexcept {
    return pattern_;
  }

private:
  std::string pattern_;
  void* code_ = nullptr; // pcre2_code_8
  bool jit_ = false;
};

} // namespace metronome
