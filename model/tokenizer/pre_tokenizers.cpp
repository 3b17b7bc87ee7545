// Pre-tokenizers of tokenizer.json: Split, ByteLevel, Metaspace, Whitespace,
// WhitespaceSplit, Digits, Punctuation and Sequence.
//
// Design note: every splitter first lists the pieces of a text as
// (begin, end, is_match) ranges that cover it, then applies the split
// behaviour (Removed, Isolated, MergedWithPrevious, MergedWithNext,
// Contiguous) exactly as the Hugging Face tokenizers library does; empty
// pieces are dropped. Only the first piece of the input keeps `at_start`,
// which Metaspace's prepend_scheme "first" needs.

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "model/model_error.hpp"
#include "model/tokenizer/byte_level.hpp"
#include "model/tokenizer/components.hpp"
#include "model/tokenizer/pattern.hpp"
#include "model/tokenizer/unicode.hpp"

namespace metronome {

namespace {

using nlohmann::json;

enum class split_behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct span {
  size_t begin, end;
  bool is_match;
};

split_behavior read_behavior(const json& j, const json_origin& at) {
  auto it = j.find("behavior");
  if (it == j.end() || !it->is_string())
    at.at("behavior").fail("missing or not a string");
  const auto b = it->get<std::string>();
  if (b == "Removed")
    return split_behavior::removed;
  if (b == "Isolated")
    return split_behavior::isolated;
  if (b == "MergedWithPrevious")
    return split_behavior::merged_with_previous;
  if (b == "MergedWithNext")
    return split_behavior::merged_with_next;
  if (b == "Contiguous")
    return split_behavior::contiguous;
  at.at("behavior").fail("unknown split behavior '" + b + "'");
}

/// Turns match ranges into spans covering all of a text of `size` bytes.
std::vector<span> cover(const std::vector<std::pair<size_t, size_t>>& matches, size_t size) {
  std::vector<span> out;
  out.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev != b)
      out.push_back({prev, b, false});
    out.push_back({b, e, true});
    prev = e;
  }
  if (prev != size)
    out.push_back({prev, size, false});
  return out;
}

/// Applies a split behaviour; returns the kept [begin, end) ranges.
std::vector<std::pair<size_t, size_t>> apply_behavior(std::vector<span> spans, split_behavior b) {
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(spans.size());
  switch (b) {
    case split_behavior::removed:
      for (const auto& s : spans)
        if (!s.is_match)
          out.emplace_back(s.begin, s.end);
      break;
    case split_behavior::isolated:
      for (const auto& s : spans)
        out.emplace_back(s.begin, s.end);
      break;
    case split_behavior::merged_with_previous: {
      bool previous_match = false;
      for (const auto& s : spans) {
        if (s.is_match && !previous_match && !out.empty())
          out.back().second = s.end;
        else
          out.emplace_back(s.begin, s.end);
        previous_match = s.is_match;
      }
      break;
    }
    case split_behavior::merged_with_next: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty())
          out.back().first = it->begin;
        else
          out.emplace_back(it->begin, it->end);
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case split_behavior::contiguous: {
      bool previous_match = false;
      for (const auto& s : spans) {
        if (s.is_match == previous_match && !out.empty())
          out.back().second = s.end;
        else
          out.emplace_back(s.begin, s.end);
        previous_match = s.is_match;
      }
      break;
    }
  }
  return out;
}

/// Splits every piece with `find` (which lists match ranges) and `behavior`.
template <class Find>
void split_pieces(std::vector<text_piece>& pieces, split_behavior behavior, bool invert,
                  Find&& find) {
  std::vector<text_piece> out;
  out.reserve(pieces.size() * 4);
  std::vector<std::pair<size_t, size_t>> matches;
  for (auto& p : pieces) {
    matches.clear();
    find(std::string_view(p.text), matches);
    auto spans = cover(matches, p.text.size());
    if (invert)
      for (auto& s : spans)
        s.is_match = !s.is_match;
    for (auto [b, e] : apply_behavior(std::move(spans), behavior))
      if (e > b)
        out.push_back({p.text.substr(b, e - b), p.at_start && b == 0});
  }
  pieces = std::move(out);
}

/// Match ranges of the characters for which `pred` holds, one per character.
template <class Pred>
void find_chars(std::string_view text, std::vector<std::pair<size_t, size_t>>& out, Pred pred) {
  for (size_t i = 0; i < text.size();) {
    const size_t start = i;
    if (pred(unicode::next_code_point(text, i)))
      out.emplace_back(start, i);
  }
}

