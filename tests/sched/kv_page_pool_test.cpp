// The page pool: all-or-nothing growth, exact frees, reuse.

#include <random>
#include <set>

#include <gtest/gtest.h>

#include "sched/kv_page_pool.hpp"

namespace metronome {
namespace {

TEST(kv_page_pool, grows_all_or_nothing_and_frees_exactly_once) {
  kv_page_pool pool(8);
  auto a = pool.grow(1, 3);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, (std::vector<int32_t>{0, 1, 2}));
  ASSERT_TRUE(pool.grow(2, 4));
  EXPECT_FALSE(pool.grow(1, 2)); // only one left
  EXPECT_EQ(pool.table(1)->size(), 3u);
  EXPECT_EQ(pool.free_pages(), 1);
  ASSERT_TRUE(pool.grow(1, 1));
  EXPECT_EQ(*pool.table(1), (std::vector<int32_t>{0, 1, 2, 7}));
  EXPECT_TRUE(pool.release(1));
  EXPECT_FALSE(pool.release(1));
  EXPECT_EQ(pool.unmatched_frees(), 1);
  EXPECT_EQ(pool.free_pages(), 4);
  EXPECT_EQ(pool.sequences(), 1);
}

TEST(kv_page_pool, pages_are_never_handed_out_twice) {
  kv_page_pool pool(64);
  std::set<int32_t> held;
  std::mt19937 rng(3);
  std::vector<uint64_t> live;
  for (int i = 0; i < 2000; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      auto k = rng() % live.size();
      for (auto p : *pool.table(live[k]))
        held.erase(p);
      pool.release(live[k]);
      live.erase(live.begin() + long(k));
    } else if (auto got = pool.grow(uint64_t(i), int32_t(rng() % 5 + 1))) {
      for (auto p : *got)
        EXPECT_TRUE(held.insert(p).second) << "page " << p << " handed out twice";
      live.push_back(uint64_t(i));
    }
    ASSERT_EQ(int32_t(held.size()), pool.used_pages());
  }
  EXPECT_EQ(pool.unmatched_frees(), 0);
}

} // namespace
} // namespace metronome
