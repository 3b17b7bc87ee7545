// GPT-2's bytes_to_unicode: the printable Latin-1 bytes ('!'..'~', U+00A1..U+00AC,
// U+00AE..U+00FF) stand for themselves; the other 68 bytes map, in order, to
// U+0100 upwards.

#include "model/tokenizer/byte_level.hpp"

#include "model/tokenizer/unicode.hpp"

namespace metronome::byte_level {

namespace {

struct tables {
  std::array<std::string, 256> text;
  std::array<int16_t, 0x200> byte_of;

  tables() {
    byte_of.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? char32_t(b) : next++;
      unicode::append_utf8(text[b], cp);
      byte_of[cp] = static_cast<int16_t>(b);
    }
  }
};

const tables& get() noexcept {
  static const tables t;
  return t;
}

} // namespace

const std::array<std::string, 256>& byte_to_text() noexcept {
  return get().text;
}

int char_to_byte(char32_t cp) noexcept {
  return cp < 0x200 ? get().byte_of[cp] : -1;
}

void encode(std::string_view in, std::string& out) {
  const auto& t = get().text;
  for (char c : in)
    out += t[static_cast<unsigned char>(c)];
}

} // namespace metronome::byte_level
