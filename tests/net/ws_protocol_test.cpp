// The WebSocket protocol's messages (docs/protocol.md): parsing client
// messages into their kinds, and the events' JSON.

#include <gtest/gtest.h>

#include "net/ws_protocol.hpp"

namespace metronome::net {
namespace {

using json = nlohmann::json;

parse_defaults defaults() {
  parse_defaults d;
  d.model_name = "m";
  return d;
}

ws_message parse(const json& j) {
  return parse_ws_message(j.dump(), defaults());
}

const ws_bad& bad(const ws_message& m) {
  static const ws_bad none{};
  auto* b = std::get_if<ws_bad>(&m);
  EXPECT_NE(b, nullptr) << "expected an error";
  return b ? *b : none;
}

TEST(WsProtocol, Chat) {
  auto m = parse({{"type", "chat"},
                  {"id", "req-1"},
                  {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                  {"max_tokens", 5},
                  {"temperature", 0}});
  auto* chat = std::get_if<ws_chat>(&m);
  ASSERT_NE(chat, nullptr);
  EXPECT_EQ(chat->id, "req-1");
  EXPECT_TRUE(chat->request.request.chat);
  EXPECT_EQ(chat->request.request.params.max_tokens, 5);
  EXPECT_EQ(chat->request.request.params.temperature, 0.0f);
  ASSERT_EQ(chat->request.request.messages.size(), 1u);
}

TEST(WsProtocol, CancelAndPing) {
  auto c = parse({{"type", "cancel"}, {"id", "x"}});
  ASSERT_TRUE(std::holds_alternative<ws_cancel>(c));
  EXPECT_EQ(std::get<ws_cancel>(c).id, "x");
  auto p = parse({{"type", "ping"}});
  ASSERT_TRUE(std::holds_alternative<ws_ping>(p));
  EXPECT_FALSE(std::get<ws_ping>(p).id.has_value());
  auto pid = parse({{"type", "ping"}, {"id", "p1"}});
  EXPECT_EQ(std::get<ws_ping>(pid).id, std::optional<std::string>("p1"));
}

TEST(WsProtocol, BadMessages) {
  EXPECT_EQ(bad(parse_ws_message("not json", defaults())).error.code, "invalid_json");
  EXPECT_EQ(bad(parse_ws_message("[1]", defaults())).error.code, "invalid_type");
  EXPECT_EQ(bad(parse({{"id", "a"}})).error.param, "type");
  EXPECT_EQ(bad(parse({{"type", 3}})).error.param, "type");
  auto unknown = bad(parse({{"type", "dance"}, {"id", "a"}}));
  EXPECT_EQ(unknown.error.param, "type");
  EXPECT_EQ(unknown.id, std::optional<std::string>("a"));
  EXPECT_EQ(bad(parse({{"type", "chat"}, {"messages", json::array()}})).error.param, "id");
  EXPECT_EQ(bad(parse({{"type", "cancel"}})).error.param, "id");
  EXPECT_EQ(bad(parse({{"type", "chat"}, {"id", 5}})).error.param, "id");
  EXPECT_EQ(bad(parse({{"type", "chat"}, {"id", ""}})).error.param, "id");
  EXPECT_EQ(bad(parse({{"type", "chat"}, {"id", std::string(max_ws_id_bytes + 1, 'x')}}))
              .error.param,
            "id");
  // A chat with bad parameters names its id, so the client knows which.
  auto b = bad(parse({{"type", "chat"},
                      {"id", "q"},
                      {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                      {"temperature", 7}}));
  EXPECT_EQ(b.id, std::optional<std::string>("q"));
  EXPECT_EQ(b.error.param, "temperature");
  EXPECT_EQ(b.error.status, 400);
}

TEST(WsProtocol, Events) {
  auto d = json::parse(ws_delta_event("a", "tok"));
  EXPECT_EQ(d, (json{{"type", "delta"}, {"id", "a"}, {"text", "tok"}}));

  generation_done g;
  g.finish_reason = finish_kind::length;
  g.prompt_tokens = 4;
  g.completion_tokens = 6;
  g.queue_s = 0.010;
  g.ttft_s = 0.025;
  g.e2e_s = 0.5;
  g.first_token_batch_size = 2;
  auto done = json::parse(ws_done_event("a", g));
  EXPECT_EQ(done["type"], "done");
  EXPECT_EQ(done["id"], "a");
  EXPECT_EQ(done["finish_reason"], "length");
  EXPECT_EQ(done["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(done["usage"]["completion_tokens"], 6);
  EXPECT_EQ(done["usage"]["total_tokens"], 10);
  EXPECT_DOUBLE_EQ(done["timings"]["queue_ms"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(done["timings"]["ttft_ms"].get<double>(), 25.0);
  EXPECT_DOUBLE_EQ(done["timings"]["e2e_ms"].get<double>(), 500.0);

  auto c = json::parse(ws_cancelled_event("a"));
  EXPECT_EQ(c["type"], "done");
  EXPECT_EQ(c["finish_reason"], "cancelled");

  auto e = json::parse(ws_error_event("a", api_error::bad_request("bad", "temperature")));
  EXPECT_EQ(e["type"], "error");
  EXPECT_EQ(e["id"], "a");
  EXPECT_EQ(e["error"]["message"], "bad");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "temperature");
  EXPECT_EQ(e["error"]["status"], 400);
  auto anon = json::parse(ws_error_event(std::nullopt, api_error::bad_request("bad")));
  EXPECT_FALSE(anon.contains("id"));
  EXPECT_TRUE(anon["error"]["param"].is_null());

  EXPECT_EQ(json::parse(ws_pong_event(std::nullopt)), (json{{"type", "pong"}}));
}

} // namespace
} // namespace metronome::net
