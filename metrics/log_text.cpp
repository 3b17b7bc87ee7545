#include "metrics/log_text.hpp"

namespace metronome {

std::string log_text(std::string_view text, size_t max_bytes) {
  static constexpr char hex[] = "0123456789abcdef";
  const bool cut = text.size() > max_bytes;
  if (cut)
    text = text.substr(0, max_bytes);
  std::string out;
  out.reserve(text.size() + 8);
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += "\\x";
          out += hex[c >> 4];
          out += hex[c & 0xf];
        } else {
          out += ch;
        }
    }
  }
  if (cut)
    out += "...";
  return out;
}

} // namespace metronome
