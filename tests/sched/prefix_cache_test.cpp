// Prefix caching: the pool's named pages (exact matches, references, least
// recently used eviction), the scheduler's use of them (a repeated prompt
// computes only its tail, a preempted request re-finds its pages, counts of
// queries and hits), reference counts back to zero after thousands of random
// requests with cancels, and, with the real CPU runner, tokens that do not
// change with the cache on.

#include <map>
#include <numeric>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "sched/kv_page_pool.hpp"
#include "sched/scheduler.hpp"
#include "tests/model/test_support.hpp"
#include "tests/sched/runner_harness.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;

/// The engine's default limits, with the context resolved as spawn_engine
/// would for a model of 4,096 positions.
scheduler_config default_config() {
  scheduler_config c;
  c.limits.max_model_len = 4096;
  return c;
}

/// The chained hashes of the full pages of `tokens`.
std::vector<uint64_t> hashes_of(const std::vector<int32_t>& tokens, int32_t ps,
                                uint64_t salt = 0) {
  std::vector<uint64_t> h;
  for (size_t i = 0; (i + 1) * size_t(ps) <= tokens.size(); ++i)
    h.push_back(page_hash(h.empty() ? salt : h.back(),
                          std::span<const int32_t>(tokens).subspan(i * size_t(ps), size_t(ps))));
  return h;
}

