#pragma once
// Prompts of an exact token count, cut from a corpus: what a load test
// needs to send a trace's prompt lengths to a real server.
//
// Design note. The corpus is encoded once into a token stream. A prompt of
// n tokens at offset o takes the window stream[o, o + k), decodes it to
// text and re-encodes that text the way the server will (with the special
// tokens its post-processor adds, e.g. BOS, for the completions endpoint);
// re-encoding can merge across the window's edges, so the count may differ
// from k + specials. k is corrected by the difference until the count is
// exact; if the correction cycles, the window moves one token on and the
// search starts again. Callers give each request its own offset (the sum of
// the previous requests' lengths), so no two prompts share text by accident.
//
// Threading: construct on any thread; make() is const and thread-safe (the
// tokenizer is immutable).

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace metronome {
class tokenizer;
}

namespace metronome::bench {

class prompt_builder {
public:
  /// Encodes `corpus` with `tok`. `with_special_tokens`: count what the
  /// tokenizer's post-processor adds (BOS), as a completions server does
  /// for a text prompt; false for chat message content. Throws
  /// std::invalid_argument when the corpus has fewer than 2 tokens.
  prompt_builder(std::shared_ptr<const tokenizer> tok, const std::string& corpus,
                 bool with_special_tokens);

  /// Reads up to `max_bytes` of `file` (0 = all; cut at a line end so no
  /// character is split) and builds on it. Throws std::runtime_error naming
  /// the file when it cannot be read.
  static prompt_builder from_file(std::shared_ptr<const tokenizer> tok,
                                  const std::filesystem::path& file, bool with_special_tokens,
                                  size_t max_bytes = 0);

  struct prompt {
    std::string text;
    /// Its token count as the server will count it (== the request unless
    /// the request was below min_tokens()).
    int32_t tokens = 0;
  };

  /// A prompt of exactly `tokens` tokens (at least min_tokens()) from the
  /// corpus window at token `offset` (taken modulo the corpus length).
  /// Throws std::runtime_error if no window near the offset gives the count.
  prompt make(int32_t tokens, int64_t offset) const;

  /// The smallest count make() can hit: the special tokens plus one.
  int32_t min_tokens() const noexcept {
    return specials_ + 1;
  }

  /// Tokens in the encoded corpus.
  int64_t corpus_tokens() const noexcept {
    return int64_t(stream_.size());
  }

  /// The count the server would see for `text`.
  int32_t count(const std::string& text) const;

private:
  std::shared_ptr<const tokenizer> tok_;
  std::vector<int32_t> stream_;
  bool with_special_;
  int32_t specials_ = 0;
};

/// The corpus bench-serve reads by default: corpora/moby_dick.txt of the
/// shared test data ($METRONOME_TESTDATA when set, else the shared/ folder
/// the build was configured with).
std::filesystem::path default_corpus_path();

} // namespace metronome::bench
