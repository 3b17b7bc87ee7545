#pragma once
// The BPE model of tokenizer.json: vocabulary, ranked merges, unknown-token
// handling (unk_token, fuse_unk, byte_fallback) and ignore_merges.

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/tokenizer/components.hpp"

namespace metronome {

/// Hash for heterogeneous (string_view) lookup in string-keyed maps.
struct string_hash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

using string_id_map = std::unordered_map<std::string, int32_t, string_hash, std::equal_to<>>;

class bpe_model {
public:
  /// Reads the "model" object; throws model_error naming the field.
  static std::unique_ptr<bpe_model> make(const nlohmann::json& j, const json_origin& at);

  /// Appends the ids of one pre-tokenized word. Thread-safe.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;

  /// The token string of `id`, or nullptr when the vocabulary has none.
  const std::string* id_to_token(int32_t id) const;

  /// Highest id in the vocabulary (-1 when empty).
  int32_t max_id() const noexcept {
    return static_cast<int32_t>(tokens_.size()) - 1;
  }

private:
  struct merge {
    int32_t rank;
    int32_t new_id;
  };
  struct cache_shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, string_hash, std::equal_to<>> words;
  };
  static constexpr size_t cache_shards = 64;
  static constexpr size_t cache_shard_capacity = 2048;
  static constexpr size_t cache_max_word = 256;

  void tokenize_cached(std::string_view word, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  const merge* find_merge(int32_t left, int32_t right) const;

  string_id_map vocab_;
  std::vector<std::string> tokens_;
  std::vector<bool> has_token_;
  std::unordered_map<uint64_t, merge> merges_;
  std::optional<int32_t> unk_id_;
  std::string prefix_; ///< continuing_subword_prefix
  std::string suffix_; ///< end_of_word_suffix
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool split_at_metaspace_ = false; ///< see make()
  std::array<int32_t, 256> byte_ids_{};    ///< "<0xAB>" tokens, -1 if absent
  std::array<int32_t, 0x800> char_ids_{};  ///< single characters below U+0800, -1 if absent
  mutable std::array<cache_shard, cache_shards> cache_;
};

} // namespace metronome