std::vector<int32_t> seq(int32_t from, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

/// Grows `id` to hold `tokens` and names its full pages.
void fill(kv_page_pool& pool, uint64_t id, const std::vector<int32_t>& tokens) {
  const int32_t ps = pool.page_size();
  ASSERT_TRUE(pool.grow(id, int32_t((tokens.size() + size_t(ps) - 1) / size_t(ps))));
  const auto h = hashes_of(tokens, ps);
  for (size_t i = 0; i < h.size(); ++i)
    pool.cache(id, int32_t(i), h[i],
               std::span<const int32_t>(tokens).subspan(i * size_t(ps), size_t(ps)));
}

TEST(page_hash, chains_over_every_token_and_the_page_before) {
  const auto a = seq(1, 8), b = seq(1, 8);
  auto c = a;
  c[7] = 99;
  EXPECT_EQ(hashes_of(a, 4), hashes_of(b, 4));
  EXPECT_EQ(hashes_of(a, 4)[0], hashes_of(c, 4)[0]);
  EXPECT_NE(hashes_of(a, 4)[1], hashes_of(c, 4)[1]);
  // The same page after a different one, or under another salt, differs.
  auto d = a;
  d[0] = 42;
  EXPECT_NE(hashes_of(a, 4)[1], hashes_of(d, 4)[1]);
  EXPECT_NE(hashes_of(a, 4, 0)[0], hashes_of(a, 4, 7)[0]);
}

TEST(kv_page_pool_cache, a_released_sequence_leaves_its_full_pages_to_match) {
  kv_page_pool pool(16, 4);
  const auto tokens = seq(10, 10); // two full pages and a partial one
  fill(pool, 1, tokens);
  const auto table = *pool.table(1);
  EXPECT_EQ(pool.cached_pages(), 2);
  ASSERT_TRUE(pool.release(1));
  EXPECT_EQ(pool.used_pages(), 0);
  EXPECT_EQ(pool.free_pages(), 16) << "cached pages count as free";
  const auto h = hashes_of(tokens, 4);
  EXPECT_EQ(pool.match(h, tokens), (std::vector<int32_t>{table[0], table[1]}));
  // A different second page matches only the first.
  auto other = tokens;
  other[5] = 0;
  EXPECT_EQ(pool.match(hashes_of(other, 4), other), (std::vector<int32_t>{table[0]}));
  // The right hash with other tokens is not a match (verified, not trusted).
  EXPECT_TRUE(pool.match(h, other).size() == 1);
}

TEST(kv_page_pool_cache, shared_pages_are_counted_and_come_back_once_each) {
  kv_page_pool pool(8, 4);
  const auto tokens = seq(0, 8);
  fill(pool, 1, tokens);
  const auto hit = pool.match(hashes_of(tokens, 4), tokens);
  ASSERT_EQ(hit.size(), 2u);
  EXPECT_EQ(pool.unreferenced(hit), 0);
  pool.share(2, hit);
  pool.share(3, hit);
  EXPECT_EQ(pool.references(hit[0]), 3);
  EXPECT_EQ(pool.used_pages(), 2);
  pool.release(1);
  pool.release(2);
  EXPECT_EQ(pool.references(hit[0]), 1);
  EXPECT_EQ(pool.used_pages(), 2);
  pool.release(3);
  EXPECT_EQ(pool.used_pages(), 0);
  EXPECT_EQ(pool.unreferenced(hit), 2);
  EXPECT_EQ(pool.cached_pages(), 2);
  EXPECT_EQ(pool.unmatched_frees(), 0);
}

TEST(kv_page_pool_cache, eviction_takes_free_pages_first_then_the_least_recently_used) {
  kv_page_pool pool(6, 2);
  fill(pool, 1, seq(100, 4)); // pages A0 A1
  fill(pool, 2, seq(200, 4)); // pages B0 B1
  const auto a = *pool.table(1), b = *pool.table(2);
  pool.release(1);
  pool.release(2);
  // Two pages never used are free: growing 2 evicts nothing.
  ASSERT_TRUE(pool.grow(3, 2));
  EXPECT_EQ(pool.evictions(), 0);
  // Next: sequence 1's last page, then its first, then 2's.
  ASSERT_TRUE(pool.grow(3, 1));
  EXPECT_EQ(pool.table(3)->back(), a[1]);
  EXPECT_EQ(pool.match(hashes_of(seq(100, 4), 2), seq(100, 4)), (std::vector<int32_t>{a[0]}));
  ASSERT_TRUE(pool.grow(3, 1));
  EXPECT_EQ(pool.table(3)->back(), a[0]);
  EXPECT_TRUE(pool.match(hashes_of(seq(100, 4), 2), seq(100, 4)).empty());
  EXPECT_EQ(pool.match(hashes_of(seq(200, 4), 2), seq(200, 4)), b);
  EXPECT_EQ(pool.evictions(), 2);
  EXPECT_FALSE(pool.grow(4, 3)) << "only B's two pages are left";
}

TEST(kv_page_pool_cache, a_page_whose_predecessor_was_evicted_is_not_matched) {
  kv_page_pool pool(4, 2);
  fill(pool, 1, seq(0, 4)); // P0 P1
  const auto p = *pool.table(1);
  pool.release(1); // LRU: P1, P0
  ASSERT_TRUE(pool.grow(9, 2)); // free pages
  ASSERT_TRUE(pool.grow(9, 1)); // evicts P1
  pool.release(9);
  // P0 is back in use under the same content: a fresh P1 must be computed.
  EXPECT_EQ(pool.match(hashes_of(seq(0, 4), 2), seq(0, 4)), (std::vector<int32_t>{p[0]}));
}

// -- the scheduler ---------------------------------------------------------------------

sched_request request(uint64_t id, std::vector<int32_t> prompt, int32_t max_tokens) {
  sched_request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.params.max_tokens = max_tokens;
  return r;
}

/// Feeds a draft's output back: every sampling chunk gets token 7.
step_update run(scheduler& s, const step_draft& d, sched_time now) {
  step_output out;
  out.step = d.plan.step;
  out.num_seqs = int32_t(d.plan.chunks.size());
  for (size_t i = 0; i < d.plan.chunks.size(); ++i)
    if (d.samples[i])
      out.tokens.push_back({d.plan.chunks[i].id, 7, 0});
  return s.update_from_output(out, now);
}

void drain(scheduler& s, sched_time now) {
  while (auto d = s.schedule(now))
    run(s, *d, now);
}

const new_sequence* added(const step_draft& d, uint64_t id) {
  for (const auto& n : d.plan.added)
    if (n.id == id)
      return &n;
  return nullptr;
}

int32_t tokens_of(const step_draft& d, uint64_t id) {
  for (const auto& c : d.plan.chunks)
    if (c.id == id)
      return c.num_tokens;
  return 0;
}

TEST(scheduler_prefix_cache, the_same_prompt_again_computes_only_its_last_partial_page) {
  scheduler_config cfg = default_config();
  cfg.pipeline_depth = 1;
  scheduler s(cfg, std::make_unique<fcfs_policy>());
  s.set_capacity(64, 4);
  const sched_time now{0};
  ASSERT_EQ(s.add(request(1, seq(500, 10), 3), now), admit_result::ok);
  drain(s, now);
  ASSERT_EQ(s.find(1), nullptr);
  ASSERT_EQ(s.add(request(2, seq(500, 10), 3), now), admit_result::ok);
  EXPECT_EQ(s.find(2)->cached_tokens, 8) << "the policies see the hit at arrival";
  auto d = s.schedule(now);
  ASSERT_TRUE(d);
  const auto* n = added(*d, 2);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->num_cached, 8);
  EXPECT_EQ(n->cached_pages.size(), 2u);
  EXPECT_EQ(tokens_of(*d, 2), 2);
  EXPECT_EQ(d->shape.prefill_tokens, 2);
  auto u = run(s, *d, now);
  ASSERT_EQ(u.tokens.size(), 1u);
  EXPECT_EQ(u.tokens[0].cached_tokens, 8);
  EXPECT_EQ(s.prefix_queries(), 20);
  EXPECT_EQ(s.prefix_hits(), 8);
  drain(s, now);
  EXPECT_EQ(s.used_pages(), 0);
}

