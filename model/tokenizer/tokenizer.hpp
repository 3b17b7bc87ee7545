#pragma once
// A Hugging Face tokenizer.json (plus tokenizer_config.json) in C++: encode
// text to token ids and decode ids to text, byte for byte as the reference
// implementation does for the BPE tokenizers of Llama 2/3, Mistral, Qwen and
// GPT-2.
//
// Threading: a tokenizer is immutable after load(); encode() and decode()
// may be called from any number of threads at once (io threads of the
// server). The incremental_decoder is per sequence and not thread-safe.
//
// Encoding a rendered chat template: chat_template::apply() already puts the
// BOS text (e.g. "<|begin_of_text|>" or "<s>") at the start where the
// model's template does, so encode the result with
// {.add_special_tokens = false, .parse_special = true}: the special-token
// text then maps to the control ids and no second BOS is added.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/tokenizer/added_vocabulary.hpp"

namespace metronome {

class bpe_model;
class normalizer;
class pre_tokenizer;
class decoder;
class post_processor;
class text_pattern;

class tokenizer {
public:
  ~tokenizer();

  /// Loads tokenizer.json (and tokenizer_config.json if present) from `dir`.
  /// Throws model_error naming the file and the field that is wrong.
  static std::shared_ptr<const tokenizer> load(const std::filesystem::path& dir);

  struct encode_options {
    /// Add what the post-processor adds (e.g. BOS for Llama 2 and Mistral).
    bool add_special_tokens = true;
    /// Map the text of special tokens in the input to their ids. false: such
    /// text is plain text (the safe choice for user content on a server).
    bool parse_special = true;
  };

  /// Token ids of `text`. Invalid UTF-8 is first repaired: each ill-formed
  /// subsequence becomes U+FFFD (what Python's errors="replace" and Rust's
  /// from_utf8_lossy do). Thread-safe.
  std::vector<int32_t> encode(std::string_view text, encode_options options) const;
  std::vector<int32_t> encode(std::string_view text) const {
    return encode(text, encode_options{});
  }

  struct decode_options {
    bool skip_special_tokens = true;
    /// The clean_up_tokenization_spaces of transformers (" ." -> "." etc.).
    /// Off by default, like vLLM and the tokenizers library; the value in
    /// tokenizer_config.json is clean_up_tokenization_spaces().
    bool clean_up_spaces = false;
  };

  /// Text of `ids`. Ids without a token are skipped. Thread-safe.
  std::string decode(std::span<const int32_t> ids, decode_options options) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const {
    return decode(ids, decode_options{skip_special_tokens, false});
  }

  /// Highest id + 1, counting added tokens.
  int32_t vocab_size() const noexcept {
    return vocab_size_;
  }

  /// Id of a token string (added tokens first, then the model vocabulary).
  std::optional<int32_t> token_to_id(std::string_view token) const;

  /// Token string of an id (as stored: "Ġthe", "▁the", "<0x0A>").
  std::optional<std::string> id_to_token(int32_t id) const;

  /// The bytes token `id` adds to a text it is in the middle of (" the" for
  /// "Ġthe" or "▁the", one byte for "<0x0A>" or for a byte-level token
  /// holding part of a character; an added token's content). Not always
  /// valid UTF-8. Empty for an id without a token. Thread-safe.
  std::string token_bytes(int32_t id) const;

  /// From tokenizer_config.json's bos_token / eos_token when present.
  std::optional<int32_t> bos_id() const noexcept {
    return bos_id_;
  }
  std::optional<int32_t> eos_id() const noexcept {
    return eos_id_;
  }
  const std::string& bos_token() const noexcept {
    return bos_token_;
  }
  const std::string& eos_token() const noexcept {
    return eos_token_;
  }

  /// True for added tokens marked special (BOS, EOS, <|eot_id|>, ...).
  bool is_special(int32_t id) const;

  /// clean_up_tokenization_spaces from tokenizer_config.json (default false).
  bool clean_up_tokenization_spaces() const noexcept {
    return clean_up_spaces_;
  }

  /// The folder it was loaded from.
  const std::filesystem::path& dir() const noexcept {
    return dir_;
  }

  /// Applies the decoder chain to token strings (used by the incremental
  /// decoder, which keeps its own window of tokens).
  std::string decode_tokens(std::vector<std::string> tokens) const;

private:
  tokenizer();
  void encode_segment(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  void encode_normalized(std::string_view text, bool at_start, bool parse_special,
                         std::vector<int32_t>& out) const;

  std::filesystem::path dir_;
  std::unique_ptr<bpe_model> model_;
  std::unique_ptr<normalizer> normalizer_;
  std::unique_ptr<pre_tokenizer> pre_tokenizer_;
  const text_pattern* stream_split_ = nullptr; ///< see pre_tokenizer::streaming()
  bool stream_bytes_ = false;
  bool streaming_ = false;
  std::unique_ptr<decoder> decoder_;
  std::unique_ptr<post_processor> post_processor_;
  added_vocabulary added_;
  int32_t vocab_size_ = 0;
  std::optional<int32_t> bos_id_, eos_id_;
  std::string bos_token_, eos_token_;
  bool clean_up_spaces_ = false;
};

/// Streaming detokenizer for one sequence. push(id) returns the text that is
/// now final: never a partial UTF-8 character and never a U+FFFD standing
/// for bytes that are still incomplete. The concatenation of all pushes and
/// finish() equals tokenizer::decode(all ids), with one exception: where a
/// run of byte-fallback tokens (Llama 2, Mistral) is valid UTF-8 at first
/// and a later byte of the run makes it invalid, decode() gives U+FFFD for
/// every byte of the run while the stream keeps the part it already
/// emitted; the text after the run is the same. Not thread-safe; use one
/// per sequence, on the thread that owns the sequence.
class incremental_decoder {
public:
  explicit incremental_decoder(std::shared_ptr<const tokenizer> tok,
                               bool skip_special_tokens = true);

  /// Adds one id; returns the text that became final (possibly empty).
  std::string push(int32_t id);

  /// Returns what is still held back (e.g. an incomplete byte sequence that
  /// the model never completed, as U+FFFD) and resets the decoder.
  std::string finish();

private:
  std::string window_text(size_t begin, size_t end) const;

  std::shared_ptr<const tokenizer> tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_ = 0; ///< window start: tokens before it are out of play
  size_t read_ = 0;   ///< tokens before it have been emitted
  std::string prefix_text_;
};

} // namespace metronome
