// Decoders of tokenizer.json: ByteLevel, Metaspace, Replace, ByteFallback,
// Fuse, Strip, WordPiece, BPEDecoder and Sequence. Each rewrites the list of
// token strings; the tokenizer joins what is left.

#include <nlohmann/json.hpp>

#include "model/model_error.hpp"
#include "model/tokenizer/byte_level.hpp"
#include "model/tokenizer/components.hpp"
#include "model/tokenizer/pattern.hpp"
#include "model/tokenizer/unicode.hpp"

namespace metronome {

namespace {

using nlohmann::json;

/// The byte of a "<0xAB>" token, or -1.
int byte_token_value(const std::string& t) {
  if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>')
    return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9')
      return c - '0';
    if (c >= 'A' && c <= 'F')
      return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

class byte_level_decoder final : public decoder {
public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    decode_chain_raw(tokens);
    tokens.front() = unicode::to_valid_utf8(tokens.front());
  }
  void decode_chain_raw(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      const size_t mark = bytes.size();
      bool all_mapped = true;
      for (size_t i = 0; i < t.size();) {
        const int b = byte_level::char_to_byte(unicode::next_code_point(t, i));
        if (b < 0) {
          all_mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!all_mapped) {
        // A token with characters outside the byte alphabet stays as it is.
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, std::move(bytes));
  }
};

class metaspace_decoder final : public decoder {
public:
  metaspace_decoder(std::string replacement, bool strip_first)
    : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = text_pattern::literal(replacement_)
                    .replace_all(tokens[i], i == 0 && strip_first_ ? "" : " ");
  }

private:
  std::string replacement_;
  bool strip_first_;
};

class replace_decoder final : public decoder {
public:
  replace_decoder(text_pattern pattern, std::string content)
    : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens)
      t = pattern_.replace_all(t, content_);
  }

private:
  text_pattern pattern_;
  std::string content_;
};

class byte_fallback_decoder final : public decoder {
public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    decode(tokens, false);
  }
  void decode_chain_raw(std::vector<std::string>& tokens) const override {
    decode(tokens, true);
  }

private:
  static void decode(std::vector<std::string>& tokens, bool raw) {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    size_t pending_count = 0;
    auto flush = [&] {
      if (pending_count == 0)
        return;
      if (raw || unicode::is_valid_utf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t k = 0; k < pending_count; ++k)
          out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
      pending_count = 0;
    };
    for (auto& t : tokens) {
      const int b = byte_token_value(t);
      if (b >= 0) {
        pending.push_back(static_cast<char>(b));
        ++pending_count;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class fuse_decoder final : public decoder {
public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens)
      all += t;
    tokens.assign(1, std::move(all));
  }
};

class strip_decoder final : public decoder {
public:
  strip_decoder(char32_t content, size_t start, size_t stop)
    : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      // Raw decoding (decode_chain_raw) may hand over bytes that are not
      // UTF-8: each stray or cut-short sequence is one character here.
      auto length_at = [&](size_t i) {
        const size_t n = unicode::sequence_length(static_cast<unsigned char>(t[i]));
        return n <= t.size() - i && unicode::is_valid_utf8(std::string_view(t).substr(i, n))
                 ? n
                 : size_t{1};
      };
      std::vector<size_t> bounds; // byte offset of each character, then the size
      for (size_t i = 0; i < t.size(); i += length_at(i))
        bounds.push_back(i);
      const size_t n = bounds.size();
      bounds.push_back(t.size());
      auto char_at = [&](size_t k) {
        size_t i = bounds[k];
        return unicode::is_valid_utf8(std::string_view(t).substr(i, bounds[k + 1] - i))
                 ? unicode::next_code_point(t, i)
                 : unicode::replacement_char;
      };
      size_t start_cut = 0;
      for (size_t k = 0; k < start_ && k < n && char_at(k) == content_; ++k)
        start_cut = k + 1;
      size_t stop_cut = n;
      for (size_t k = 0; k < stop_ && k < n && char_at(n - k - 1) == content_; ++k)
        stop_cut = n - k - 1;
      if (stop_cut < start_cut)
        stop_cut = start_cut;
      t = t.substr(bounds[start_cut], bounds[stop_cut] - bounds[start_cut]);
    }
  }

private:
  char32_t content_;
  size_t start_, stop_;
};

class word_piece_decoder final : public decoder {
public:
  explicit word_piece_decoder(std::string prefix) : prefix_(std::move(prefix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      auto& t = tokens[i];
      if (i > 0 && t.compare(0, prefix_.size(), prefix_) == 0)
        t.erase(0, prefix_.size());
      else if (i > 0)
        t.insert(0, 1, ' ');
    }
  }

private:
  std::string prefix_;
};

class bpe_suffix_decoder final : public decoder {
public:
  explicit bpe_suffix_decoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = text_pattern::literal(suffix_).replace_all(tokens[i],
                                                             i + 1 == tokens.size() ? "" : " ");
  }

private:
  std::string suffix_;
};

class sequence_decoder final : public decoder {
public:
  explicit sequence_decoder(std::vector<std::unique_ptr<decoder>> parts)
    : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_)
      p->decode_chain(tokens);
  }
  void decode_chain_raw(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_)
      p->decode_chain_raw(tokens);
  }

private:
  std::vector<std::unique_ptr<decoder>> parts_;
};

} // namespace

std::unique_ptr<decoder> decoder::make(const json& j, const json_origin& at) {
  if (j.is_null())
    return nullptr;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    at.fail("expected an object with a \"type\"");
  const auto type = j["type"].get<std::string>();
  if (type == "ByteLevel")
    return std::make_unique<byte_level_decoder>();
  if (type == "Metaspace") {
    bool strip_first = j.value("add_prefix_space", true);
    if (auto it = j.find("prepend_scheme"); it != j.end() && it->is_string())
      strip_first = it->get<std::string>() != "never";
    return std::make_unique<metaspace_decoder>(j.value("replacement", std::string("\u2581")),
                                               strip_first);
  }
  if (type == "Replace")
    return std::make_unique<replace_decoder>(read_pattern(j.value("pattern", json()),
                                                          at.at("pattern")),
                                             read_string(j, "content", at));
  if (type == "ByteFallback")
    return std::make_unique<byte_fallback_decoder>();
  if (type == "Fuse")
    return std::make_unique<fuse_decoder>();
  if (type == "Strip") {
    const auto content = read_string(j, "content", at);
    size_t i = 0;
    if (content.empty() || !unicode::is_valid_utf8(content))
      at.at("content").fail("expected one character");
    const char32_t c = unicode::next_code_point(content, i);
    if (i != content.size())
      at.at("content").fail("expected one character");
    return std::make_unique<strip_decoder>(c, j.value("start", size_t{0}),
                                           j.value("stop", size_t{0}));
  }
  if (type == "WordPiece")
    return std::make_unique<word_piece_decoder>(j.value("prefix", std::string("##")));
  if (type == "BPEDecoder")
    return std::make_unique<bpe_suffix_decoder>(j.value("suffix", std::string("</w>")));
  if (type == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array())
      at.at("decoders").fail("missing or not an array");
    std::vector<std::unique_ptr<decoder>> parts;
    for (size_t i = 0; i < it->size(); ++i)
      if (auto p = make((*it)[i], at.at("decoders").at(i)))
        parts.push_back(std::move(p));
    return std::make_unique<sequence_decoder>(std::move(parts));
  }
  at.at("type").fail("unsupported decoder '" + type + "'");
}

} // namespace metronome