TEST(scheduler_prefix_cache, a_prompt_of_whole_pages_recomputes_its_last_page) {
  scheduler_config cfg = default_config();
  cfg.pipeline_depth = 1;
  scheduler s(cfg, std::make_unique<fcfs_policy>());
  s.set_capacity(64, 4);
  const sched_time now{0};
  s.add(request(1, seq(0, 12), 2), now);
  drain(s, now);
  s.add(request(2, seq(0, 12), 2), now);
  auto d = s.schedule(now);
  ASSERT_TRUE(d);
  EXPECT_EQ(added(*d, 2)->num_cached, 8);
  EXPECT_EQ(tokens_of(*d, 2), 4) << "its logits need the last token computed";
}

TEST(scheduler_prefix_cache, a_running_request_shares_its_prompt_pages_with_a_newcomer) {
  scheduler_config cfg = default_config();
  cfg.pipeline_depth = 1;
  scheduler s(cfg, std::make_unique<fcfs_policy>());
  s.set_capacity(64, 4);
  const sched_time now{0};
  auto system = seq(900, 16);
  auto a = system, b = system;
  a.push_back(1);
  b.push_back(2);
  s.add(request(1, a, 50), now);
  run(s, *s.schedule(now), now); // 1 computed its prompt; still running
  s.add(request(2, b, 50), now);
  auto d = s.schedule(now);
  ASSERT_TRUE(d);
  const auto* n = added(*d, 2);
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->num_cached, 16);
  const auto& t1 = *s.pages().table(1);
  for (size_t i = 0; i < n->cached_pages.size(); ++i) {
    EXPECT_EQ(n->cached_pages[i], t1[i]);
    EXPECT_EQ(s.pages().references(t1[i]), 2);
  }
  EXPECT_EQ(d->plan.chunks.back().new_pages.size(), 1u) << "its own page for the rest";
  EXPECT_TRUE(s.abort(1, finish_kind::cancelled, now));
  EXPECT_TRUE(s.abort(2, finish_kind::cancelled, now));
  run(s, *d, now);
  EXPECT_EQ(s.used_pages(), 0);
  EXPECT_EQ(s.pages().sequences(), 0);
}

TEST(scheduler_prefix_cache, a_preempted_request_finds_its_pages_again) {
  scheduler_config cfg = default_config();
  cfg.pipeline_depth = 1;
  scheduler s(cfg, std::make_unique<fcfs_policy>());
  s.set_capacity(6, 4); // 24 token slots
  const sched_time now{0};
  s.add(request(1, seq(0, 8), 12), now);
  s.add(request(2, seq(100, 8), 12), now);
  std::optional<step_draft> resumed;
  for (int i = 0; i < 40 && !resumed; ++i) {
    auto d = s.schedule(now);
    ASSERT_TRUE(d);
    for (const auto& n : d->plan.added)
      if (s.preemptions() > 0 && n.id == 2)
        resumed = *d;
    run(s, *d, now);
  }
  ASSERT_GT(s.preemptions(), 0);
  ASSERT_TRUE(resumed);
  // Request 1 grew into the pages 2 left (its last ones first): its first
  // page, last in line, is still cached.
  const auto* n = added(*resumed, 2);
  EXPECT_GE(n->num_cached, 4);
  EXPECT_EQ(tokens_of(*resumed, 2), int32_t(n->prompt.size()) - n->num_cached);
  drain(s, now);
  EXPECT_EQ(s.used_pages(), 0);
}

TEST(scheduler_prefix_cache, switched_off_it_finds_nothing) {
  scheduler_config cfg = default_config();
  cfg.pipeline_depth = 1;
  cfg.prefix_caching = false;
  scheduler s(cfg, std::make_unique<fcfs_policy>());
  s.set_capacity(64, 4);
  const sched_time now{0};
  s.add(request(1, seq(0, 10), 2), now);
  drain(s, now);
  s.add(request(2, seq(0, 10), 2), now);
  auto d = s.schedule(now);
  EXPECT_EQ(added(*d, 2)->num_cached, 0);
  EXPECT_EQ(tokens_of(*d, 2), 10);
  EXPECT_EQ(s.pages().cached_pages(), 0);
  EXPECT_EQ(s.prefix_queries(), 0);
}

