// Normalizers of tokenizer.json: NFC/NFD/NFKC/NFKD, Lowercase, Strip,
// StripAccents, Replace, Prepend and Sequence.

#include <nlohmann/json.hpp>

#include "model/model_error.hpp"
#include "model/tokenizer/components.hpp"
#include "model/tokenizer/pattern.hpp"
#include "model/tokenizer/unicode.hpp"

namespace metronome {

void json_origin::fail(const std::string& problem) const {
  throw model_error(file, field, problem);
}

namespace {

using nlohmann::json;

class unicode_normalizer final : public normalizer {
public:
  explicit unicode_normalizer(unicode::normal_form form) : form_(form) {}
  void normalize(std::string& text) const override {
    text = unicode::normalize(text, form_);
  }

private:
  unicode::normal_form form_;
};

class lowercase_normalizer final : public normalizer {
public:
  void normalize(std::string& text) const override {
    text = unicode::to_lower(text);
  }
};

class strip_normalizer final : public normalizer {
public:
  strip_normalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t i = begin;
        if (!unicode::is_white_space(unicode::next_code_point(text, i)))
          break;
        begin = i;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
          --start;
        size_t i = start;
        if (!unicode::is_white_space(unicode::next_code_point(text, i)))
          break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

private:
  bool left_, right_;
};

class strip_accents_normalizer final : public normalizer {
public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      const size_t start = i;
      const char32_t cp = unicode::next_code_point(text, i);
      if (unicode::general_category(cp) != unicode::category::mark)
        out.append(text, start, i - start);
    }
    text = std::move(out);
  }
};

class replace_normalizer final : public normalizer {
public:
  replace_normalizer(text_pattern pattern, std::string content)
    : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    text = pattern_.replace_all(text, content_);
  }

private:
  text_pattern pattern_;
  std::string content_;
};

class prepend_normalizer final : public normalizer {
public:
  explicit prepend_normalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty())
      text.insert(0, prefix_);
  }

private:
  std::string prefix_;
};

class sequence_normalizer final : public normalizer {
public:
  explicit sequence_normalizer(std::vector<std::unique_ptr<normalizer>> parts)
    : parts_(std::move(parts)) {}
  void normalize(std::string& text) const override {
    for (const auto& p : parts_)
      p->normalize(text);
  }

private:
  std::vector<std::unique_ptr<normalizer>> parts_;
};

} // namespace

text_pattern read_pattern(const json& j, const json_origin& at) {
  if (!j.is_object())
    at.fail("expected {\"String\": ...} or {\"Regex\": ...}");
  if (auto it = j.find("String"); it != j.end() && it->is_string())
    return text_pattern::literal(it->get<std::string>());
  if (auto it = j.find("Regex"); it != j.end() && it->is_string()) {
    try {
      return text_pattern::regular(it->get<std::string>());
    } catch (const std::invalid_argument& e) {
      at.at("Regex").fail(e.what());
    }
  }
  at.fail("expected {\"String\": ...} or {\"Regex\": ...}");
}

std::string read_string(const json& j, const char* key, const json_origin& at) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string())
    at.at(key).fail("missing or not a string");
  return it->get<std::string>();
}

std::unique_ptr<normalizer> normalizer::make(const json& j, const json_origin& at) {
  if (j.is_null())
    return nullptr;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    at.fail("expected an object with a \"type\"");
  const auto type = j["type"].get<std::string>();
  if (type == "NFC")
    return std::make_unique<unicode_normalizer>(unicode::normal_form::nfc);
  if (type == "NFD")
    return std::make_unique<unicode_normalizer>(unicode::normal_form::nfd);
  if (type == "NFKC")
    return std::make_unique<unicode_normalizer>(unicode::normal_form::nfkc);
  if (type == "NFKD")
    return std::make_unique<unicode_normalizer>(unicode::normal_form::nfkd);
  if (type == "Lowercase")
    return std::make_unique<lowercase_normalizer>();
  if (type == "Strip")
    return std::make_unique<strip_normalizer>(j.value("strip_left", true),
                                              j.value("strip_right", true));
  if (type == "StripAccents")
    return std::make_unique<strip_accents_normalizer>();
  if (type == "Replace")
    return std::make_unique<replace_normalizer>(read_pattern(j.value("pattern", json()),
                                                             at.at("pattern")),
                                                read_string(j, "content", at));
  if (type == "Prepend")
    return std::make_unique<prepend_normalizer>(read_string(j, "prepend", at));
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array())
      at.at("normalizers").fail("missing or not an array");
    std::vector<std::unique_ptr<normalizer>> parts;
    for (size_t i = 0; i < it->size(); ++i)
      if (auto p = make((*it)[i], at.at("normalizers").at(i)))
        parts.push_back(std::move(p));
    return std::make_unique<sequence_normalizer>(std::move(parts));
  }
  at.at("type").fail("unsupported normalizer '" + type + "'");
}

} // namespace metronome
