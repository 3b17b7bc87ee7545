// The graceful drain over loopback (issue 39, item 3): http_server::drain()
// lets running streams finish, ends what is still running at the timeout
// with an error its client can read (SSE: an error event and [DONE]; not
// streaming: a 503 body; WebSocket: an error event and close 1001), refuses
// new connections, answers new requests on open connections with 503, and
// /health with 503 "draining".

#include <gtest/gtest.h>

#include "tests/net/server_fixture.hpp"

namespace metronome::test {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

class DrainTest : public ServerTest {
protected:
  /// Each test sets opts_ first, then start()s.
  void SetUp() override {}

  /// Runs drain() on its own thread (it blocks); join() returns its result.
  struct drain_thread {
    explicit drain_thread(net::http_server& server)
      : thread([this, &server] { cut = server.drain(); }) {}
    size_t join() {
      thread.join();
      return cut;
    }
    size_t cut = 0;
    std::thread thread;
  };

  static json ws_chat(const std::string& id, const std::string& script) {
    return {{"type", "chat"},
            {"id", id},
            {"messages", {{{"role", "user"}, {"content", script}}}}};
  }

  static bool connect_refused(uint16_t port) {
    try {
      http_client c{port};
      return false;
    } catch (const boost::system::system_error&) {
      return true;
    }
  }
};

TEST_F(DrainTest, ARunningStreamFinishesWithinTheDrainTimeout) {
  opts_.drain_timeout = 20s;
  start();
  http_client c{port_};
  // Ten deltas 100 ms apart: about a second.
  c.send(http::verb::post, "/v1/chat/completions",
         chat_body("count 10 100", {{"stream", true}}));
  ASSERT_EQ(c.read_header().get().result_int(), 200u);
  auto t0 = std::chrono::steady_clock::now();
  drain_thread drain{*server_};
  auto res = c.read_rest();
  auto events = sse_data(res.body());
  ASSERT_GE(events.size(), 3u) << res.body();
  EXPECT_EQ(events.back(), "[DONE]");
  auto finish = json::parse(events[events.size() - 2]);
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "length") << res.body();
  EXPECT_EQ(res.body().find("shutting_down"), std::string::npos) << res.body();
  EXPECT_EQ(drain.join(), 0u) << "a stream that finished in time was counted as cut";
  // The drain ended when the stream did, not at its 20 s timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(stats_->cancelled.load(), 0);
}

TEST_F(DrainTest, TheTimeoutEndsWhatStillRunsWithAnErrorClientsCanRead) {
  opts_.drain_timeout = 300ms;
  start();
  // A stream under way (one delta, then nothing).
  http_client stream{port_};
  stream.send(http::verb::post, "/v1/chat/completions", chat_body("hang", {{"stream", true}}));
  ASSERT_EQ(stream.read_header().get().result_int(), 200u);
  // A stream that has sent nothing yet, and a non-streaming request.
  http_client quiet_stream{port_};
  quiet_stream.send(http::verb::post, "/v1/completions",
                    completion_body("hang-silent", {{"stream", true}}));
  http_client whole{port_};
  whole.send(http::verb::post, "/v1/chat/completions", chat_body("hang-silent"));
  // A WebSocket request under way.
  ws_client ws{port_};
  ws.send(ws_chat("w", "hang"));
  EXPECT_EQ(ws.receive()["type"], "delta");
  ASSERT_TRUE(eventually([&] { return stats_->requests.load() == 4; }));
  EXPECT_EQ(server_->requests_in_flight(), 4u);

  drain_thread drain{*server_};
  auto res = stream.read_rest();
  auto events = sse_data(res.body());
  ASSERT_GE(events.size(), 2u) << res.body();
  EXPECT_EQ(events.back(), "[DONE]");
  auto error = json::parse(events[events.size() - 2]);
  EXPECT_EQ(error["error"]["code"], "shutting_down") << res.body();
  EXPECT_EQ(error["error"]["type"], "service_unavailable_error");
  for (auto* c : {&quiet_stream, &whole}) {
    auto r = c->read();
    EXPECT_EQ(r.result_int(), 503u) << r.body();
    EXPECT_EQ(json::parse(r.body())["error"]["code"], "shutting_down") << r.body();
    EXPECT_EQ(r[http::field::retry_after], "7");
    EXPECT_FALSE(r.keep_alive());
  }
  auto e = ws.receive();
  EXPECT_EQ(e["type"], "error") << e;
  EXPECT_EQ(e["id"], "w");
  EXPECT_EQ(e["error"]["code"], "shutting_down");
  EXPECT_EQ(ws.read_until_close(), 1001) << "going away";
  EXPECT_EQ(drain.join(), 4u);
  EXPECT_TRUE(eventually([&] { return stats_->cancelled.load() == 4; }));
  EXPECT_TRUE(eventually([&] { return stats_->live.load() == 0; }));
}

TEST_F(DrainTest, DrainingRefusesNewConnectionsAndNewRequests) {
  opts_.drain_timeout = 20s;
  start();
  http_client health{port_};
  EXPECT_EQ(health.request(http::verb::get, "/health").result_int(), 200u);
  http_client idle{port_};
  EXPECT_EQ(idle.request(http::verb::get, "/v1/models").result_int(), 200u);
  ws_client ws{port_};
  // Keeps the drain waiting until the test lets it go.
  http_client running{port_};
  running.send(http::verb::post, "/v1/completions", completion_body("hang", {{"stream", true}}));
  ASSERT_EQ(running.read_header().get().result_int(), 200u);

  auto t0 = std::chrono::steady_clock::now();
  drain_thread drain{*server_};
  EXPECT_TRUE(eventually([&] { return connect_refused(port_); }))
    << "the listening socket is still open";

  auto h = health.request(http::verb::get, "/health");
  EXPECT_EQ(h.result_int(), 503u);
  EXPECT_EQ(json::parse(h.body())["status"], "draining");
  EXPECT_FALSE(h.keep_alive());

  auto r = idle.request(http::verb::post, "/v1/chat/completions", chat_body("echo late"));
  EXPECT_EQ(r.result_int(), 503u) << r.body();
  EXPECT_EQ(json::parse(r.body())["error"]["code"], "shutting_down");
  EXPECT_EQ(r[http::field::retry_after], "7");

  ws.send(ws_chat("late", "echo late"));
  auto e = ws.receive();
  EXPECT_EQ(e["type"], "error") << e;
  EXPECT_EQ(e["error"]["code"], "shutting_down");
  EXPECT_EQ(stats_->requests.load(), 1) << "a request reached the engine while draining";

  // The running stream's client leaves: nothing runs, the drain ends well
  // before its timeout, and the WebSocket is told the server goes away.
  running.close();
  EXPECT_EQ(ws.read_until_close(), 1001);
  EXPECT_EQ(drain.join(), 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
}

TEST_F(DrainTest, AnIdleServerDrainsAtOnce) {
  opts_.drain_timeout = 20s;
  start();
  http_client idle{port_};
  EXPECT_EQ(idle.request(http::verb::get, "/health").result_int(), 200u);
  // The client can read the answer before the server's write completes;
  // until it has, the connection is busy, and a drain then lets it linger
  // (up to 2 s) instead of closing it at once.
  std::this_thread::sleep_for(200ms);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(server_->drain(), 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_TRUE(idle.closed_by_server_within(1s));
  EXPECT_EQ(server_->drain(), 0u) << "a second drain is a no-op";
}

} // namespace
} // namespace metronome::test
