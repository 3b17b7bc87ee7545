#pragma once
// The GPT-2 byte-to-character table of the ByteLevel pre-tokenizer and
// decoder: every byte maps to one printable code point, so any byte string
// becomes a string of "visible" characters and back.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace metronome::byte_level {

/// The UTF-8 text of the character standing for each byte.
const std::array<std::string, 256>& byte_to_text() noexcept;

/// The byte a code point stands for, or -1 when it stands for none.
int char_to_byte(char32_t cp) noexcept;

/// Maps every byte of `in` to its character, appending to `out`.
void encode(std::string_view in, std::string& out);

} // namespace metronome::byte_level
