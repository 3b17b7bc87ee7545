// The WebSocket protocol at /v1/ws over loopback, against the fake engine:
// concurrent requests with client ids, cancel, bad messages (the connection
// stays usable), duplicate ids, the per-connection limit, engine errors,
// oversized messages, and cancellation when the socket closes.

#include <gtest/gtest.h>

#include "tests/net/server_fixture.hpp"

namespace metronome::test {
namespace {

using json = nlohmann::json;

json chat(const std::string& id, const std::string& script, json extra = {}) {
  json j = {{"type", "chat"},
            {"id", id},
            {"messages", {{{"role", "user"}, {"content", script}}}}};
  for (auto& [k, v] : extra.items())
    j[k] = v;
  return j;
}

auto is_final_for(const std::string& id) {
  return [id](const json& e) { return e.value("id", "") == id && e["type"] != "delta"; };
}

/// The text of `id`'s deltas among `events`.
std::string text_of(const std::vector<json>& events, const std::string& id) {
  std::string text;
  for (const auto& e : events)
    if (e["type"] == "delta" && e["id"] == id)
      text += e["text"].get<std::string>();
  return text;
}

TEST_F(ServerTest, WsChatStreamsDeltasThenDone) {
  ws_client ws{port_};
  ws.send(chat("a", "echo hello world"));
  auto events = ws.receive_until(is_final_for("a"));
  EXPECT_EQ(text_of(events, "a"), "hello world ");
  const auto& done = events.back();
  EXPECT_EQ(done["type"], "done");
  EXPECT_EQ(done["finish_reason"], "stop");
  EXPECT_EQ(done["usage"]["completion_tokens"], 2);
  EXPECT_EQ(done["usage"]["prompt_tokens"], 7);
  EXPECT_DOUBLE_EQ(done["timings"]["queue_ms"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(done["timings"]["ttft_ms"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(done["timings"]["e2e_ms"].get<double>(), 3.0);
  EXPECT_TRUE(stats_->last().chat);
}

TEST_F(ServerTest, WsConcurrentRequestsInterleave) {
  ws_client ws{port_};
  ws.send(chat("slow", "count 6 5"));
  ws.send(chat("fast", "echo quick"));
  std::set<std::string> finished;
  std::vector<json> events;
  while (finished.size() < 2) {
    events.push_back(ws.receive());
    if (events.back()["type"] == "done")
      finished.insert(events.back()["id"].get<std::string>());
  }
  EXPECT_EQ(text_of(events, "slow"), "t0 t1 t2 t3 t4 t5 ");
  EXPECT_EQ(text_of(events, "fast"), "quick ");
  // The fast one finished while the slow one was still streaming.
  auto fast_done = std::find_if(events.begin(), events.end(), [](const json& e) {
    return e["type"] == "done" && e["id"] == "fast";
  });
  auto slow_done = std::find_if(events.begin(), events.end(), [](const json& e) {
    return e["type"] == "done" && e["id"] == "slow";
  });
  EXPECT_LT(fast_done, slow_done);
}

TEST_F(ServerTest, WsCancelStopsTheRequest) {
  ws_client ws{port_};
  ws.send(chat("c", "hang"));
  auto first = ws.receive();
  EXPECT_EQ(first["type"], "delta");
  ws.send({{"type", "cancel"}, {"id", "c"}});
  auto done = ws.receive();
  EXPECT_EQ(done["type"], "done");
  EXPECT_EQ(done["id"], "c");
  EXPECT_EQ(done["finish_reason"], "cancelled");
  EXPECT_TRUE(eventually([&] { return stats_->cancelled.load() == 1; }));
  // The id is free again at once.
  ws.send(chat("c", "echo again"));
  auto events = ws.receive_until(is_final_for("c"));
  EXPECT_EQ(text_of(events, "c"), "again ");
  EXPECT_EQ(events.back()["type"], "done");
  // Cancelling what is not running is an error event.
  ws.send({{"type", "cancel"}, {"id", "c"}});
  auto err = ws.receive();
  EXPECT_EQ(err["type"], "error");
  EXPECT_EQ(err["id"], "c");
  EXPECT_EQ(err["error"]["code"], "unknown_id");
}

TEST_F(ServerTest, WsBadMessagesKeepTheConnectionUsable) {
  ws_client ws{port_};
  ws.send_text("{this is not json");
  auto e1 = ws.receive();
  EXPECT_EQ(e1["type"], "error");
  EXPECT_FALSE(e1.contains("id"));
  EXPECT_EQ(e1["error"]["code"], "invalid_json");
  ws.send({{"type", "fly"}, {"id", "z"}});
  auto e2 = ws.receive();
  EXPECT_EQ(e2["id"], "z");
  EXPECT_EQ(e2["error"]["param"], "type");
  ws.send(chat("t", "x", {{"temperature", 5}}));
  auto e3 = ws.receive();
  EXPECT_EQ(e3["id"], "t");
  EXPECT_EQ(e3["error"]["param"], "temperature");
  EXPECT_EQ(e3["error"]["status"], 400);
  ws.send({{"type", "chat"}, {"messages", json::array()}});
  EXPECT_EQ(ws.receive()["error"]["param"], "id");
  ws.send_binary(std::string("\x00\x01\x02", 3));
  EXPECT_EQ(ws.receive()["type"], "error");
  ws.send({{"type", "ping"}, {"id", "p"}});
  auto pong = ws.receive();
  EXPECT_EQ(pong, (json{{"type", "pong"}, {"id", "p"}}));
  ws.send(chat("ok", "echo still fine"));
  auto events = ws.receive_until(is_final_for("ok"));
  EXPECT_EQ(text_of(events, "ok"), "still fine ");
  EXPECT_EQ(stats_->requests.load(), 1);
}

TEST_F(ServerTest, WsDuplicateLiveIdIsAnError) {
  ws_client ws{port_};
  ws.send(chat("d", "count 3 20"));
  ws.send(chat("d", "echo other"));
  std::vector<json> events;
  bool got_error = false;
  while (true) {
    events.push_back(ws.receive());
    const auto& e = events.back();
    if (e["type"] == "error") {
      EXPECT_EQ(e["id"], "d");
      EXPECT_EQ(e["error"]["code"], "duplicate_id");
      got_error = true;
    }
    if (e["type"] == "done")
      break;
  }
  EXPECT_TRUE(got_error);
  // The first request was not disturbed.
  EXPECT_EQ(text_of(events, "d"), "t0 t1 t2 ");
  EXPECT_EQ(stats_->requests.load(), 1);
}

TEST_F(ServerTest, WsLimitsConcurrentRequestsPerConnection) {
  ws_client ws{port_};
  for (int i = 0; i < opts_.max_streams_per_connection; ++i)
    ws.send(chat("h" + std::to_string(i), "hang-silent"));
  ws.send(chat("over", "echo no"));
  auto e = ws.receive();
  EXPECT_EQ(e["type"], "error");
  EXPECT_EQ(e["id"], "over");
  EXPECT_EQ(e["error"]["code"], "too_many_requests");
  EXPECT_EQ(e["error"]["status"], 429);
  // Cancelling one makes room.
  ws.send({{"type", "cancel"}, {"id", "h0"}});
  EXPECT_EQ(ws.receive()["finish_reason"], "cancelled");
  ws.send(chat("now", "echo yes"));
  auto events = ws.receive_until(is_final_for("now"));
  EXPECT_EQ(text_of(events, "now"), "yes ");
}

TEST_F(ServerTest, WsEngineErrorsCarryTheId) {
  ws_client ws{port_};
  ws.send(chat("q", "error " + std::to_string(int(request_errc::queue_full))));
  auto e = ws.receive();
  EXPECT_EQ(e["type"], "error");
  EXPECT_EQ(e["id"], "q");
  EXPECT_EQ(e["error"]["status"], 429);
  EXPECT_EQ(e["error"]["type"], error_type(request_errc::queue_full));
  // The id is free after the error.
  ws.send(chat("q", "echo retry"));
  EXPECT_EQ(text_of(ws.receive_until(is_final_for("q")), "q"), "retry ");
}

TEST_F(ServerTest, WsClosingCancelsEverything) {
  for (bool handshake : {true, false}) {
    auto before = stats_->cancelled.load();
    ws_client ws{port_};
    ws.send(chat("1", "hang"));
    ws.send(chat("2", "hang"));
    ws.send(chat("3", "hang-silent"));
    ASSERT_TRUE(eventually([&] { return stats_->live.load() == 3; }));
    handshake ? ws.close() : ws.drop();
    EXPECT_TRUE(eventually([&] { return stats_->cancelled.load() == before + 3; }))
      << "handshake=" << handshake;
    EXPECT_TRUE(eventually([&] { return stats_->live.load() == 0; }));
  }
}

TEST_F(ServerTest, WsOversizedMessageClosesWith1009) {
  ws_client ws{port_};
  ws.send(chat("big", "hang-silent"));
  ASSERT_TRUE(eventually([&] { return stats_->live.load() == 1; }));
  ws.send_text(std::string(opts_.max_ws_message_bytes + 10, ' '));
  EXPECT_EQ(ws.read_until_close(), int(websocket::close_code::too_big));
  EXPECT_TRUE(eventually([&] { return stats_->cancelled.load() == 1; }));
}

TEST_F(ServerTest, WsAndHttpShareTheServer) {
  ws_client ws{port_};
  http_client c{port_};
  ws.send(chat("w", "count 5 2"));
  auto res = c.request(http::verb::post, "/v1/completions", completion_body("echo h"));
  EXPECT_EQ(json::parse(res.body())["choices"][0]["text"], "h ");
  EXPECT_EQ(text_of(ws.receive_until(is_final_for("w")), "w"), "t0 t1 t2 t3 t4 ");
}

} // namespace
} // namespace metronome::test
