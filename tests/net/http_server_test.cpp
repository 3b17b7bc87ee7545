// The HTTP side of the server over loopback, against the fake engine: the
// OpenAI routes (streaming and not), the other routes, every error status,
// keep-alive, pipelining, Expect: 100-continue, and cancellation when the
// client goes away.

#include <gtest/gtest.h>

#include "tests/net/server_fixture.hpp"

namespace metronome::test {
namespace {

using json = nlohmann::json;

json body_json(const response& res) {
  return json::parse(res.body());
}

void expect_error_body(const response& res, int status, const std::string& code = {}) {
  EXPECT_EQ(res.result_int(), unsigned(status)) << res.body();
  EXPECT_EQ(res[http::field::content_type], "application/json");
  auto j = json::parse(res.body());
  ASSERT_TRUE(j.contains("error")) << res.body();
  const auto& e = j["error"];
  EXPECT_TRUE(e["message"].is_string());
  EXPECT_TRUE(e["type"].is_string());
  EXPECT_TRUE(e.contains("param"));
  EXPECT_TRUE(e.contains("code"));
  if (!code.empty()) {
    EXPECT_EQ(e["code"], code) << res.body();
  }
}

/// The text of a chat or completion SSE stream, checking its structure.
std::string stream_text(const response& res, bool chat, json* usage = nullptr) {
  auto events = sse_data(res.body());
  EXPECT_GE(events.size(), 2u);
  if (events.empty())
    return {};
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  bool finished = false;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    auto j = json::parse(events[i]);
    EXPECT_EQ(j["object"], chat ? "chat.completion.chunk" : "text_completion");
    if (j["choices"].empty()) {
      // The usage chunk comes last, after the finish.
      EXPECT_TRUE(finished);
      EXPECT_EQ(i + 2, events.size());
      if (usage)
        *usage = j["usage"];
      continue;
    }
    const auto& c = j["choices"][0];
    if (chat) {
      if (i == 0) {
        EXPECT_EQ(c["delta"]["role"], "assistant");
      }
      if (c["delta"].contains("content"))
        text += c["delta"]["content"].get<std::string>();
    } else {
      text += c["text"].get<std::string>();
    }
    if (!c["finish_reason"].is_null()) {
      EXPECT_FALSE(finished) << "two finish chunks";
      finished = true;
    }
  }
  EXPECT_TRUE(finished);
  return text;
}

// -- simple routes --------------------------------------------------------------------

TEST_F(ServerTest, HealthFollowsTheEngineStatus) {
  http_client c{port_};
  auto ok = c.request(http::verb::get, "/health");
  EXPECT_EQ(ok.result_int(), 200u);
  EXPECT_EQ(body_json(ok)["status"], "ok");
  eng_.status->ready = false;
  auto loading = c.request(http::verb::get, "/health");
  EXPECT_EQ(loading.result_int(), 503u);
  EXPECT_EQ(body_json(loading)["status"], "loading");
  eng_.status->ready = true;
  eng_.status->set_degraded("the executor failed 6 times within 60 s (last: boom)");
  auto degraded = c.request(http::verb::get, "/health");
  EXPECT_EQ(degraded.result_int(), 503u);
  EXPECT_EQ(body_json(degraded)["status"], "degraded");
  EXPECT_EQ(body_json(degraded)["reason"], "the executor failed 6 times within 60 s (last: boom)");
}

TEST_F(ServerTest, Models) {
  http_client c{port_};
  auto res = c.request(http::verb::get, "/v1/models");
  ASSERT_EQ(res.result_int(), 200u);
  auto j = body_json(res);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "fake-model");
  EXPECT_EQ(j["data"][0]["max_model_len"], 128);
  auto one = c.request(http::verb::get, "/v1/models/fake-model");
  EXPECT_EQ(one.result_int(), 200u);
  EXPECT_EQ(body_json(one)["id"], "fake-model");
  expect_error_body(c.request(http::verb::get, "/v1/models/other"), 404, "model_not_found");
}

