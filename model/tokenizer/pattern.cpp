#include "model/tokenizer/pattern.hpp"

namespace metronome {

text_pattern text_pattern::literal(std::string text) {
  text_pattern p;
  p.literal_ = std::move(text);
  return p;
}

text_pattern text_pattern::regular(const std::string& expression) {
  text_pattern p;
  p.regex_ = std::make_shared<const regex>(expression);
  return p;
}

void text_pattern::find_all(std::string_view text,
                            std::vector<std::pair<size_t, size_t>>& out) const {
  if (regex_) {
    regex_->find_all(text, out);
    return;
  }
  if (literal_.empty())
    return;
  for (size_t pos = text.find(literal_); pos != std::string_view::npos;
       pos = text.find(literal_, pos + literal_.size()))
    out.emplace_back(pos, pos + literal_.size());
}

std::string text_pattern::replace_all(std::string_view text, std::string_view content) const {
  std::vector<std::pair<size_t, size_t>> matches;
  find_all(text, matches);
  if (matches.empty())
    return std::string(text);
  std::string out;
  out.reserve(text.size() + matches.size() * content.size());
  size_t prev = 0;
  for (auto [b, e] : matches) {
    out.append(text.substr(prev, b - prev));
    out.append(content);
    prev = e;
  }
  out.append(text.substr(prev));
  return out;
}

} // namespace metronome
