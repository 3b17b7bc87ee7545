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
  by_hash_.clear();
  lru_.clear();
  lru_pos_.assign(size_t(num_pages), lru_.end());
  refs_.assign(size_t(num_pages), 0);
  info_.assign(size_t(num_pages), page_info{});
  free_.clear();
  free_.reserve(size_t(num_pages));
  for (int32_t p = num_pages - 1; p >= 0; --p) // page 0 is handed out first
    free_.push_back(p);
}

void kv_page_pool::unname(int32_t page) {
  auto& in = info_[size_t(page)];
  if (in.hash == 0)
    return;
  by_hash_.erase(in.hash);
  in.hash = 0;
  in.parent = -1;
  in.tokens.clear();
  ++in.generation;
}

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
    const int32_t p = lru_.front();
    lru_.pop_front();
    lru_pos_[size_t(p)] = lru_.end();
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
    auto it = by_hash_.find(hashes[i]);
    if (it == by_hash_.end())
      break;
    const int32_t p = it->second;
    const auto& in = info_[size_t(p)];
    if (in.parent != prev || (prev >= 0 && in.parent_generation != prev_gen)
        || !std::equal(in.tokens.begin(), in.tokens.end(), tokens.begin() + int64_t(i * ps),
                       tokens.begin() + int64_t((i + 1) * ps)))
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
    if (refs_[size_t(p)]++ == 0) {
      lru_.erase(lru_pos_[size_t(p)]);
      lru_pos_[size_t(p)] = lru_.end();
    }
  }
  auto& t = tables_[seq];
  t.insert(t.end(), pages.begin(), pages.end());
}

void kv_page_pool::cache(uint64_t seq, int32_t index, uint64_t hash,
                         std::span<const int32_t> tokens) {
  auto it = tables_.find(seq);
  if (it == tables_.end() || index < 0 || index >= int32_t(it->second.size())
      || int32_t(tokens.size()) != page_size_)
    throw std::logic_error("kv_page_pool: caching a page the sequence does not hold");
  const int32_t p = it->second[size_t(index)];
  auto& in = info_[size_t(p)];
  if (in.hash != 0 || by_hash_.contains(hash))
    return;
  in.hash = hash;
  in.tokens.assign(tokens.begin(), tokens.end());
  in.parent = index > 0 ? it->second[size_t(index) - 1] : -1;
  in.parent_generation = in.parent >= 0 ? info_[size_t(in.parent)].generation : 0;
  by_hash_.emplace(hash, p);
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
      lru_pos_[size_t(*p)] = lru_.insert(lru_.end(), *p);
    else
      free_.push_back(*p);
  }
  tables_.erase(i);
  return true;
}

const std::vector<int32_t>* kv_page_pool::table(uint64_t seq) const {
  auto i = tables_.find(seq);
  return i == tables_.end() ? nullptr : &i->second;
}

} // namespace metronome
