// The bounded write queue both sessions keep: bytes are counted in and out,
// and once over its limit it refuses everything, so a client that stops
// reading is closed instead of buffered without end.

#include <string>

#include <gtest/gtest.h>

#include "net/write_queue.hpp"

namespace metronome::net {
namespace {

TEST(write_queue, counts_bytes_and_keeps_order) {
  write_queue<std::string> q(100);
  EXPECT_TRUE(q.push("abc", 3));
  EXPECT_TRUE(q.push("defgh", 5));
  EXPECT_EQ(q.size(), 2u);
  EXPECT_EQ(q.bytes(), 8u);
  EXPECT_EQ(q.front(), "abc");
  EXPECT_EQ(q[1], "defgh");
  q.pop();
  EXPECT_EQ(q.bytes(), 5u);
  EXPECT_EQ(q.front(), "defgh");
  q.pop();
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.bytes(), 0u);
}

TEST(write_queue, the_limit_itself_is_allowed_one_byte_more_is_not) {
  write_queue<std::string> q(10);
  EXPECT_TRUE(q.push(std::string(10, 'x'), 10));
  EXPECT_FALSE(q.overflowed());
  EXPECT_FALSE(q.push("y", 1));
  EXPECT_TRUE(q.overflowed());
}

TEST(write_queue, once_overflowed_it_refuses_everything_even_after_draining) {
  write_queue<std::string> q(4);
  EXPECT_TRUE(q.push("ab", 2));
  EXPECT_FALSE(q.push("cde", 3));
  const size_t held = q.size();
  while (!q.empty())
    q.pop();
  EXPECT_FALSE(q.push("z", 1));
  EXPECT_TRUE(q.empty()) << "nothing is queued after the overflow";
  EXPECT_EQ(held, 2u);
}

} // namespace
} // namespace metronome::net
