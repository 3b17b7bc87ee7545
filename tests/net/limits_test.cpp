// Connection limits and read/write timeouts over loopback (issue 39, item
// 2): max_connections answers one more connection with 503 and Retry-After
// and still answers /health on it; connections beyond the overflow reserve
// are closed at once; a slot comes back when its connection ends; a client
// trickling its request is cut at header_timeout, while an idle keep-alive
// connection waits for idle_timeout; a stream nobody reads ends at
// write_timeout.

#include <gtest/gtest.h>

#include "tests/net/server_fixture.hpp"

namespace metronome::test {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

class LimitsTest : public ServerTest {
protected:
  /// Each test sets opts_ first, then start()s.
  void SetUp() override {}

  static void expect_503(const response& res, const std::string& code) {
    EXPECT_EQ(res.result_int(), 503u) << res.body();
    EXPECT_EQ(res[http::field::retry_after], "7");
    EXPECT_FALSE(res.keep_alive());
    auto j = json::parse(res.body());
    EXPECT_EQ(j["error"]["code"], code) << res.body();
    EXPECT_EQ(j["error"]["type"], "service_unavailable_error");
    EXPECT_TRUE(j["error"]["message"].is_string());
  }
};

TEST_F(LimitsTest, OneConnectionOverTheLimitGets503WithRetryAfter) {
  opts_.max_connections = 2;
  start();
  EXPECT_EQ(server_->max_connections(), 2u);
  http_client a{port_};
  http_client b{port_};
  EXPECT_EQ(a.request(http::verb::get, "/v1/models").result_int(), 200u);
  EXPECT_EQ(b.request(http::verb::get, "/v1/models").result_int(), 200u);
  EXPECT_EQ(server_->connections(), 2u);
  for (int i = 0; i < 3; ++i) {
    http_client c{port_};
    auto res = c.request(http::verb::post, "/v1/chat/completions", chat_body("echo hi"));
    expect_503(res, "too_many_connections");
    EXPECT_TRUE(c.closed_by_server_within(5s));
  }
  EXPECT_EQ(stats_->requests.load(), 0) << "a refused request reached the engine";
  // Those within the limit are served as before.
  EXPECT_EQ(a.request(http::verb::post, "/v1/chat/completions", chat_body("echo hi")).result_int(),
            200u);
  EXPECT_EQ(server_->connections(), 2u);
}

TEST_F(LimitsTest, HealthIsAnsweredWhileTheConnectionTableIsFull) {
  opts_.max_connections = 1;
  start();
  http_client a{port_};
  EXPECT_EQ(a.request(http::verb::get, "/v1/models").result_int(), 200u);
  for (int i = 0; i < 3; ++i) {
    http_client h{port_};
    auto res = h.request(http::verb::get, "/health");
    EXPECT_EQ(res.result_int(), 200u) << res.body();
    EXPECT_EQ(json::parse(res.body())["status"], "ok");
    EXPECT_FALSE(res.keep_alive());
    EXPECT_TRUE(h.closed_by_server_within(5s));
  }
}

TEST_F(LimitsTest, AClosedConnectionGivesItsSlotBack) {
  opts_.max_connections = 1;
  start();
  for (int i = 0; i < 3; ++i) {
    http_client a{port_};
    EXPECT_EQ(a.request(http::verb::get, "/v1/models").result_int(), 200u) << i;
    a.close();
    EXPECT_TRUE(eventually([&] { return server_->connections() == 0; })) << i;
  }
}

TEST_F(LimitsTest, WebSocketsCountTowardTheLimit) {
  opts_.max_connections = 2;
  start();
  ws_client w1{port_};
  ws_client w2{port_};
  EXPECT_TRUE(eventually([&] { return server_->connections() == 2; }));
  http_client c{port_};
  expect_503(c.request(http::verb::get, "/v1/models"), "too_many_connections");
  // The WebSockets still serve.
  w1.send({{"type", "chat"},
           {"id", "a"},
           {"messages", {{{"role", "user"}, {"content", "echo fine"}}}}});
  auto events = w1.receive_until([](const json& e) { return e["type"] != "delta"; });
  EXPECT_EQ(events.back()["type"], "done");
  w2.close();
  EXPECT_TRUE(eventually([&] { return server_->connections() == 1; }));
}

TEST_F(LimitsTest, BeyondTheOverflowReserveConnectionsCloseAtOnce) {
  opts_.max_connections = 1;
  opts_.overflow_connections = 1;
  start();
  http_client a{port_};
  EXPECT_EQ(a.request(http::verb::get, "/v1/models").result_int(), 200u);
  // Holds the only overflow slot: says nothing (accepts are in order, so it
  // is admitted before the next one).
  http_client silent{port_};
  http_client late{port_};
  late.send(http::verb::get, "/health");
  EXPECT_TRUE(late.closed_by_server_within(5s)) << "no slot left: closed without an answer";
  // The silent one is dropped after the overflow's short read timeout (5 s),
  // after which /health is answered over the limit again.
  EXPECT_TRUE(silent.closed_by_server_within(10s));
  // The client sees the close before the server's session has given its
  // slot back: a probe in between is closed unanswered, and tries again.
  EXPECT_TRUE(eventually(
    [&] {
      try {
        http_client h{port_};
        return h.request(http::verb::get, "/health").result_int() == 200u;
      } catch (const std::exception&) {
        return false;
      }
    },
    5s));
}

TEST_F(LimitsTest, ATricklingRequestIsCutAtTheHeaderTimeout) {
  opts_.header_timeout = 500ms;
  opts_.idle_timeout = 30s;
  start();
  http_client c{port_};
  c.send_raw("GET /health HTTP/1.1\r\nHost: localhost\r\n");
  auto t0 = std::chrono::steady_clock::now();
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    // One header byte every 100 ms: never a whole request, never idle.
    for (int i = 0; i < 100 && !stop.load(); ++i) {
      std::this_thread::sleep_for(100ms);
      try {
        c.send_raw("X");
      } catch (const std::exception&) {
        return; // closed by the server
      }
    }
  });
  bool closed = c.closed_by_server_within(8s);
  auto elapsed = std::chrono::steady_clock::now() - t0;
  stop = true;
  trickle.join();
  EXPECT_TRUE(closed) << "a trickling client held its connection past header_timeout";
  EXPECT_LT(elapsed, 4s);
}

TEST_F(LimitsTest, AnIdleConnectionWaitsForTheIdleTimeoutNotTheHeaderTimeout) {
  opts_.header_timeout = 300ms;
  opts_.idle_timeout = 20s;
  start();
  http_client c{port_};
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(c.request(http::verb::get, "/health").result_int(), 200u);
  std::this_thread::sleep_for(1s); // between requests: idle again
  EXPECT_EQ(c.request(http::verb::get, "/health").result_int(), 200u);
}

TEST_F(LimitsTest, AStreamNobodyReadsEndsAtTheWriteTimeout) {
  opts_.write_timeout = 500ms;
  opts_.max_pending_write_bytes = size_t{1} << 30; // only the timer may close it
  start();
  http_client c{port_};
  c.socket().set_option(asio::socket_base::receive_buffer_size(4096));
  // About 13 MB of events, far more than the socket buffers hold.
  c.send(http::verb::post, "/v1/completions",
         completion_body("count 100000", {{"stream", true}}));
  // The client never reads: the writes stall and the server closes the
  // connection (the default, 60 s, would keep it far longer).
  ASSERT_TRUE(eventually([&] { return server_->connections() == 1; }));
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(eventually([&] { return server_->connections() == 0; }, 15s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 15s);
}

} // namespace
} // namespace metronome::test
