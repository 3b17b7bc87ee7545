#pragma once
// UTF-8 helpers, Unicode normalization forms and character classes used by
// the tokenizer. Pure functions, safe to call from any thread.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace metronome::unicode {

constexpr char32_t replacement_char = 0xFFFD;

// -- UTF-8 ---------------------------------------------------------------------

/// Decodes the code point at `s[i]` and advances `i`. `s` must be valid UTF-8.
inline char32_t next_code_point(std::string_view s, size_t& i) noexcept {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  if (b0 < 0xE0) {
    char32_t cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu);
    i += 2;
    return cp;
  }
  if (b0 < 0xF0) {
    char32_t cp = ((b0 & 0x0Fu) << 12) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 6)
                  | (static_cast<unsigned char>(s[i + 2]) & 0x3Fu);
    i += 3;
    return cp;
  }
  char32_t cp = ((b0 & 0x07u) << 18) | ((static_cast<unsigned char>(s[i + 1]) & 0x3Fu) << 12)
                | ((static_cast<unsigned char>(s[i + 2]) & 0x3Fu) << 6)
                | (static_cast<unsigned char>(s[i + 3]) & 0x3Fu);
  i += 4;
  return cp;
}

/// Number of bytes of the UTF-8 sequence that starts with `lead` (1 for a
/// stray continuation byte).
inline size_t sequence_length(unsigned char lead) noexcept {
  return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

/// Appends the UTF-8 encoding of `cp`.
void append_utf8(std::string& out, char32_t cp);

/// Length of the longest valid UTF-8 prefix of `s` (s.size() when valid).
size_t valid_utf8_prefix(std::string_view s) noexcept;

inline bool is_valid_utf8(std::string_view s) noexcept {
  return valid_utf8_prefix(s) == s.size();
}

/// Replaces each ill-formed subsequence with U+FFFD, one per maximal subpart
/// (the Unicode "best practice" that Python's errors="replace" and Rust's
/// String::from_utf8_lossy follow).
std::string to_valid_utf8(std::string_view s);

/// Bytes at the end of `s` that begin a UTF-8 sequence that is still
/// incomplete but could become valid with more bytes (0 to 3).
size_t incomplete_suffix(std::string_view s) noexcept;

// -- normalization ---------------------------------------------------------------

enum class normal_form { nfc, nfd, nfkc, nfkd };

/// Returns `s` (valid UTF-8) in the normal form. Fast path: returns a copy
/// when a quick check proves the text is already normalized.
std::string normalize(std::string_view s, normal_form form);

/// The Unicode version of the tables.
const char* unicode_version() noexcept;

// -- character classes ----------------------------------------------------------

enum class category : uint8_t { other = 0, letter, mark, number, punctuation, symbol, separator };

/// Major general category (L, M, N, P, S, Z, else C).
category general_category(char32_t cp) noexcept;

/// The White_Space property (Rust's char::is_whitespace).
bool is_white_space(char32_t cp) noexcept;

/// Python's str.isspace (used by Jinja's trim and str.strip()).
bool is_python_space(char32_t cp) noexcept;

/// Letter or number (close to Rust's char::is_alphanumeric).
inline bool is_alphanumeric(char32_t cp) noexcept {
  auto c = general_category(cp);
  return c == category::letter || c == category::number;
}

/// Lower-cases (simple case mapping; ASCII fast path).
std::string to_lower(std::string_view s);

} // namespace metronome::unicode
