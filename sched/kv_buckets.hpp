#pragma once
// The seeds' bucketed KV pre-allocation, as a strategy over the paged pool
// (engine.kv_strategy: bucketed).
//
// Design note. A bucket is a reservation of pages, not a separate memory
// region: the pool stays one pool of pages, and a request admitted into a
// bucket is guaranteed that many pages for its whole life (prompt, output,
// and recomputation), so it is never preempted for memory. Classes are
// min_tokens x 1, 2, 4 and 8 (the seeds' 4k/8k/16k/32k), up to the context
// length; each has per_size buckets, fewer when the pool cannot back every
// bucket at once. A request takes the smallest free class that holds its
// prompt plus the output it may produce (or its max_context_length hint);
// none free, or none large enough: it overflows into ordinary pages. The
// price is memory reserved and unused: a bucket is sized for the longest
// output, most requests stop well before it. Plain C++, no actors; the
// scheduler owns one and calls it on its own thread.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace metronome {

/// How KV memory is granted (engine.kv_strategy, X-KV-Cache-Mode): pages on
/// demand, a request preempted when they run out (paged), or reserved
/// buckets with overflow into pages (bucketed).
enum class kv_strategy : uint8_t { paged, bucketed };

/// "paged" or "bucketed".
std::string to_string(kv_strategy s);
/// The strategy named `name` (exactly "paged" or "bucketed"), or nullopt.
std::optional<kv_strategy> parse_kv_strategy(std::string_view name);

class kv_buckets {
public:
  /// Sets the classes for a pool of num_pages pages of page_size tokens;
  /// every bucket free. per_size 0 or min_tokens 0: no buckets.
  void reset(int32_t num_pages, int32_t page_size, int32_t min_tokens, int32_t per_size,
             int32_t max_model_len);

  /// The smallest class with a free bucket of at least `tokens`, or -1.
  int32_t find(int64_t tokens) const;
  /// Takes a bucket of class c (find returned it) / gives it back.
  void take(int32_t c);
  void give(int32_t c);

  int32_t classes() const {
    return int32_t(classes_.size());
  }
  /// Tokens and pages of a bucket of class c.
  int32_t tokens(int32_t c) const {
    return classes_[std::size_t(c)].tokens;
  }
  int32_t pages(int32_t c) const {
    return classes_[std::size_t(c)].pages;
  }
  /// Buckets of class c in all, and free now.
  int32_t count(int32_t c) const {
    return classes_[std::size_t(c)].count;
  }
  int32_t free(int32_t c) const {
    return classes_[std::size_t(c)].free;
  }

private:
  struct bucket_class {
    int32_t tokens = 0, pages = 0, count = 0, free = 0;
  };
  std::vector<bucket_class> classes_;
};

} // namespace metronome