// -- Split ------------------------------------------------------------------------------

class split_pre_tokenizer final : public pre_tokenizer {
public:
  split_pre_tokenizer(text_pattern pattern, split_behavior behavior, bool invert)
    : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<text_piece>& pieces) const override {
    split_pieces(pieces, behavior_, invert_,
                 [this](std::string_view t, auto& m) { pattern_.find_all(t, m); });
  }
  std::optional<streaming_plan> streaming() const override {
    if (behavior_ != split_behavior::isolated || invert_)
      return std::nullopt;
    return streaming_plan{&pattern_, false};
  }

private:
  text_pattern pattern_;
  split_behavior behavior_;
  bool invert_;
};

// -- ByteLevel --------------------------------------------------------------------------

constexpr const char* gpt2_pattern =
  R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class byte_level_pre_tokenizer final : public pre_tokenizer {
public:
  byte_level_pre_tokenizer(bool add_prefix_space, bool use_regex)
    : add_prefix_space_(add_prefix_space) {
    if (use_regex)
      regex_ = text_pattern::regular(gpt2_pattern);
  }
  std::optional<streaming_plan> streaming() const override {
    if (add_prefix_space_)
      return std::nullopt;
    return streaming_plan{regex_ ? &*regex_ : nullptr, true};
  }
  void pre_tokenize(std::vector<text_piece>& pieces) const override {
    if (add_prefix_space_)
      for (auto& p : pieces)
        if (!p.text.empty() && p.text[0] != ' ')
          p.text.insert(0, 1, ' ');
    if (regex_)
      split_pieces(pieces, split_behavior::isolated, false,
                   [this](std::string_view t, auto& m) { regex_->find_all(t, m); });
    std::string mapped;
    for (auto& p : pieces) {
      mapped.clear();
      byte_level::encode(p.text, mapped);
      p.text.swap(mapped);
    }
  }

private:
  bool add_prefix_space_;
  std::optional<text_pattern> regex_;
};

// -- Metaspace --------------------------------------------------------------------------

enum class prepend_scheme { always, first, never };

class metaspace_pre_tokenizer final : public pre_tokenizer {
public:
  metaspace_pre_tokenizer(std::string replacement, prepend_scheme scheme, bool split)
    : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<text_piece>& pieces) const override {
    for (auto& p : pieces) {
      p.text = text_pattern::literal(" ").replace_all(p.text, replacement_);
      const bool starts = p.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!p.text.empty() && !starts
          && (scheme_ == prepend_scheme::always || (scheme_ == prepend_scheme::first && p.at_start)))
        p.text.insert(0, replacement_);
    }
    if (split_)
      split_pieces(pieces, split_behavior::merged_with_next, false,
                   [this](std::string_view t, auto& m) {
                     text_pattern::literal(replacement_).find_all(t, m);
                   });
  }

private:
  std::string replacement_;
  prepend_scheme scheme_;
  bool split_;
};

// -- character-class splitters ------------------------------------------------------------

bool is_word_char(char32_t c) {
  return c == '_' || unicode::is_alphanumeric(c)
         || unicode::general_category(c) == unicode::category::mark;
}

class whitespace_pre_tokenizer final : public pre_tokenizer {
public:
  void pre_tokenize(std::vector<text_piece>& pieces) const override {
    // \w+|[^\w\s]+, keeping the matches only.
    split_pieces(pieces, split_behavior::removed, true, [](std::string_view t, auto& m) {
      int kind = 0; // 0 none, 1 word, 2 other non-space
      size_t start = 0;
      for (size_t i = 0; i < t.size();) {
        const size_t at = i;
        const char32_t c = unicode::next_code_point(t, i);
        const int k = is_word_char(c) ? 1 : unicode::is_white_space(c) ? 0 : 2;
        if (k != kind) {
          if (kind != 0)
            m.emplace_back(start, at);
          start = at;
          kind = k;
        }
      }
      if (kind != 0)
        m.emplace_back(start, t.size());
    });
  }
};

class whitespace_split_pre_tokenizer final : public pre_tokenizer {
public:
  void pre_tokenize(std::vector<text_piece>& pieces) const override {
    split_pieces(pieces, split_behavior::removed, false, [](std::string_view t, auto& m) {
      find_chars(t, m, unicode::is_white_space);
    });
  }
};

