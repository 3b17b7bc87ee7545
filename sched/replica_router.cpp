#include "sched/replica_router.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace metronome {

namespace {

/// splitmix64's finaliser: a well-mixed 64-bit value of `x`.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

} // namespace

replica_router::replica_router(replica_router_config config) : config_(config) {
  if (config_.replicas < 1)
    throw std::invalid_argument("replica_router: at least one replica, got "
                                + std::to_string(config_.replicas));
  if (config_.page_size < 1)
    throw std::invalid_argument("replica_router: page_size must be positive");
  replicas_.resize(size_t(config_.replicas));
}

int64_t replica_router::cost_of(std::span<const int32_t> prompt, int32_t max_tokens) const {
  return int64_t(prompt.size()) + (max_tokens > 0 ? max_tokens : config_.default_output_tokens);
}

std::vector<uint64_t> replica_router::prefix_hashes(std::span<const int32_t> prompt) const {
  std::vector<uint64_t> out;
  const size_t page = size_t(config_.page_size);
  uint64_t h = 0;
  for (size_t end = page; end <= prompt.size(); end += page) {
    for (size_t i = end - page; i < end; ++i)
      h = mix(h ^ uint64_t(uint32_t(prompt[i])));
    out.push_back(h);
  }
  return out;
}

int32_t replica_router::cached_tokens(int32_t replica, std::span<const int32_t> prompt) const {
  if (!config_.prefix_affinity)
    return 0;
  const auto& r = replicas_.at(size_t(replica));
  if (r.pages.empty())
    return 0;
  int32_t pages = 0;
  for (uint64_t h : prefix_hashes(prompt)) {
    if (!r.pages.count(h))
      break;
    ++pages;
  }
  return pages * config_.page_size;
}

std::optional<int32_t> replica_router::choose(std::span<const int32_t> prompt,
                                              int32_t max_tokens) const {
  std::optional<int32_t> best;
  double best_cost = 0;
  for (int32_t i = 0; i < int32_t(replicas_.size()); ++i) {
    const auto& r = replicas_[size_t(i)];
    if (!r.up)
      continue;
    const double cost = double(r.load) - config_.affinity_weight * cached_tokens(i, prompt);
    // Strictly better cost wins; an equal cost goes to fewer requests; the
    // lowest index keeps any remaining tie (the loop's order).
    if (!best || cost < best_cost
        || (cost == best_cost && r.requests < replicas_[size_t(*best)].requests)) {
      best = i;
      best_cost = cost;
    }
  }
  (void)max_tokens; // the request's own tokens are the same on every replica
  return best;
}

void replica_router::remember(replica& r, std::span<const int32_t> prompt) {
  if (!config_.prefix_affinity)
    return;
  for (uint64_t h : prefix_hashes(prompt)) {
    if (auto i = r.pages.find(h); i != r.pages.end()) {
      r.lru.splice(r.lru.begin(), r.lru, i->second);
      continue;
    }
    r.lru.push_front(h);
    r.pages.emplace(h, r.lru.begin());
  }
  while (int32_t(r.lru.size()) > config_.remembered_pages) {
    r.pages.erase(r.lru.back());
    r.lru.pop_back();
  }
}

void replica_router::place(uint64_t id, int32_t replica, std::span<const int32_t> prompt,
                           int32_t max_tokens) {
  finish(id);
  auto& r = replicas_.at(size_t(replica));
  const int64_t tokens = cost_of(prompt, max_tokens);
  r.load += tokens;
  ++r.requests;
  placed_[id] = {replica, tokens};
  remember(r, prompt);
}

std::optional<int32_t> replica_router::finish(uint64_t id) {
  auto i = placed_.find(id);
  if (i == placed_.end())
    return std::nullopt;
  auto& r = replicas_[size_t(i->second.replica)];
  r.load -= i->second.tokens;
  --r.requests;
  const int32_t replica = i->second.replica;
  placed_.erase(i);
  return replica;
}

std::optional<int32_t> replica_router::replica_of(uint64_t id) const {
  if (auto i = placed_.find(id); i != placed_.end())
    return i->second.replica;
  return std::nullopt;
}

void replica_router::mark_down(int32_t replica) {
  auto& r = replicas_.at(size_t(replica));
  r.up = false;
  r.lru.clear();
  r.pages.clear();
}

void replica_router::mark_up(int32_t replica) {
  replicas_.at(size_t(replica)).up = true;
}

bool replica_router::is_up(int32_t replica) const {
  return replicas_.at(size_t(replica)).up;
}

int32_t replica_router::num_up() const {
  return int32_t(std::count_if(replicas_.begin(), replicas_.end(),
                               [](const replica& r) { return r.up; }));
}

int64_t replica_router::load(int32_t replica) const {
  return replicas_.at(size_t(replica)).load;
}

int32_t replica_router::requests(int32_t replica) const {
  return replicas_.at(size_t(replica)).requests;
}

} // namespace metronome
