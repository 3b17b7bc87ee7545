#include "sched/kv_buckets.hpp"

#include <algorithm>
#include <stdexcept>

namespace metronome {

std::string to_string(kv_strategy s) {
  return s == kv_strategy::bucketed ? "bucketed" : "paged";
}

std::optional<kv_strategy> parse_kv_strategy(std::string_view name) {
  if (name == "paged")
    return kv_strategy::paged;
  if (name == "bucketed")
    return kv_strategy::bucketed;
  return std::nullopt;
}

void kv_buckets::reset(int32_t num_pages, int32_t page_size, int32_t min_tokens,
                       int32_t per_size, int32_t max_model_len) {
  classes_.clear();
  if (num_pages <= 0 || page_size <= 0 || min_tokens <= 0 || per_size <= 0)
    return;
  int64_t set_pages = 0; // one bucket of every class
  for (int64_t t = min_tokens, i = 0; i < 4 && t <= int64_t(max_model_len); t *= 2, ++i) {
    bucket_class c;
    c.tokens = int32_t(t);
    c.pages = int32_t((t + page_size - 1) / page_size);
    classes_.push_back(c);
    set_pages += c.pages;
  }
  // Every bucket backed by the pool at once: fewer per class when it is
  // small (none at all when one set does not fit).
  const int64_t fit = set_pages > 0 ? int64_t(num_pages) / set_pages : 0;
  const auto count = int32_t(std::min<int64_t>(per_size, fit));
  if (count == 0) {
    classes_.clear();
    return;
  }
  for (auto& c : classes_)
    c.count = c.free = count;
}

int32_t kv_buckets::find(int64_t tokens) const {
  for (size_t i = 0; i < classes_.size(); ++i)
    if (classes_[i].tokens >= tokens && classes_[i].free > 0)
      return int32_t(i);
  return -1;
}

void kv_buckets::take(int32_t c) {
  auto& k = classes_.at(size_t(c));
  if (k.free <= 0)
    throw std::logic_error("kv_buckets: take from a class with no free bucket");
  --k.free;
}

void kv_buckets::give(int32_t c) {
  auto& k = classes_.at(size_t(c));
  if (k.free >= k.count)
    throw std::logic_error("kv_buckets: a bucket given back twice");
  ++k.free;
}

} // namespace metronome