class digits_pre_tokenizer final : public pre_tokenizer {
public:
  explicit digits_pre_tokenizer(bool individual) : individual_(individual) {}
  void pre_tokenize(std::vector<text_piece>& pieces) const override {
    split_pieces(pieces, individual_ ? split_behavior::isolated : split_behavior::contiguous,
                 false, [](std::string_view t, auto& m) {
                   find_chars(t, m, [](char32_t c) {
                     return unicode::general_category(c) == unicode::category::number;
                   });
                 });
  }

private:
  bool individual_;
};

class punctuation_pre_tokenizer final : public pre_tokenizer {
public:
  explicit punctuation_pre_tokenizer(split_behavior b) : behavior_(b) {}
  void pre_tokenize(std::vector<text_piece>& pieces) const override {
    split_pieces(pieces, behavior_, false, [](std::string_view t, auto& m) {
      find_chars(t, m, [](char32_t c) {
        return (c < 0x80 && std::ispunct(static_cast<int>(c)))
               || unicode::general_category(c) == unicode::category::punctuation;
      });
    });
  }

private:
  split_behavior behavior_;
};

class sequence_pre_tokenizer final : public pre_tokenizer {
public:
  explicit sequence_pre_tokenizer(std::vector<std::unique_ptr<pre_tokenizer>> parts)
    : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<text_piece>& pieces) const override {
    for (const auto& p : parts_)
      p->pre_tokenize(pieces);
  }
  std::optional<streaming_plan> streaming() const override {
    if (parts_.size() == 1)
      return parts_[0]->streaming();
    if (parts_.size() != 2)
      return std::nullopt;
    auto split = parts_[0]->streaming(), bytes = parts_[1]->streaming();
    if (!split || split->byte_level || !bytes || !bytes->byte_level || bytes->split)
      return std::nullopt;
    return streaming_plan{split->split, true};
  }

private:
  std::vector<std::unique_ptr<pre_tokenizer>> parts_;
};

prepend_scheme read_prepend_scheme(const json& j, const json_origin& at) {
  if (auto it = j.find("prepend_scheme"); it != j.end() && it->is_string()) {
    const auto s = it->get<std::string>();
    if (s == "always")
      return prepend_scheme::always;
    if (s == "first")
      return prepend_scheme::first;
    if (s == "never")
      return prepend_scheme::never;
    at.at("prepend_scheme").fail("unknown prepend scheme '" + s + "'");
  }
  // Files older than prepend_scheme say add_prefix_space.
  return j.value("add_prefix_space", true) ? prepend_scheme::always : prepend_scheme::never;
}

} // namespace

std::unique_ptr<pre_tokenizer> pre_tokenizer::make(const json& j, const json_origin& at) {
  if (j.is_null())
    return nullptr;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    at.fail("expected an object with a \"type\"");
  const auto type = j["type"].get<std::string>();
  if (type == "Split")
    return std::make_unique<split_pre_tokenizer>(read_pattern(j.value("pattern", json()),
                                                              at.at("pattern")),
                                                 read_behavior(j, at), j.value("invert", false));
  if (type == "ByteLevel")
    return std::make_unique<byte_level_pre_tokenizer>(j.value("add_prefix_space", true),
                                                      j.value("use_regex", true));
  if (type == "Metaspace") {
    auto replacement = j.value("replacement", std::string("\u2581"));
    return std::make_unique<metaspace_pre_tokenizer>(replacement, read_prepend_scheme(j, at),
                                                     j.value("split", true));
  }
  if (type == "Whitespace")
    return std::make_unique<whitespace_pre_tokenizer>();
  if (type == "WhitespaceSplit")
    return std::make_unique<whitespace_split_pre_tokenizer>();
  if (type == "Digits")
    return std::make_unique<digits_pre_tokenizer>(j.value("individual_digits", false));
  if (type == "Punctuation")
    return std::make_unique<punctuation_pre_tokenizer>(
      j.contains("behavior") ? read_behavior(j, at) : split_behavior::isolated);
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array())
      at.at("pretokenizers").fail("missing or not an array");
    std::vector<std::unique_ptr<pre_tokenizer>> parts;
    for (size_t i = 0; i < it->size(); ++i)
      if (auto p = make((*it)[i], at.at("pretokenizers").at(i)))
        parts.push_back(std::move(p));
    return std::make_unique<sequence_pre_tokenizer>(std::move(parts));
  }
  at.at("type").fail("unsupported pre-tokenizer '" + type + "'");
}

} // namespace metronome
