// The `server` section of metronome.yaml maps onto the edge's options.

#include <gtest/gtest.h>

#include "config/server_config.hpp"
#include "net/server_options.hpp"

namespace metronome::net {
namespace {

TEST(ServerOptions, FromTheConfigSection) {
  server_section s;
  s.host = "0.0.0.0";
  s.port = 9123;
  s.max_body_bytes = 4096;
  s.max_ws_message_bytes = 8192;
  s.max_concurrent_streams_per_connection = 7;
  s.io_threads = 3;
  s.request_timeout_s = 1.5;
  s.retry_after_s = 9;
  auto o = server_options_from(s);
  EXPECT_EQ(o.host, "0.0.0.0");
  EXPECT_EQ(o.port, 9123);
  EXPECT_EQ(o.max_body_bytes, 4096u);
  EXPECT_EQ(o.max_ws_message_bytes, 8192u);
  EXPECT_EQ(o.max_streams_per_connection, 7);
  EXPECT_EQ(o.io_threads, 3);
  EXPECT_EQ(o.request_timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(o.retry_after, std::chrono::seconds(9));
}

TEST(ServerOptions, DefaultsAgreeWithTheConfigDefaults) {
  auto o = server_options_from(server_section{});
  server_options d;
  EXPECT_EQ(o.host, d.host);
  EXPECT_EQ(o.port, d.port);
  EXPECT_EQ(o.max_body_bytes, d.max_body_bytes);
  EXPECT_EQ(o.max_ws_message_bytes, d.max_ws_message_bytes);
  EXPECT_EQ(o.max_streams_per_connection, d.max_streams_per_connection);
  EXPECT_EQ(o.io_threads, d.io_threads);
  EXPECT_EQ(o.request_timeout, d.request_timeout);
  EXPECT_EQ(o.retry_after, d.retry_after);
}

} // namespace
} // namespace metronome::net