TEST_F(ServerTest, MetricsRendersTheEngineMetrics) {
  eng_.status->running = 5;
  http_client c{port_};
  auto res = c.request(http::verb::get, "/metrics");
  ASSERT_EQ(res.result_int(), 200u);
  EXPECT_EQ(res[http::field::content_type], "text/plain; version=0.0.4; charset=utf-8");
  // The engine's own gauges, as render_metrics() writes them, labelled with
  // the served model's name as vLLM's are.
  EXPECT_NE(res.body().find("\nmetronome:num_requests_running{model_name=\"fake-model\"} 5\n"),
            std::string::npos)
    << res.body();
  EXPECT_NE(res.body().find("# TYPE metronome:kv_cache_usage_perc gauge"), std::string::npos);
}

TEST_F(ServerTest, VersionNamesTheBuild) {
  http_client c{port_};
  auto res = c.request(http::verb::get, "/version");
  ASSERT_EQ(res.result_int(), 200u) << res.body();
  EXPECT_EQ(res[http::field::content_type], "application/json");
  auto j = body_json(res);
  EXPECT_EQ(j["version"], METRONOME_VERSION);
#ifdef METRONOME_HAVE_CUDA
  EXPECT_EQ(j["cuda"], true);
#else
  EXPECT_EQ(j["cuda"], false);
#endif
  EXPECT_TRUE(j["build_type"].is_string());
  EXPECT_TRUE(j["compiler"].is_string());
  expect_error_body(c.request(http::verb::post, "/version", "{}"), 405, "method_not_allowed");
}

TEST_F(ServerTest, TokenizerRoutesNeedAModelAndJson) {
  // The fake engine has no tokenizer: 503, not a crash.
  http_client c{port_};
  expect_error_body(c.request(http::verb::post, "/tokenize", R"({"prompt": "a"})"), 503,
                    "unavailable");
  expect_error_body(c.request(http::verb::post, "/detokenize", R"({"tokens": [1]})"), 503,
                    "unavailable");
  expect_error_body(c.request(http::verb::get, "/tokenize"), 405, "method_not_allowed");
  http_client d{port_};
  d.send_raw("POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
             "Content-Length: 2\r\n\r\n{}");
  expect_error_body(d.read(), 415, "unsupported_media_type");
}

TEST_F(ServerTest, ClientRequestIdIsEchoed) {
  http_client c{port_};
  // On a generation answer it replaces the response's own id in the header;
  // the body keeps its id.
  c.send(http::verb::post, "/v1/chat/completions", chat_body("echo a"),
         {{"X-Request-Id", "req-42_abc.DEF"}});
  auto res = c.read();
  ASSERT_EQ(res.result_int(), 200u) << res.body();
  EXPECT_EQ(res["X-Request-Id"], "req-42_abc.DEF");
  EXPECT_TRUE(body_json(res)["id"].get<std::string>().starts_with("chatcmpl-"));
  // Streaming, on another route, and on an error answer.
  c.send(http::verb::post, "/v1/completions", completion_body("echo a", {{"stream", true}}),
         {{"X-Request-Id", "s-1"}});
  EXPECT_EQ(c.read()["X-Request-Id"], "s-1");
  c.send(http::verb::get, "/v1/models", {}, {{"X-Request-Id", "m-1"}});
  EXPECT_EQ(c.read()["X-Request-Id"], "m-1");
  c.send(http::verb::get, "/nothing", {}, {{"X-Request-Id", "e-1"}});
  auto missing = c.read();
  EXPECT_EQ(missing.result_int(), 404u);
  EXPECT_EQ(missing["X-Request-Id"], "e-1");
  // The next request on the connection without one gets none (or its own).
  auto plain = c.request(http::verb::get, "/v1/models");
  EXPECT_EQ(plain.count("X-Request-Id"), 0u);
  auto gen = c.request(http::verb::post, "/v1/chat/completions", chat_body("echo a"));
  EXPECT_EQ(gen["X-Request-Id"], body_json(gen)["id"].get<std::string>());
}

