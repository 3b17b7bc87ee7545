#include "sched/kv_page_pool.hpp"

#include <algorithm>

namespace metronome {

kv_page_pool::kv_page_pool(int32_t num_pages) {
  reset(num_pages);
}

void kv_page_pool::reset(int32_t num_pages) {
  num_pages_ = num_pages;
  tables_.clear();
  free_.clear();
  free_.reserve(size_t(num_pages));
  for (int32_t p = num_pages - 1; p >= 0; --p) // page 0 is handed out first
    free_.push_back(p);
}

std::optional<std::vector<int32_t>> kv_page_pool::grow(uint64_t seq, int32_t pages) {
  if (pages < 0 || pages > free_pages())
    return std::nullopt;
  std::vector<int32_t> added(free_.end() - pages, free_.end());
  std::reverse(added.begin(), added.end());
  free_.resize(free_.size() - size_t(pages));
  if (pages > 0) {
    auto& t = tables_[seq];
    t.insert(t.end(), added.begin(), added.end());
  }
  return added;
}

bool kv_page_pool::release(uint64_t seq) {
  auto i = tables_.find(seq);
  if (i == tables_.end()) {
    ++unmatched_frees_;
    return false;
  }
  free_.insert(free_.end(), i->second.rbegin(), i->second.rend());
  tables_.erase(i);
  return true;
}

const std::vector<int32_t>* kv_page_pool::table(uint64_t seq) const {
  auto i = tables_.find(seq);
  return i == tables_.end() ? nullptr : &i->second;
}

} // namespace metronome
