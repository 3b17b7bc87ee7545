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
  s.max_connections = 500;
  s.idle_timeout_s = 75;
  s.header_timeout_s = 0.25;
  s.write_timeout_s = 12;
  s.drain_timeout_s = 0;
  auto o = server_options_from(s);
  EXPECT_EQ(o.host, "0.0.0.0");
  EXPECT_EQ(o.port, 9123);
  EXPECT_EQ(o.max_body_bytes, 4096u);
  EXPECT_EQ(o.max_ws_message_bytes, 8192u);
  EXPECT_EQ(o.max_streams_per_connection, 7);
  EXPECT_EQ(o.io_threads, 3);
  EXPECT_EQ(o.request_timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(o.retry_after, std::chrono::seconds(9));
  EXPECT_EQ(o.max_connections, 500u);
  EXPECT_EQ(o.idle_timeout, std::chrono::seconds(75));
  EXPECT_EQ(o.header_timeout, std::chrono::milliseconds(250));
  EXPECT_EQ(o.write_timeout, std::chrono::seconds(12));
  EXPECT_EQ(o.drain_timeout, std::chrono::milliseconds(0));
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
  EXPECT_EQ(o.max_connections, d.max_connections);
  EXPECT_EQ(o.idle_timeout, d.idle_timeout);
  EXPECT_EQ(o.header_timeout, d.header_timeout);
  EXPECT_EQ(o.write_timeout, d.write_timeout);
  EXPECT_EQ(o.drain_timeout, d.drain_timeout);
  // Issue 39: a client trickling its headers is cut after 30 s, not 120.
  EXPECT_EQ(d.header_timeout, std::chrono::seconds(30));
  EXPECT_EQ(d.max_connections, 0u) << "0: sized from the descriptor limit at start";
}

TEST(ServerOptions, ConnectionLimitLeavesDescriptorsForTheRest) {
  EXPECT_EQ(connection_limit_for(1024), 1024u - 128 - 102);
  EXPECT_EQ(connection_limit_for(65536), 65536u - 128 - 6553);
  for (uint64_t fds : {uint64_t{256}, uint64_t{1024}, uint64_t{20000}, uint64_t{1} << 20}) {
    auto n = connection_limit_for(fds);
    EXPECT_GE(n, 1u);
    // Room for the answered overflow and the process's own files (a
    // served model needs fewer than 64 besides its connections).
    if (fds > 128)
      EXPECT_LE(n + server_options{}.overflow_connections + 64, fds) << fds;
  }
  EXPECT_EQ(connection_limit_for(0), 1u);
  EXPECT_EQ(connection_limit_for(100), 1u);
  EXPECT_GT(file_descriptor_limit(), 0u);
}

} // namespace
} // namespace metronome::net