TEST_F(ServerTest, InvalidClientRequestIdFallsBackToTheServersId) {
  const std::string too_long(129, 'a');
  for (const std::string& bad : {too_long, std::string("has space"), std::string("tab\tid"),
                                 std::string("caf\xC3\xA9")}) {
    http_client c{port_};
    c.send(http::verb::post, "/v1/chat/completions", chat_body("echo a"),
           {{"X-Request-Id", bad}});
    auto res = c.read();
    ASSERT_EQ(res.result_int(), 200u) << res.body();
    EXPECT_EQ(res["X-Request-Id"], body_json(res)["id"].get<std::string>()) << bad;
  }
  // 128 visible characters are still taken.
  http_client c{port_};
  const std::string longest(128, 'b');
  c.send(http::verb::post, "/v1/chat/completions", chat_body("echo a"),
         {{"X-Request-Id", longest}});
  EXPECT_EQ(c.read()["X-Request-Id"], longest);
}

// -- chat and completions ------------------------------------------------------------

TEST_F(ServerTest, KvHeadersAreReadAndUnknownValuesRefused) {
  http_client c{port_};
  // The fake engine's strategy is paged: a client may ask for paged.
  c.send(http::verb::post, "/v1/chat/completions", chat_body("echo a"),
         {{"X-KV-Cache-Mode", "paged"}, {"X-No-Batch", "true"}});
  auto res = c.read();
  ASSERT_EQ(res.result_int(), 200u) << res.body();
  EXPECT_EQ(res["X-KV-Cache-Strategy"], "paged");
  for (auto [name, value] : {std::pair{"X-KV-Cache-Mode", "bucketed"},
                             std::pair{"X-KV-Cache-Mode", "contiguous"},
                             std::pair{"X-No-Batch", "maybe"}}) {
    http_client d{port_};
    d.send(http::verb::post, "/v1/chat/completions", chat_body("echo a"), {{name, value}});
    auto bad = d.read();
    EXPECT_EQ(bad.result_int(), 400u) << name << ": " << value;
    EXPECT_NE(bad.body().find(name), std::string::npos) << bad.body();
  }
}

TEST_F(ServerTest, ChatNonStreaming) {
  http_client c{port_};
  auto res = c.request(http::verb::post, "/v1/chat/completions", chat_body("echo a b c"));
  ASSERT_EQ(res.result_int(), 200u) << res.body();
  EXPECT_EQ(res[http::field::content_type], "application/json");
  EXPECT_EQ(res["X-Batch-Size"], std::to_string(fake_batch_size));
  EXPECT_EQ(res["X-Inference-Version"], METRONOME_VERSION);
  EXPECT_EQ(res["X-KV-Cache-Strategy"], "paged");
  auto j = body_json(res);
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("chatcmpl-"));
  EXPECT_EQ(res["X-Request-Id"], j["id"].get<std::string>());
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "fake-model");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "a b c ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 10);
}

TEST_F(ServerTest, ChatStreaming) {
  http_client c{port_};
  auto res = c.request(http::verb::post, "/v1/chat/completions",
                       chat_body("echo one two", {{"stream", true}}));
  ASSERT_EQ(res.result_int(), 200u);
  EXPECT_EQ(res[http::field::content_type], "text/event-stream");
  EXPECT_EQ(res[http::field::transfer_encoding], "chunked");
  EXPECT_EQ(res["X-Batch-Size"], std::to_string(fake_batch_size));
  EXPECT_EQ(stream_text(res, true), "one two ");
  // Without include_usage there is no usage chunk and no usage key.
  for (auto& e : sse_data(res.body()))
    if (e != "[DONE]") {
      EXPECT_FALSE(json::parse(e).contains("usage"));
    }
}

