#pragma once
// Bookkeeping of a KV cache in fixed-size pages: a free list, one page table
// per sequence, and the prefix cache. Plain C++; the scheduler owns one
// (sched/scheduler.hpp) and grants pages from it as it plans. The memory
// belongs to the executor.
//
// Design note (prefix caching, as vLLM's automatic prefix caching). A full
// page can be named by the tokens it holds and everything before them: the
// scheduler hashes each full page's tokens chained to the previous page's
// hash (seeded by a salt that names the model and the KV dtype) and tells the
// pool (cache()). A page has a reference count: one per sequence whose table
// holds it. When the last reference goes, a named page is not freed but kept,
// least recently used first in line for eviction; an unnamed one is freed.
// A new sequence looks its prompt's page hashes up (match()) and shares the
// longest run of cached pages (share()), whose keys and values are then
// never computed again; only full pages are named, so a page a sequence
// still writes is never shared. grow() takes free pages first, then evicts
// cached ones. A match is exact, not only by hash: each cached page keeps
// its tokens and its predecessor (page id and that page's generation, which
// changes when the page is evicted), and both must agree.

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace metronome {

/// The chained hash of one full page: `prev` is the previous page's hash (the
/// salt for the first page), `tokens` the page's tokens. Never 0.
uint64_t page_hash(uint64_t prev, std::span<const int32_t> tokens);

class kv_page_pool {
public:
  explicit kv_page_pool(int32_t num_pages = 0, int32_t page_size = 16);

  /// Appends `pages` fresh pages to `seq`'s table (free ones first, then the
  /// least recently used cached ones, which leave the cache): all or
  /// nothing. Returns the page ids added, or nullopt (and changes nothing)
  /// when too few are free.
  std::optional<std::vector<int32_t>> grow(uint64_t seq, int32_t pages);

  /// The cached pages holding the longest prefix of a sequence whose full
  /// pages have the chained hashes `hashes` and the tokens `tokens` (at
  /// least hashes.size() x page_size of them). Changes nothing.
  std::vector<int32_t> match(std::span<const uint64_t> hashes,
                             std::span<const int32_t> tokens) const;

  /// Of `pages` (from match()), those no table holds: sharing them takes
  /// them out of free_pages().
  int32_t unreferenced(std::span<const int32_t> pages) const;

  /// Appends cached `pages` (from match() with nothing evicted since) to
  /// `seq`'s table, taking a reference to each.
  void share(uint64_t seq, std::span<const int32_t> pages);

  /// Names the full page at `index` of `seq`'s table: it holds `tokens`
  /// (page_size of them) after the page at index - 1, and its chained hash
  /// is `hash`. Nothing happens when it is named already or another page
  /// holds the same hash.
  void cache(uint64_t seq, int32_t index, uint64_t hash, std::span<const int32_t> tokens);

  /// Drops `seq`'s references: its named pages stay cached (its last pages
  /// first in line for eviction, its first ones last), the others are free.
  /// Returns false (and counts an unmatched free) when `seq` holds no pages.
  bool release(uint64_t seq);

  /// Un-names the pages of `seq`'s table from `index` on (they stay in its
  /// table, and are freed, not kept, when released): pages whose contents
  /// must not be matched again (the KV overflowed there). Nothing happens
  /// for an unknown `seq`.
  void unname_from(uint64_t seq, int32_t index);
  /// Forgets every table and the cache; the pool now has `num_pages` free
  /// pages.
  void reset(int32_t num_pages);

  /// The page table of `seq`, or nullptr.
  const std::vector<int32_t>* table(uint64_t seq) const;

  int32_t num_pages() const {
    return num_pages_;
  }
  int32_t page_size() const {
    return page_size_;
  }
  /// Pages grow() can hand out: free, or cached with no table holding them.
  int32_t free_pages() const {
    return int32_t(free_.size()) + lru_size_;
  }
  /// Pages some table holds.
  int32_t used_pages() const {
    return num_pages_ - free_pages();
  }
  /// Named pages (held or not).
  int32_t cached_pages() const {
    return named_;
  }
  /// Cached pages grow() evicted.
  int64_t evictions() const {
    return evictions_;
  }
  int32_t sequences() const {
    return int32_t(tables_.size());
  }
  int64_t unmatched_frees() const {
    return unmatched_frees_;
  }
  /// References `page` has (tables holding it).
  int32_t references(int32_t page) const {
    return refs_[size_t(page)];
  }

private:
  // Everything is sized at reset(): a long-running server's heap does not
  // grow as the cache fills (the soak test holds it to bytes a request).
  struct page_info {
    uint64_t hash = 0;         // 0: not named
    uint64_t generation = 0;   // +1 each time it leaves the cache
    int32_t parent = -1;       // the page before it when named
    uint64_t parent_generation = 0;
    int32_t lru_prev = -1, lru_next = -1; // in the eviction list when named and unreferenced
    bool in_lru = false;
  };
  void unname(int32_t page);
  void lru_push_back(int32_t page);
  void lru_remove(int32_t page);
  /// by_hash_: open addressing, linear probing; -1 empty.
  int32_t find_hash(uint64_t hash) const;
  void insert_hash(int32_t page);
  void erase_hash(int32_t page);

  int32_t num_pages_ = 0;
  int32_t page_size_ = 16;
  std::vector<int32_t> free_; // unnamed, unreferenced; LIFO
  int32_t lru_head_ = -1, lru_tail_ = -1; // head: evicted first
  int32_t lru_size_ = 0;
  std::vector<int32_t> refs_;
  std::vector<page_info> info_;
  std::vector<int32_t> tokens_; // [page][page_size]: a named page's tokens
  std::vector<int32_t> by_hash_;
  int32_t named_ = 0;
  std::unordered_map<uint64_t, std::vector<int32_t>> tables_;
  int64_t unmatched_frees_ = 0;
  int64_t evictions_ = 0;
};

} // namespace metronome
