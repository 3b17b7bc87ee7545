// URL parsing and the loopback check of the load client
// (bench/serve/load_client.hpp); its requests are tested end to end in
// bench_serve_cli_test.cpp.

#include <gtest/gtest.h>

#include "bench/serve/load_client.hpp"

namespace metronome::bench {
namespace {

TEST(load_client, parses_urls) {
  auto a = parse_url("http://127.0.0.1:8080");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 8080);
  EXPECT_EQ(a.base_path, "");
  a = parse_url("http://localhost/v1/");
  EXPECT_EQ(a.host, "localhost");
  EXPECT_EQ(a.port, 80);
  EXPECT_EQ(a.base_path, "") << "a trailing /v1 is dropped";
  a = parse_url("http://[::1]:8000/proxy/v1");
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 8000);
  EXPECT_EQ(a.base_path, "/proxy");
  for (const char* bad : {"127.0.0.1:8080", "https://127.0.0.1", "http://", "http://h:0",
                          "http://h:99999", "http://h:8o", "http://[::1"})
    EXPECT_THROW(parse_url(bad), std::invalid_argument) << bad;
}

TEST(load_client, knows_loopback_hosts) {
  for (const char* h : {"localhost", "127.0.0.1", "127.1.2.3", "::1"})
    EXPECT_TRUE(is_loopback_host(h)) << h;
  for (const char* h : {"10.0.0.1", "example.com", "0.0.0.0", "::", "192.168.1.1"})
    EXPECT_FALSE(is_loopback_host(h)) << h;
}

TEST(load_client, stop_before_run_sends_nothing) {
  load_options o;
  o.server.port = 1; // nothing listens there; nothing is sent anyway
  o.stop_on_signals = false;
  load_client c(o);
  c.stop();
  std::vector<load_request> reqs(3);
  auto results = c.run(reqs);
  ASSERT_EQ(results.size(), 3u);
  for (const auto& r : results)
    EXPECT_EQ(r.state, request_result::outcome::not_sent);
  EXPECT_TRUE(c.stopped());
}

TEST(load_client, a_refused_connection_is_recorded_and_the_run_ends) {
  load_options o;
  o.server.port = 1;
  o.stop_on_signals = false;
  o.timeout_s = 5;
  load_client c(o);
  std::vector<load_request> reqs(2);
  reqs[1].arrival_s = 0.05;
  auto results = c.run(reqs);
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    EXPECT_EQ(r.state, request_result::outcome::failed);
    EXPECT_NE(r.error.find("connect: "), std::string::npos) << r.error;
  }
}

} // namespace
} // namespace metronome::bench
