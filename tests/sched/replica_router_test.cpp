// Tier 1: the replica router as a plain class: load routing with its
// deterministic tie-break, prefix affinity weighed against load, removal
// and re-join of replicas.

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "sched/replica_router.hpp"

namespace metronome {
namespace {

std::vector<int32_t> tokens(int32_t n, int32_t first = 1) {
  std::vector<int32_t> out(size_t(n), 0);
  std::iota(out.begin(), out.end(), first);
  return out;
}

replica_router make(int32_t replicas, bool affinity = true) {
  replica_router_config c;
  c.replicas = replicas;
  c.page_size = 4;
  c.prefix_affinity = affinity;
  c.default_output_tokens = 10;
  return replica_router(c);
}

TEST(replica_router, places_on_the_least_loaded_replica_lowest_index_first) {
  auto r = make(3, false);
  const auto p = tokens(10);
  EXPECT_EQ(r.choose(p, 10), 0);
  r.place(1, 0, p, 10); // 20 tokens on 0
  EXPECT_EQ(r.choose(p, 10), 1);
  r.place(2, 1, p, 10);
  EXPECT_EQ(r.choose(p, 10), 2);
  r.place(3, 2, tokens(50), 50); // 100 tokens on 2
  EXPECT_EQ(r.choose(p, 10), 0) << "0 and 1 tie at 20 tokens: the lower index";
  EXPECT_EQ(r.load(2), 100);
  EXPECT_EQ(r.requests(2), 1);
}

TEST(replica_router, an_equal_load_goes_to_the_replica_with_fewer_requests) {
  auto r = make(2, false);
  r.place(1, 0, tokens(10), 10); // 20 tokens, 1 request
  r.place(2, 1, tokens(5), 5);   // 10 + 10 = 20 tokens, 2 requests
  r.place(3, 1, tokens(0), 0);   // default output 10 ...
  r.finish(3);
  r.place(4, 1, tokens(0), -1); // ... and counted the same for any unset max
  EXPECT_EQ(r.load(0), 20);
  EXPECT_EQ(r.load(1), 20);
  EXPECT_EQ(r.choose(tokens(3), 1), 0) << "replica 0 holds one request, replica 1 two";
}

TEST(replica_router, finishing_a_request_takes_its_load_off_its_replica) {
  auto r = make(2, false);
  r.place(1, 0, tokens(30), 10);
  EXPECT_EQ(r.replica_of(1), 0);
  EXPECT_EQ(r.choose(tokens(5), 5), 1);
  EXPECT_EQ(r.finish(1), 0);
  EXPECT_EQ(r.finish(1), std::nullopt) << "finished twice";
  EXPECT_EQ(r.load(0), 0);
  EXPECT_EQ(r.requests(0), 0);
  EXPECT_EQ(r.replica_of(1), std::nullopt);
  EXPECT_EQ(r.choose(tokens(5), 5), 0);
}

TEST(replica_router, a_shared_prefix_draws_a_request_to_the_replica_that_has_it) {
  auto r = make(2);
  const auto system = tokens(16, 100); // four whole pages
  auto prompt = [&](int32_t tail) {
    auto p = system;
    p.push_back(tail);
    return p;
  };
  r.place(1, 0, prompt(1), 4); // 21 tokens on 0; the four pages remembered there
  EXPECT_EQ(r.cached_tokens(0, prompt(2)), 16);
  EXPECT_EQ(r.cached_tokens(1, prompt(2)), 0);
  // Load alone says replica 1 (0 tokens against 21); 16 cached tokens are
  // not enough to make up 21 tokens of work.
  EXPECT_EQ(r.choose(prompt(2), 4), 1);
  r.place(2, 1, tokens(8, 500), 4); // 12 tokens on 1
  // Now 21 - 16 = 5 against 12: the cache wins.
  EXPECT_EQ(r.choose(prompt(3), 4), 0);
  // Only whole pages of a common prefix count.
  auto other = system;
  other[5] = 9999;
  EXPECT_EQ(r.cached_tokens(0, other), 4);
}

TEST(replica_router, affinity_never_outweighs_more_than_the_prompt_of_extra_load) {
  auto r = make(2);
  const auto p = tokens(40);
  r.place(1, 0, p, 10);          // 50 tokens, 40 cached-worthy
  r.place(2, 0, tokens(4), 100); // 104 more on 0
  EXPECT_EQ(r.choose(p, 10), 1) << "154 - 40 is still more than 0";
}

TEST(replica_router, without_affinity_prefixes_are_neither_remembered_nor_counted) {
  auto r = make(2, false);
  r.place(1, 0, tokens(16), 1);
  EXPECT_EQ(r.cached_tokens(0, tokens(16)), 0);
}

TEST(replica_router, a_removed_replica_takes_nothing_and_forgets_its_prefixes) {
  auto r = make(3);
  r.place(1, 1, tokens(16), 4);
  r.mark_down(1);
  EXPECT_FALSE(r.is_up(1));
  EXPECT_EQ(r.num_up(), 2);
  EXPECT_EQ(r.cached_tokens(1, tokens(16)), 0) << "its KV cache is gone";
  EXPECT_EQ(r.load(1), 20) << "placed requests count until they end";
  for (int i = 0; i < 4; ++i) {
    const auto c = r.choose(tokens(16), 4);
    ASSERT_TRUE(c);
    EXPECT_NE(*c, 1);
    r.place(uint64_t(10 + i), *c, tokens(16), 4);
  }
  EXPECT_EQ(r.finish(1), 1);
  r.mark_down(0);
  r.mark_down(2);
  EXPECT_EQ(r.num_up(), 0);
  EXPECT_EQ(r.choose(tokens(4), 1), std::nullopt) << "no replica up";
}

TEST(replica_router, a_replica_that_rejoins_takes_requests_again) {
  auto r = make(2, false);
  r.mark_down(0);
  r.place(1, 1, tokens(10), 10);
  EXPECT_EQ(r.choose(tokens(10), 10), 1);
  r.mark_up(0);
  EXPECT_TRUE(r.is_up(0));
  EXPECT_EQ(r.choose(tokens(10), 10), 0) << "empty, back, and the least loaded";
}

TEST(replica_router, the_lru_keeps_the_most_recent_pages) {
  replica_router_config c;
  c.replicas = 1;
  c.page_size = 2;
  c.remembered_pages = 2;
  replica_router r(c);
  r.place(1, 0, tokens(4, 1), 1);  // pages a, ab
  r.place(2, 0, tokens(4, 50), 1); // pages c, cd: a and ab dropped
  EXPECT_EQ(r.cached_tokens(0, tokens(4, 50)), 4);
  EXPECT_EQ(r.cached_tokens(0, tokens(4, 1)), 0);
}

TEST(replica_router, refuses_a_router_of_no_replicas) {
  replica_router_config c;
  c.replicas = 0;
  EXPECT_THROW(replica_router{c}, std::invalid_argument);
}

} // namespace
} // namespace metronome
