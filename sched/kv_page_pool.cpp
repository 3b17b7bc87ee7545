#include "sched/kv_page_pool.hpp"

#include <algorithm>
#include <stdexcept>

namespace metronome {

namespace {

/// splitmix64's finaliser: a bijection of 64-bit words with full avalanche.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

} // namespace

uint64_t page_hash(uint64_t prev, std::span<const int32_t> tokens) {
  uint64_t h = mix(prev ^ 0x9e3779b97f4a7c15ull);
  for (int32_t t : tokens)
    h = mix(h ^ (uint64_t(uint32_t(t)) + 0x9e3779b97f4a7c15ull));
  h = mix(h ^ uint64_t(tokens.size()));
  return h == 0 ? 1 : h;
}

kv_page_pool::kv_page_pool(int32_t num_pages, int32_t page_size) : page_size_(page_size) {
  reset(num_pages);
}

void kv_page_pool::reset(int32_t num_pages) {
  num_pages_ = num_pages;
  tables_.clear();
  refs_.assign(size_t(num_pages), 0);
  info_.assign(size_t(num_pages), page_info{});
  tokens_.assign(size_t(num_pages) * size_t(page_size_), 0);
  size_t slots = 16;
  while (slots < 2 * size_t(num_pages))
    slots *= 2;
  by_hash_.assign(slots, -1);
  named_ = 0;
  lru_head_ = lru_tail_ = -1;
  lru_size_ = 0;
  free_.clear();
  free_.reserve(size_t(num_pages));
  for (int32_t p = num_pages - 1; p >= 0; --p) // page 0 is handed out first
    free_.push_back(p);
}

// -- the hash index ----------------------------------------------------------------------

int32_t kv_page_pool::find_hash(uint64_t hash) const {
  const size_t mask = by_hash_.size() - 1;
  for (size_t i = size_t(hash) & mask;; i = (i + 1) & mask) {
    const int32_t p = by_hash_[i];
    if (p < 0)
      return -1;
    if (info_[size_t(p)].hash == hash)
      return p;
  }
}

void kv_page_pool::insert_hash(int32_t page) {
  const size_t mask = by_hash_.size() - 1;
  size_t i = size_t(info_[size_t(page)].hash) & mask;
  while (by_hash_[i] >= 0)
    i = (i + 1) & mask;
  by_hash_[i] = page;
  ++named_;
}

void kv_page_pool::erase_hash(int32_t page) {
  const size_t mask = by_hash_.size() - 1;
  size_t i = size_t(info_[size_t(page)].hash) & mask;
  while (by_hash_[i] != page)
    i = (i + 1) & mask;
  // Backward-shift deletion: entries after the hole that probed past it move
  // back, so lookups never stop early at it.
  for (size_t j = (i + 1) & mask; by_hash_[j] >= 0; j = (j + 1) & mask) {
    const size_t home = size_t(info_[size_t(by_hash_[j])].hash) & mask;
    if (((j - home) & mask) >= ((j - i) & mask)) {
      by_hash_[i] = by_hash_[j];
      i = j;
    }
  }
  by_hash_[i] = -1;
  --named_;
}

// -- the eviction list -------------------------------------------------------------------

void kv_page_pool::lru_push_back(int32_t page) {
  auto& in = info_[size_t(page)];
  in.lru_prev = lru_tail_;
  in.lru_next = -1;
  in.in_lru = true;
  if (lru_tail_ >= 0)
    info_[size_t(lru_tail_)].lru_next = page;
  else
    lru_head_ = page;
  lru_tail_ = page;
  ++lru_size_;
}

void kv_page_pool::lru_remove(int32_t page) {
  auto& in = info_[size_t(page)];
  if (in.lru_prev >= 0)
    info_[size_t(in.lru_prev)].lru_next = in.lru_next;
  else
    lru_head_ = in.lru_next;
  if (in.lru_next >= 0)
    info_[size_t(in.lru_next)].lru_prev = in.lru_prev;
  else
    lru_tail_ = in.lru_prev;
  in.lru_prev = in.lru_next = -1;
  in.in_lru = false;
  --lru_size_;
}

void kv_page_pool::unname(int32_t page) {
  auto& in = info_[size_t(page)];
  if (in.hash == 0)
    return;
  erase_hash(page);
  in.hash = 0;
  in.parent = -1;
  ++in.generation;
}

// -- tables ------------------------------------------------------------------------------

std::optional<std::vector<int32_t>> kv_page_pool::grow(uint64_t seq, int32_t pages) {
  if (pages < 0 || pages > free_pages())
    return std::nullopt;
  std::vector<int32_t> added;
  added.reserve(size_t(pages));
  while (int32_t(added.size()) < pages && !free_.empty()) {
    added.push_back(free_.back());
    free_.pop_back();
  }
  while (int32_t(added.size()) < pages) {
    const int32_t p = lru_head_;
    lru_remove(p);
    unname(p);
    ++evictions_;
    added.push_back(p);
  }
  for (int32_t p : added)
    refs_[size_t(p)] = 1;
  if (pages > 0) {
    auto& t = tables_[seq];
    t.insert(t.end(), added.begin(), added.end());
  }
  return added;
}

std::vector<int32_t> kv_page_pool::match(std::span<const uint64_t> hashes,
                                         std::span<const int32_t> tokens) const {
  std::vector<int32_t> out;
  const size_t ps = size_t(page_size_);
  int32_t prev = -1;
  uint64_t prev_gen = 0;
  for (size_t i = 0; i < hashes.size() && (i + 1) * ps <= tokens.size(); ++i) {
    const int32_t p = find_hash(hashes[i]);
    if (p < 0)
      break;
    const auto& in = info_[size_t(p)];
    const auto stored = tokens_.begin() + int64_t(size_t(p) * ps);
    if (in.parent != prev || (prev >= 0 && in.parent_generation != prev_gen)
        || !std::equal(stored, stored + int64_t(ps), tokens.begin() + int64_t(i * ps)))
      break;
    out.push_back(p);
    prev = p;
    prev_gen = in.generation;
  }
  return out;
}

int32_t kv_page_pool::unreferenced(std::span<const int32_t> pages) const {
  int32_t n = 0;
  for (int32_t p : pages)
    n += refs_[size_t(p)] == 0;
  return n;
}

void kv_page_pool::share(uint64_t seq, std::span<const int32_t> pages) {
  if (pages.empty())
    return;
  for (int32_t p : pages) {
    if (info_[size_t(p)].hash == 0)
      throw std::logic_error("kv_page_pool: sharing a page that is not cached");
    if (refs_[size_t(p)]++ == 0)
      lru_remove(p);
  }
  auto& t = tables_[seq];
  t.insert(t.end(), pages.begin(), pages.end());
}

void kv_page_pool::cache(uint64_t seq, int32_t index, uint64_t hash,
                         std::span<const int32_t> tokens) {
  auto it = tables_.find(seq);
  if (it == tables_.end() || index < 0 || index >= int32_t(it->second.size())
      || int32_t(tokens.size()) != page_size_ || hash == 0)
    throw std::logic_error("kv_page_pool: caching a page the sequence does not hold");
  const int32_t p = it->second[size_t(index)];
  auto& in = info_[size_t(p)];
  if (in.hash != 0 || find_hash(hash) >= 0)
    return;
  in.hash = hash;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + int64_t(size_t(p) * size_t(page_size_)));
  in.parent = index > 0 ? it->second[size_t(index) - 1] : -1;
  in.parent_generation = in.parent >= 0 ? info_[size_t(in.parent)].generation : 0;
  insert_hash(p);
}

bool kv_page_pool::release(uint64_t seq) {
  auto i = tables_.find(seq);
  if (i == tables_.end()) {
    ++unmatched_frees_;
    return false;
  }
  // Last pages first: a prefix shared by many stays longest.
  for (auto p = i->second.rbegin(); p != i->second.rend(); ++p) {
    if (--refs_[size_t(*p)] > 0)
      continue;
    if (info_[size_t(*p)].hash != 0)
      lru_push_back(*p);
    else
      free_.push_back(*p);
  }
  tables_.erase(i);
  return true;
}

void kv_page_pool::unname_from(uint64_t seq, int32_t index) {
  auto i = tables_.find(seq);
  if (i == tables_.end())
    return;
  for (size_t p = size_t(std::max(index, 0)); p < i->second.size(); ++p)
    unname(i->second[p]);
}

const std::vector<int32_t>* kv_page_pool::table(uint64_t seq) const {
  auto i = tables_.find(seq);
  return i == tables_.end() ? nullptr : &i->second;
}

} // namespace metronome