TEST_F(ServerTest, ChatStreamingWithUsage) {
  http_client c{port_};
  auto res = c.request(http::verb::post, "/v1/chat/completions",
                       chat_body("count 4", {{"stream", true},
                                             {"stream_options", {{"include_usage", true}}}}));
  ASSERT_EQ(res.result_int(), 200u);
  json usage;
  EXPECT_EQ(stream_text(res, true, &usage), "t0 t1 t2 t3 ");
  EXPECT_EQ(usage["completion_tokens"], 4);
  EXPECT_EQ(usage["prompt_tokens"], 7);
  auto events = sse_data(res.body());
  auto finish = json::parse(events[events.size() - 3]);
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(finish["usage"].is_null());
}

TEST_F(ServerTest, CompletionsBothWays) {
  http_client c{port_};
  auto plain = c.request(http::verb::post, "/v1/completions", completion_body("echo x y"));
  ASSERT_EQ(plain.result_int(), 200u) << plain.body();
  auto j = body_json(plain);
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("cmpl-"));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "x y ");
  auto streamed = c.request(http::verb::post, "/v1/completions",
                            completion_body("echo x y", {{"stream", true}}));
  ASSERT_EQ(streamed.result_int(), 200u);
  EXPECT_EQ(stream_text(streamed, false), "x y ");
}

TEST_F(ServerTest, EmptyGenerationStillGetsHeadersAndFinish) {
  http_client c{port_};
  auto res = c.request(http::verb::post, "/v1/chat/completions",
                       chat_body("empty", {{"stream", true}}));
  ASSERT_EQ(res.result_int(), 200u);
  EXPECT_EQ(res["X-Batch-Size"], std::to_string(fake_batch_size));
  EXPECT_EQ(stream_text(res, true), "");
}

