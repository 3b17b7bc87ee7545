// The rate limit of repeated warnings (accept failures, refused
// connections): at most one per period, with the count held back.

#include <gtest/gtest.h>

#include "net/log_limiter.hpp"

namespace metronome::net {
namespace {

using namespace std::chrono_literals;

TEST(LogLimiter, OnePerPeriodWithTheCountHeldBack) {
  log_limiter limit{1s};
  log_limiter::clock::time_point t0{};
  ASSERT_TRUE(limit.allow(t0));
  EXPECT_EQ(limit.allow(t0 + 1s), 0u);
  // Nine more within the next second: all held back.
  for (int i = 1; i <= 9; ++i)
    EXPECT_FALSE(limit.allow(t0 + 1s + i * 100ms)) << i;
  EXPECT_EQ(limit.allow(t0 + 2s), 9u);
  EXPECT_FALSE(limit.allow(t0 + 2s + 999ms));
  EXPECT_EQ(limit.allow(t0 + 3s), 1u);
}

TEST(LogLimiter, AFloodOfEventsLogsOncePerSecond) {
  log_limiter limit;
  log_limiter::clock::time_point t0{};
  int logged = 0;
  uint64_t held = 0;
  // 100,000 failures over ten seconds, as a spinning accept loop would make.
  for (int i = 0; i < 100'000; ++i)
    if (auto h = limit.allow(t0 + i * 100us)) {
      ++logged;
      held += *h;
    }
  EXPECT_EQ(logged, 10);
  // Every event is logged or counted in the next report; the last
  // second's 9,999 await a report that has not come yet.
  EXPECT_EQ(held + logged + 9'999, 100'000u);
}

} // namespace
} // namespace metronome::net
