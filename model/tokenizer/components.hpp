#pragma once
// The pipeline stages of a tokenizer.json: normalizers, pre-tokenizers,
// decoders and post-processors, each built from its JSON object. All stages
// are immutable after construction and safe to use from many threads.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace metronome {

/// Where a JSON value came from, for model_error messages.
struct json_origin {
  std::string file;  ///< e.g. ".../tokenizer.json"
  std::string field; ///< e.g. "pre_tokenizer.pretokenizers[0].pattern"

  json_origin at(const std::string& key) const {
    return {file, field.empty() ? key : field + "." + key};
  }
  json_origin at(size_t index) const {
    return {file, field + "[" + std::to_string(index) + "]"};
  }
  [[noreturn]] void fail(const std::string& problem) const;
};

class text_pattern;

/// Reads a {"String": ...} / {"Regex": ...} pattern object.
text_pattern read_pattern(const nlohmann::json& j, const json_origin& at);

/// Reads a required string member.
std::string read_string(const nlohmann::json& j, const char* key, const json_origin& at);

// -- normalizers ----------------------------------------------------------------

/// Rewrites the text before it is split into words.
class normalizer {
public:
  virtual ~normalizer() = default;
  /// Normalizes `text` (valid UTF-8) in place.
  virtual void normalize(std::string& text) const = 0;

  /// Builds the normalizer a tokenizer.json object describes (nullptr for null).
  static std::unique_ptr<normalizer> make(const nlohmann::json& j, const json_origin& at);
};

// -- pre-tokenizers ---------------------------------------------------------------

/// A span of text on its way to the model.
struct text_piece {
  std::string text;
  bool at_start = false; ///< begins at offset 0 of the (normalized) input
};

/// Splits pieces into smaller ones (and may rewrite them).
class pre_tokenizer {
public:
  virtual ~pre_tokenizer() = default;
  virtual void pre_tokenize(std::vector<text_piece>& pieces) const = 0;

  /// The shape of Llama 3, Qwen and GPT-2: split at the matches of one
  /// pattern keeping everything (Isolated), then optionally map bytes to the
  /// byte-level alphabet. Such a pre-tokenizer describes itself with a plan,
  /// so encode can stream words to the model without building pieces.
  struct streaming_plan {
    const text_pattern* split = nullptr; ///< null: the text is one word
    bool byte_level = false;
  };
  virtual std::optional<streaming_plan> streaming() const {
    return std::nullopt;
  }

  static std::unique_ptr<pre_tokenizer> make(const nlohmann::json& j, const json_origin& at);
};

// -- decoders ---------------------------------------------------------------------

/// Turns the token strings of a sequence back into text.
class decoder {
public:
  virtual ~decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  /// The same, leaving bytes that form no UTF-8 character as they are
  /// (what a single token of a character split across tokens decodes to).
  virtual void decode_chain_raw(std::vector<std::string>& tokens) const {
    decode_chain(tokens);
  }

  static std::unique_ptr<decoder> make(const nlohmann::json& j, const json_origin& at);
};

// -- post-processors ----------------------------------------------------------------

/// Adds the special tokens around an encoded sequence (BOS/EOS, CLS/SEP).
class post_processor {
public:
  virtual ~post_processor() = default;
  virtual void process(std::vector<int32_t>& ids) const = 0;

  static std::unique_ptr<post_processor> make(const nlohmann::json& j, const json_origin& at);

  /// `prefix` + sequence + `suffix` (used when tokenizer_config.json overrides).
  static std::unique_ptr<post_processor> wrap(std::vector<int32_t> prefix,
                                              std::vector<int32_t> suffix);
};

} // namespace metronome