TEST_F(ServerTest, ParametersReachTheEngine) {
  http_client c{port_};
  auto res = c.request(http::verb::post, "/v1/chat/completions",
                       chat_body("params", {{"temperature", 0.25},
                                            {"top_p", 0.5},
                                            {"max_completion_tokens", 9},
                                            {"seed", 77},
                                            {"stop", {"END", "###"}},
                                            {"unknown_field", 1}}));
  ASSERT_EQ(res.result_int(), 200u) << res.body();
  auto seen = json::parse(body_json(res)["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(seen["chat"], true);
  EXPECT_FLOAT_EQ(seen["temperature"].get<float>(), 0.25f);
  EXPECT_FLOAT_EQ(seen["top_p"].get<float>(), 0.5f);
  EXPECT_EQ(seen["max_tokens"], 9);
  EXPECT_EQ(seen["seed"], 77);
  EXPECT_EQ(seen["stop"], (json{"END", "###"}));
  EXPECT_EQ(seen["timeout_ms"], 30000);
  EXPECT_EQ(seen["messages"][0]["content"], "params");
  EXPECT_EQ(seen["request_id"], body_json(res)["id"]);
}

TEST_F(ServerTest, Utf8PassesThrough) {
  http_client c{port_};
  auto res = c.request(http::verb::post, "/v1/completions",
                       completion_body("h\u00e9llo \u4e16\u754c \U0001F600"));
  ASSERT_EQ(res.result_int(), 200u);
  EXPECT_EQ(body_json(res)["choices"][0]["text"], "h\u00e9llo \u4e16\u754c \U0001F600");
}

// -- errors -----------------------------------------------------------------------------

TEST_F(ServerTest, UnknownRouteIs404) {
  http_client c{port_};
  expect_error_body(c.request(http::verb::get, "/v1/nothing"), 404);
  expect_error_body(c.request(http::verb::post, "/v2/chat/completions", "{}"), 404);
}

TEST_F(ServerTest, WrongMethodIs405WithAllow) {
  http_client c{port_};
  auto get = c.request(http::verb::get, "/v1/chat/completions");
  expect_error_body(get, 405, "method_not_allowed");
  EXPECT_EQ(get[http::field::allow], "POST");
  auto post = c.request(http::verb::post, "/health", "{}");
  expect_error_body(post, 405);
  EXPECT_EQ(post[http::field::allow], "GET");
  auto del = c.request(http::verb::delete_, "/v1/completions");
  expect_error_body(del, 405);
}

TEST_F(ServerTest, MalformedJsonWrongTypesAndRangesAre400) {
  http_client c{port_};
  expect_error_body(c.request(http::verb::post, "/v1/chat/completions", "{not json"), 400,
                    "invalid_json");
  expect_error_body(c.request(http::verb::post, "/v1/chat/completions",
                              chat_body("x", {{"temperature", "warm"}})),
                    400, "invalid_type");
  auto range = c.request(http::verb::post, "/v1/chat/completions",
                         chat_body("x", {{"top_p", 3}}));
  expect_error_body(range, 400);
  EXPECT_EQ(body_json(range)["error"]["param"], "top_p");
  expect_error_body(c.request(http::verb::post, "/v1/completions",
                              completion_body("x", {{"n", 3}})),
                    400);
  expect_error_body(c.request(http::verb::post, "/v1/chat/completions",
                              chat_body("x", {{"model", "nope"}})),
                    404, "model_not_found");
  // Every error left the connection usable.
  EXPECT_EQ(c.request(http::verb::get, "/health").result_int(), 200u);
  EXPECT_EQ(stats_->requests.load(), 0);
}

TEST_F(ServerTest, BodyOverTheLimitIs413) {
  http_client c{port_};
  std::string big(opts_.max_body_bytes + 1, ' ');
  auto res = c.request(http::verb::post, "/v1/chat/completions", big);
  expect_error_body(res, 413, "request_too_large");
  EXPECT_FALSE(res.keep_alive());
  // A chunked body over the limit too.
  http_client d{port_};
  std::string chunked =
    "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    "Transfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 20; ++i)
    chunked += "1000\r\n" + std::string(4096, ' ') + "\r\n";
  chunked += "0\r\n\r\n";
  d.send_raw(chunked);
  expect_error_body(d.read(), 413);
}

TEST_F(ServerTest, EngineErrorsKeepTheirStatus) {
  http_client c{port_};
  struct expectation {
    request_errc code;
    int status;
    std::string error_code;
  };
  for (auto [code, status, error_code] :
       {expectation{request_errc::invalid_request, 400, "invalid_value"},
        expectation{request_errc::context_length, 400, "context_length_exceeded"},
        expectation{request_errc::queue_full, 429, "queue_full"},
        expectation{request_errc::engine_failure, 500, "engine_failure"},
        expectation{request_errc::timeout, 504, "timeout"},
        expectation{request_errc::unavailable, 503, "unavailable"}}) {
    auto script = "error " + std::to_string(int(code));
    for (bool stream : {false, true}) {
      auto res = c.request(http::verb::post, "/v1/chat/completions",
                           chat_body(script, {{"stream", stream}}));
      expect_error_body(res, status, error_code);
      EXPECT_EQ(http_status(code), status);
      EXPECT_EQ(body_json(res)["error"]["param"], "prompt");
      EXPECT_EQ(body_json(res)["error"]["type"], error_type(code));
      EXPECT_EQ(res["X-Inference-Version"], METRONOME_VERSION);
      if (status == 429) {
        EXPECT_EQ(res[http::field::retry_after], "7");
      } else {
        EXPECT_EQ(res.count(http::field::retry_after), 0u);
      }
    }
  }
}

TEST_F(ServerTest, ErrorAfterTheFirstTokenIsAnSseEvent) {
  http_client c{port_};
  auto res = c.request(http::verb::post, "/v1/chat/completions",
                       chat_body("late-error", {{"stream", true}}));
  ASSERT_EQ(res.result_int(), 200u);
  auto events = sse_data(res.body());
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  auto err = json::parse(events[events.size() - 2]);
  EXPECT_EQ(err["error"]["message"], "the executor failed");
  EXPECT_EQ(err["error"]["type"], error_type(request_errc::engine_failure));
  // The connection is still in a clean state.
  EXPECT_EQ(c.request(http::verb::get, "/health").result_int(), 200u);
}

TEST_F(ServerTest, AnEngineActorDyingWithoutAnswerIsAnError) {
  http_client c{port_};
  auto res = c.request(http::verb::post, "/v1/chat/completions", chat_body("vanish"));
  expect_error_body(res, 503, "unavailable");
  auto streamed = c.request(http::verb::post, "/v1/chat/completions",
                            chat_body("vanish", {{"stream", true}}));
  ASSERT_EQ(streamed.result_int(), 200u);
  auto events = sse_data(streamed.body());
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(json::parse(events[events.size() - 2])["error"]["code"], "unavailable");
}

TEST_F(ServerTest, TheEngineStoppingFailsRequestsInFlight) {
  http_client c{port_};
  c.send(http::verb::post, "/v1/chat/completions", chat_body("hang-silent"));
  ASSERT_TRUE(eventually([&] { return stats_->requests.load() == 1; }));
  caf::anon_send_exit(eng_.frontend, caf::exit_reason::kill);
  expect_error_body(c.read(), 503, "unavailable");
  ws_client ws{port_};
  ws.send({{"type", "chat"}, {"id", "late"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}});
  auto e = ws.receive();
  EXPECT_EQ(e["type"], "error");
  EXPECT_EQ(e["id"], "late");
  EXPECT_EQ(e["error"]["status"], 503);
}

TEST_F(ServerTest, MalformedHttpIs400AndCloses) {
  http_client c{port_};
  c.send_raw("THIS IS NOT HTTP\r\n\r\n");
  auto res = c.read();
  expect_error_body(res, 400);
  EXPECT_FALSE(res.keep_alive());
  EXPECT_TRUE(c.closed_by_server());
}

TEST_F(ServerTest, OversizedHeaderIs431) {
  http_client c{port_};
  c.send_raw("GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + std::string(40000, 'a') +
             "\r\n\r\n");
  expect_error_body(c.read(), 431);
}

TEST_F(ServerTest, PlainGetOnTheWebSocketRouteIs426) {
  http_client c{port_};
  expect_error_body(c.request(http::verb::get, "/v1/ws"), 426);
}

// -- connection handling -----------------------------------------------------------------

TEST_F(ServerTest, KeepAliveServesManyRequests) {
  http_client c{port_};
  for (int i = 0; i < 20; ++i) {
    auto res = c.request(http::verb::post, "/v1/completions",
                         completion_body("echo r" + std::to_string(i), {{"stream", i % 2 == 0}}));
    ASSERT_EQ(res.result_int(), 200u);
    EXPECT_TRUE(res.keep_alive());
  }
  EXPECT_EQ(server_->connections(), 1u);
}

TEST_F(ServerTest, PipelinedRequestsAreAnsweredInOrder) {
  http_client c{port_};
  std::string batch;
  auto add = [&](std::string_view method, std::string_view target, const std::string& body) {
    batch += fmt::format("{} {} HTTP/1.1\r\nHost: localhost\r\n"
                         "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
                         method, target, body.size(), body);
  };
  add("POST", "/v1/chat/completions", chat_body("count 3 5", {{"stream", true}}));
  add("GET", "/health", "");
  add("POST", "/v1/completions", completion_body("echo second"));
  add("GET", "/nope", "");
  add("POST", "/v1/completions", completion_body("echo third", {{"stream", true}}));
  c.send_raw(batch);
  auto r1 = c.read();
  EXPECT_EQ(stream_text(r1, true), "t0 t1 t2 ");
  auto r2 = c.read();
  EXPECT_EQ(body_json(r2)["status"], "ok");
  auto r3 = c.read();
  EXPECT_EQ(body_json(r3)["choices"][0]["text"], "second ");
  auto r4 = c.read();
  EXPECT_EQ(r4.result_int(), 404u);
  auto r5 = c.read();
  EXPECT_EQ(stream_text(r5, false), "third ");
}

TEST_F(ServerTest, ExpectContinue) {
  http_client c{port_};
  auto body = completion_body("echo continued");
  c.send_raw(fmt::format("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                         "Expect: 100-continue\r\nContent-Type: application/json\r\n"
                         "Content-Length: {}\r\n\r\n",
                         body.size()));
  std::string interim(25, '\0');
  asio::read(c.socket(), asio::buffer(interim));
  EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
  c.send_raw(body);
  auto res = c.read();
  EXPECT_EQ(body_json(res)["choices"][0]["text"], "continued ");
}

TEST_F(ServerTest, Http10GetsAnAnswerAndAClose) {
  http_client c{port_};
  auto body = completion_body("echo old", {{"stream", true}});
  c.send_raw(fmt::format("POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                         "Content-Length: {}\r\n\r\n{}",
                         body.size(), body));
  auto res = c.read();
  EXPECT_EQ(res.version(), 10u);
  EXPECT_EQ(res.count(http::field::transfer_encoding), 0u);
  EXPECT_EQ(stream_text(res, false), "old ");
}

TEST_F(ServerTest, DisconnectMidStreamCancels) {
  for (bool reset : {false, true}) {
    auto before = stats_->cancelled.load();
    http_client c{port_};
    c.send(http::verb::post, "/v1/chat/completions", chat_body("hang", {{"stream", true}}));
    auto& head = c.read_header();
    EXPECT_EQ(head.get().result_int(), 200u);
    reset ? c.reset() : c.close();
    EXPECT_TRUE(eventually([&] { return stats_->cancelled.load() == before + 1; }))
      << "reset=" << reset;
  }
  EXPECT_TRUE(eventually([&] { return stats_->live.load() == 0; }));
}

TEST_F(ServerTest, DisconnectBeforeAnyOutputCancels) {
  http_client c{port_};
  c.send(http::verb::post, "/v1/chat/completions", chat_body("hang-silent"));
  ASSERT_TRUE(eventually([&] { return stats_->requests.load() == 1; }));
  c.close();
  EXPECT_TRUE(eventually([&] { return stats_->cancelled.load() == 1; }));
  EXPECT_TRUE(eventually([&] { return stats_->live.load() == 0; }));
}

TEST_F(ServerTest, StopCancelsRequestsInFlight) {
  std::vector<std::unique_ptr<http_client>> clients;
  for (int i = 0; i < 5; ++i) {
    clients.push_back(std::make_unique<http_client>(port_));
    clients.back()->send(http::verb::post, "/v1/completions",
                         completion_body("hang", {{"stream", i % 2 == 0}}));
  }
  ASSERT_TRUE(eventually([&] { return stats_->requests.load() == 5; }));
  server_->stop();
  EXPECT_TRUE(eventually([&] { return stats_->cancelled.load() == 5; }));
  EXPECT_TRUE(eventually([&] { return stats_->live.load() == 0; }));
}

TEST_F(ServerTest, IdleConnectionsAreClosed) {
  stop();
  opts_.idle_timeout = std::chrono::seconds(1);
  start();
  http_client c{port_};
  EXPECT_EQ(c.request(http::verb::get, "/health").result_int(), 200u);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(c.closed_by_server());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST_F(ServerTest, ManyConcurrentStreams) {
  constexpr int clients = 32;
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int i = 0; i < clients; ++i)
    threads.emplace_back([&, i] {
      http_client c{port_};
      for (int k = 0; k < 3; ++k) {
        auto res = c.request(http::verb::post, "/v1/completions",
                             completion_body(fmt::format("count {} 1", 5 + i % 7),
                                             {{"stream", (i + k) % 2 == 0}}));
        std::string expected;
        for (int t = 0; t < 5 + i % 7; ++t)
          expected += "t" + std::to_string(t) + " ";
        bool stream = (i + k) % 2 == 0;
        auto text = stream ? stream_text(res, false)
                           : json::parse(res.body())["choices"][0]["text"].get<std::string>();
        if (res.result_int() == 200 && text == expected)
          ++good;
      }
    });
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(good.load(), clients * 3);
  EXPECT_TRUE(eventually([&] { return stats_->live.load() == 0; }));
  EXPECT_EQ(stats_->cancelled.load(), 0);
}

} // namespace
} // namespace metronome::test
