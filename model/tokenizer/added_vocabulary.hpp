#pragma once
// The added tokens of a tokenizer.json (special tokens like <|eot_id|>, and
// non-special ones like Qwen's <think>): found in the input before the model
// sees it, with the lstrip / rstrip / single_word / normalized flags.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace metronome {

struct added_token {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

/// One piece of input text: either an added token or text for the model.
struct added_split {
  size_t begin, end;      ///< byte range in the searched text
  std::optional<int32_t> token; ///< the added token's id, if it is one
};

/// Leftmost-longest matcher over a set of added tokens (a byte trie).
class added_token_matcher {
public:
  /// `tokens` (borrowed for the matcher's lifetime): index into it is stored.
  void build(const std::vector<added_token>& tokens, const std::vector<std::string>& keys,
             const std::vector<size_t>& which);

  bool empty() const noexcept {
    return nodes_.size() <= 1;
  }

  /// Splits `text` like the reference's AddedVocabulary::find_matches.
  /// `skip_special`: special tokens are not matched (plain text).
  void split(std::string_view text, const std::vector<added_token>& tokens, bool skip_special,
             std::vector<added_split>& out) const;

private:
  struct node {
    int32_t token = -1; ///< index into tokens, or -1
    std::vector<std::pair<unsigned char, int32_t>> next;
  };
  int32_t child(int32_t n, unsigned char c) const noexcept;

  std::vector<node> nodes_{1};
  bool first_byte_[256] = {};
};

class added_vocabulary {
public:
  std::vector<added_token> tokens;
  added_token_matcher raw;        ///< tokens with normalized == false
  added_token_matcher normalized; ///< tokens with normalized == true

  /// Builds the lookups and matchers once `tokens` is filled;
  /// `normalized_keys[i]` is tokens[i].content after the normalizer.
  void build(const std::vector<std::string>& normalized_keys);

  const added_token* find(int32_t id) const;
  const added_token* find(std::string_view content) const;

private:
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string_view, size_t> by_content_;
};

} // namespace metronome
