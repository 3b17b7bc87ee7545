// Finding added tokens in text.
//
// Design note: the reference finds added tokens with an Aho-Corasick
// automaton in leftmost-longest mode. Added tokens are few (tens to a few
// hundred) and most start with a rare byte such as '<', so a byte trie
// entered only at positions whose byte starts some token gives the same
// matches: at the leftmost position where any token matches, take the
// longest one; continue after it. Flags then adjust each match as the
// reference does: single_word drops matches inside words, lstrip/rstrip
// extend them over neighbouring white space, and special tokens are skipped
// when the caller treats special-token text as plain text.

#include "model/tokenizer/added_vocabulary.hpp"

#include <algorithm>

#include "model/tokenizer/unicode.hpp"

namespace metronome {

namespace {

bool is_word_char(char32_t c) {
  return c == '_' || unicode::is_alphanumeric(c);
}

char32_t last_char(std::string_view s) {
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80)
    --start;
  return unicode::next_code_point(s, start);
}

char32_t first_char(std::string_view s) {
  size_t i = 0;
  return unicode::next_code_point(s, i);
}

} // namespace

int32_t added_token_matcher::child(int32_t n, unsigned char c) const noexcept {
  for (const auto& [byte, target] : nodes_[size_t(n)].next)
    if (byte == c)
      return target;
  return -1;
}

void added_token_matcher::build(const std::vector<added_token>&,
                                const std::vector<std::string>& keys,
                                const std::vector<size_t>& which) {
  nodes_.assign(1, node{});
  std::fill(std::begin(first_byte_), std::end(first_byte_), false);
  for (size_t index : which) {
    const auto& key = keys[index];
    if (key.empty())
      continue;
    first_byte_[static_cast<unsigned char>(key[0])] = true;
    int32_t n = 0;
    for (char ch : key) {
      const auto c = static_cast<unsigned char>(ch);
      int32_t next = child(n, c);
      if (next < 0) {
        next = int32_t(nodes_.size());
        nodes_[size_t(n)].next.emplace_back(c, next);
        nodes_.emplace_back();
      }
      n = next;
    }
    // The first token with this text wins.
    if (nodes_[size_t(n)].token < 0)
      nodes_[size_t(n)].token = int32_t(index);
  }
}

void added_token_matcher::split(std::string_view text, const std::vector<added_token>& tokens,
                                bool skip_special, std::vector<added_split>& out) const {
  if (text.empty()) {
    out.push_back({0, 0, std::nullopt});
    return;
  }
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    // Longest token starting at pos.
    int32_t n = 0, found = -1;
    size_t found_end = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      n = child(n, static_cast<unsigned char>(text[i]));
      if (n < 0)
        break;
      if (nodes_[size_t(n)].token >= 0) {
        found = nodes_[size_t(n)].token;
        found_end = i + 1;
      }
    }
    if (found < 0) {
      ++pos;
      continue;
    }
    const added_token& tok = tokens[size_t(found)];
    size_t start = pos, stop = found_end;
    pos = found_end;
    if (skip_special && tok.special)
      continue;
    if (tok.single_word) {
      const bool start_space = start == 0 || !is_word_char(last_char(text.substr(0, start)));
      const bool stop_space = stop == text.size() || !is_word_char(first_char(text.substr(stop)));
      if (!start_space || !stop_space)
        continue;
    }
    if (tok.lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t b = s - 1;
        while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80)
          --b;
        size_t i = b;
        if (!unicode::is_white_space(unicode::next_code_point(text, i)))
          break;
        s = b;
      }
      start = std::max(s, start_offset);
    }
    if (tok.rstrip) {
      while (stop < text.size()) {
        size_t i = stop;
        if (!unicode::is_white_space(unicode::next_code_point(text, i)))
          break;
        stop = i;
      }
    }
    start = std::max(start, start_offset);
    if (start_offset < start)
      out.push_back({start_offset, start, std::nullopt});
    out.push_back({start, stop, tok.id});
    start_offset = stop;
    pos = std::max(pos, stop);
  }
  if (start_offset != text.size())
    out.push_back({start_offset, text.size(), std::nullopt});
}

void added_vocabulary::build(const std::vector<std::string>& normalized_keys) {
  by_id_.clear();
  by_content_.clear();
  std::vector<std::string> raw_keys;
  std::vector<size_t> raw_which, normalized_which;
  for (size_t i = 0; i < tokens.size(); ++i) {
    by_id_.emplace(tokens[i].id, i);
    by_content_.emplace(tokens[i].content, i);
    raw_keys.push_back(tokens[i].content);
    (tokens[i].normalized ? normalized_which : raw_which).push_back(i);
  }
  raw.build(tokens, raw_keys, raw_which);
  normalized.build(tokens, normalized_keys, normalized_which);
}

const added_token* added_vocabulary::find(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens[it->second];
}

const added_token* added_vocabulary::find(std::string_view content) const {
  auto it = by_content_.find(content);
  return it == by_content_.end() ? nullptr : &tokens[it->second];
}

} // namespace metronome