// 10,000 requests on a few shared prefixes, with random arrivals, lengths,
// cancels and pipelining: at every step each page's reference count is the
// number of tables holding it, no page is handed to two sequences unless
// shared from the cache, and at the end nothing is held.
TEST(scheduler_prefix_cache, references_return_to_zero_after_random_requests_and_cancels) {
  scheduler_config cfg = default_config();
  cfg.limits.max_batch_size = 16;
  cfg.limits.max_num_batched_tokens = 64;
  cfg.limits.max_queued_requests = 100000;
  scheduler s(cfg, std::make_unique<fcfs_policy>());
  s.set_capacity(96, 4);
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prefixes;
  for (int p = 0; p < 6; ++p)
    prefixes.push_back(seq(1000 * (p + 1), int32_t(4 + rng() % 24)));
  std::deque<step_draft> inflight;
  std::vector<uint64_t> live;
  uint64_t next = 0;
  int64_t step = 0;
  auto check = [&] {
    std::map<int32_t, int32_t> holders;
    for (auto id : live)
      if (const auto* t = s.pages().table(id))
        for (auto p : *t)
          ++holders[p];
    for (const auto& [page, n] : holders)
      ASSERT_EQ(s.pages().references(page), n) << "page " << page;
    ASSERT_EQ(int32_t(holders.size()), s.used_pages());
  };
  while (next < 10000 || !live.empty() || !inflight.empty()) {
    const sched_time now{std::chrono::milliseconds(step++)};
    for (int k = 0; k < 3 && next < 10000; ++k) {
      auto prompt = prefixes[rng() % prefixes.size()];
      const auto tail = seq(int32_t(rng() % 50000), int32_t(rng() % 12));
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      if (s.add(request(next, prompt, int32_t(1 + rng() % 10)), now) == admit_result::ok)
        live.push_back(next);
      ++next;
    }
    if (!live.empty() && rng() % 4 == 0) {
      const size_t k = rng() % live.size();
      s.abort(live[k], finish_kind::cancelled, now);
    }
    while (auto d = s.schedule(now))
      inflight.push_back(std::move(*d));
    if (!inflight.empty()) {
      auto u = run(s, inflight.front(), now);
      inflight.pop_front();
      for (auto id : u.finished)
        live.erase(std::find(live.begin(), live.end(), id));
    }
    // Aborted requests leave once no plan uses them.
    std::erase_if(live, [&](uint64_t id) { return s.find(id) == nullptr; });
    if (step % 97 == 0)
      check();
    ASSERT_LT(step, 2000000);
  }
  check();
  EXPECT_EQ(s.used_pages(), 0);
  EXPECT_EQ(s.pages().sequences(), 0);
  EXPECT_EQ(s.pages().unmatched_frees(), 0);
  EXPECT_GT(s.prefix_hits(), s.prefix_queries() / 4) << "the shared prefixes should hit";
  EXPECT_GT(s.pages().evictions(), 0) << "the pool should have been full";
}

// With the real CPU runner: requests that share system prompts (and repeat
// whole prompts) give the tokens each gives alone with no cache, greedy and
// seeded sampling, through chunking, pipelining and preemptions.
TEST(scheduler_prefix_cache_with_model, the_cache_never_changes_tokens) {
  auto model = model_folder::open(test::tiny_model("tiny-llama3"));
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> systems;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> p(size_t(20 + rng() % 30));
    for (auto& t : p)
      t = int32_t(rng() % 1000);
    systems.push_back(p);
  }
  std::vector<test::workload_item> items;
  for (int i = 0; i < 20; ++i) {
    test::workload_item w;
    w.prompt = systems[size_t(i) % systems.size()];
    for (int k = int(rng() % 12); k > 0; --k)
      w.prompt.push_back(int32_t(rng() % 1000));
    w.params.max_tokens = int32_t(rng() % 12 + 2);
    w.params.temperature = i % 2 == 0 ? 0.0f : 0.8f;
    w.params.ignore_eos = true;
    w.seed = uint64_t(50 + i);
    w.arrival_step = i * 3;
    items.push_back(w);
  }
  scheduler_config off;
  off.prefix_caching = false;
  std::map<uint64_t, std::vector<int32_t>> alone;
  for (size_t i = 0; i < items.size(); ++i) {
    auto one = items[i];
    one.arrival_step = 0;
    alone[i] = test::serve_through_runner(model, {one}, std::make_unique<fcfs_policy>(), off,
                                          64, 8)[0];
  }
  scheduler_config on;
  on.limits.max_batch_size = 6;
  on.limits.max_num_batched_tokens = 24;
  int64_t preemptions = 0, hits = 0;
  auto together = test::serve_through_runner(model, items, std::make_unique<fcfs_policy>(), on,
                                             24, 8, &preemptions, &hits);
  EXPECT_GT(hits, 0) << "the shared system prompts should hit the cache";
  EXPECT_EQ(together, alone);
}

} // namespace
} // namespace metronome
