#pragma once
// Bookkeeping of a KV cache in fixed-size pages: a free list and one page
// table per sequence. Plain C++; the scheduler owns one (sched/scheduler.hpp)
// and grants pages from it as it plans. The memory belongs to the executor.

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace metronome {

class kv_page_pool {
public:
  explicit kv_page_pool(int32_t num_pages = 0);

  /// Appends `pages` pages to `seq`'s table: all or nothing. Returns the page
  /// ids added, or nullopt (and changes nothing) when too few are free.
  std::optional<std::vector<int32_t>> grow(uint64_t seq, int32_t pages);

  /// Returns all pages of `seq` to the free list. Returns false (and counts
  /// an unmatched free) when `seq` holds no pages.
  bool release(uint64_t seq);

  /// Forgets every table; the pool now has `num_pages` free pages.
  void reset(int32_t num_pages);

  /// The page table of `seq`, or nullptr.
  const std::vector<int32_t>* table(uint64_t seq) const;

  int32_t num_pages() const {
    return num_pages_;
  }
  int32_t free_pages() const {
    return int32_t(free_.size());
  }
  int32_t used_pages() const {
    return num_pages_ - free_pages();
  }
  int32_t sequences() const {
    return int32_t(tables_.size());
  }
  int64_t unmatched_frees() const {
    return unmatched_frees_;
  }

private:
  int32_t num_pages_ = 0;
  std::vector<int32_t> free_; // LIFO: recently freed pages are reused first
  std::unordered_map<uint64_t, std::vector<int32_t>> tables_;
  int64_t unmatched_frees_ = 0;
};

} // namespace metronome
