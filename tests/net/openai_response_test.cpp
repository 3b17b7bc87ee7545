// Formatting of OpenAI answers and their framing: the object shapes the
// OpenAI API reference documents for chat.completion, chat.completion.chunk
// and text_completion, SSE events, and HTTP/1.1 chunked framing (RFC 9112
// section 7.1), checked by decoding them again.

#include <cmath>

#include <gtest/gtest.h>

#include "net/openai_response.hpp"

namespace metronome::net {
namespace {

using json = nlohmann::json;

response_meta meta(api_kind kind, bool usage = false) {
  response_meta m;
  m.kind = kind;
  m.id = kind == api_kind::chat ? "chatcmpl-1" : "cmpl-1";
  m.model = "m";
  m.created = 1700000000;
  m.include_usage = usage;
  return m;
}

generation_done done(finish_kind reason) {
  generation_done d;
  d.finish_reason = reason;
  d.prompt_tokens = 5;
  d.completion_tokens = 3;
  return d;
}

/// Decodes a chunked body (hex size CRLF data CRLF ... 0 CRLF CRLF).
std::string unchunk(const std::string& framed) {
  std::string out;
  size_t pos = 0;
  for (;;) {
    auto eol = framed.find("\r\n", pos);
    EXPECT_NE(eol, std::string::npos);
    if (eol == std::string::npos)
      return out;
    auto size = std::stoul(framed.substr(pos, eol - pos), nullptr, 16);
    pos = eol + 2;
    if (size == 0) {
      EXPECT_EQ(framed.substr(pos), "\r\n");
      return out;
    }
    out += framed.substr(pos, size);
    pos += size;
    EXPECT_EQ(framed.substr(pos, 2), "\r\n");
    pos += 2;
  }
}

TEST(OpenaiResponse, ChatCompletionBody) {
  auto j = completion_body(meta(api_kind::chat), "Hello there", done(finish_kind::stop));
  EXPECT_EQ(j["id"], "chatcmpl-1");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "m");
  ASSERT_EQ(j["choices"].size(), 1u);
  const auto& c = j["choices"][0];
  EXPECT_EQ(c["index"], 0);
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_EQ(c["message"]["content"], "Hello there");
  EXPECT_EQ(c["finish_reason"], "stop");
  EXPECT_TRUE(c["logprobs"].is_null());
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 8);
}

/// Two generated tokens: " caf" (alternatives " caf", " tea") and a token
/// holding the first byte of "é" (no text of its own, so U+FFFD).
std::vector<position_logprobs> two_positions() {
  position_logprobs a;
  a.sampled = {" caf", " caf", -0.25f};
  a.top = {{" caf", " caf", -0.25f}, {" tea", " tea", -1.5f}};
  position_logprobs b;
  b.sampled = {"\xEF\xBF\xBD", "\xC3", -INFINITY};
  b.top = {{"\xEF\xBF\xBD", "\xC3", -0.5f}, {"\xEF\xBF\xBD", "\xC2", -0.75f}};
  return {a, b};
}

TEST(OpenaiResponse, ChatLogprobsFollowTheOpenaiShape) {
  auto m = meta(api_kind::chat);
  const auto stop = done(finish_kind::stop);
  EXPECT_TRUE(completion_body(m, "x", stop, two_positions())["choices"][0]["logprobs"]
                .is_null()); // not asked
  m.logprobs = true;
  auto lp = completion_body(m, " caf\xC3\xA9", stop, two_positions())["choices"][0]["logprobs"];
  EXPECT_TRUE(lp["refusal"].is_null());
  const auto& content = lp["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], " caf");
  EXPECT_DOUBLE_EQ(content[0]["logprob"].get<double>(), -0.25);
  EXPECT_EQ(content[0]["bytes"], json({32, 99, 97, 102}));
  ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], " tea");
  EXPECT_DOUBLE_EQ(content[0]["top_logprobs"][1]["logprob"].get<double>(), -1.5);
  EXPECT_EQ(content[0]["top_logprobs"][1]["bytes"], json({32, 116, 101, 97}));
  EXPECT_FALSE(content[0]["top_logprobs"][1].contains("top_logprobs"));
  // The raw byte, not the replacement character's three; JSON has no
  // infinity, so -inf is written as vLLM writes it.
  EXPECT_EQ(content[1]["bytes"], json({0xC3}));
  EXPECT_EQ(content[1]["token"], "\xEF\xBF\xBD");
  EXPECT_DOUBLE_EQ(content[1]["logprob"].get<double>(), -9999.0);
  // A stream's chunk carries the positions it was given.
  auto chunk = delta_chunk(m, " caf", {two_positions()[0]});
  ASSERT_EQ(chunk["choices"][0]["logprobs"]["content"].size(), 1u);
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["content"][0]["token"], " caf");
}

TEST(OpenaiResponse, CompletionLogprobsFollowTheLegacyShape) {
  auto m = meta(api_kind::completion);
  m.logprobs = true;
  auto positions = two_positions();
  positions.push_back(positions[0]);
  logprobs_cursor cursor;
  // Two chunks of one stream: text_offset goes on across them (characters).
  auto first = delta_chunk(m, " caf", {positions[0], positions[1]}, &cursor)["choices"][0]["logprobs"];
  auto second = delta_chunk(m, " caf", {positions[2]}, &cursor)["choices"][0]["logprobs"];
  EXPECT_EQ(first["tokens"], json({" caf", "\xEF\xBF\xBD"}));
  EXPECT_DOUBLE_EQ(first["token_logprobs"][0].get<double>(), -0.25);
  EXPECT_DOUBLE_EQ(first["token_logprobs"][1].get<double>(), -9999.0);
  EXPECT_EQ(first["text_offset"], json({0, 4}));
  EXPECT_EQ(second["text_offset"], json({5}));
  // top_logprobs: one object per token; alternatives of one text keep the likelier.
  EXPECT_EQ(first["top_logprobs"][0].size(), 2u);
  EXPECT_DOUBLE_EQ(first["top_logprobs"][0][" tea"].get<double>(), -1.5);
  ASSERT_EQ(first["top_logprobs"][1].size(), 1u);
  EXPECT_DOUBLE_EQ(first["top_logprobs"][1]["\xEF\xBF\xBD"].get<double>(), -0.5);
  // The whole body starts at offset 0.
  auto body
    = completion_body(m, "x", done(finish_kind::length), positions)["choices"][0]["logprobs"];
  EXPECT_EQ(body["text_offset"], json({0, 4, 5}));
}

TEST(OpenaiResponse, TextCompletionBody) {
  auto j = completion_body(meta(api_kind::completion), "abc", done(finish_kind::length));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "abc");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(j["choices"][0].contains("message"));
  EXPECT_EQ(j["usage"]["total_tokens"], 8);
}

TEST(OpenaiResponse, ChatStreamChunks) {
  auto m = meta(api_kind::chat);
  auto role = role_chunk(m);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(role.contains("usage"));

  auto d = delta_chunk(m, "Hel");
  EXPECT_EQ(d["choices"][0]["delta"]["content"], "Hel");
  EXPECT_FALSE(d["choices"][0]["delta"].contains("role"));
  EXPECT_TRUE(d["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(d["id"], role["id"]);
  EXPECT_EQ(d["created"], role["created"]);

  auto f = finish_chunk(m, finish_kind::stop);
  EXPECT_TRUE(f["choices"][0]["delta"].is_object());
  EXPECT_TRUE(f["choices"][0]["delta"].empty());
  EXPECT_EQ(f["choices"][0]["finish_reason"], "stop");
}

TEST(OpenaiResponse, UsageChunkOnlyWhenAsked) {
  auto m = meta(api_kind::chat, true);
  // With include_usage every chunk says "usage": null ...
  auto d = delta_chunk(m, "x");
  ASSERT_TRUE(d.contains("usage"));
  EXPECT_TRUE(d["usage"].is_null());
  // ... and the last one has no choices and the usage.
  auto u = usage_chunk(m, done(finish_kind::stop));
  EXPECT_TRUE(u["choices"].is_array());
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["completion_tokens"], 3);
}

TEST(OpenaiResponse, CompletionStreamChunks) {
  auto m = meta(api_kind::completion);
  auto d = delta_chunk(m, "tok");
  EXPECT_EQ(d["object"], "text_completion");
  EXPECT_EQ(d["choices"][0]["text"], "tok");
  auto f = finish_chunk(m, finish_kind::length);
  EXPECT_EQ(f["choices"][0]["text"], "");
  EXPECT_EQ(f["choices"][0]["finish_reason"], "length");
}

TEST(OpenaiResponse, SseFraming) {
  auto e = sse_event(json{{"a", "line1\nline2"}});
  // One event: "data: " + one-line JSON + blank line; newlines in strings
  // are escaped, so the event cannot be split.
  ASSERT_TRUE(e.starts_with("data: "));
  ASSERT_TRUE(e.ends_with("\n\n"));
  EXPECT_EQ(e.find('\n'), e.size() - 2);
  EXPECT_EQ(json::parse(e.substr(6)), (json{{"a", "line1\nline2"}}));
  EXPECT_EQ(sse_done, "data: [DONE]\n\n");
}

TEST(OpenaiResponse, ChunkedFramingRoundTrips) {
  std::string body;
  std::string expected;
  for (auto piece : {std::string("a"), std::string(15, 'b'), std::string(16, 'c'),
                     std::string(4097, 'd'), std::string("\r\n0\r\n\r\n")}) {
    body += http_chunk(piece);
    expected += piece;
  }
  body += http_last_chunk;
  EXPECT_EQ(unchunk(body), expected);
  // An empty piece must not produce the terminating chunk.
  EXPECT_EQ(http_chunk(""), "");
}

TEST(OpenaiResponse, InvalidUtf8NeverThrows) {
  auto m = meta(api_kind::chat);
  std::string bad = "ok \xff\xfe end";
  std::string out;
  EXPECT_NO_THROW(out = sse_event(delta_chunk(m, bad)));
  auto j = json::parse(out.substr(6));
  EXPECT_EQ(j["choices"][0]["delta"]["content"], "ok \xEF\xBF\xBD\xEF\xBF\xBD end");
}

TEST(OpenaiResponse, Models) {
  auto j = models_body("m", 123, 4096);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "m");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][0]["created"], 123);
  EXPECT_TRUE(j["data"][0]["owned_by"].is_string());
  EXPECT_FALSE(j["data"][0].contains("description"));
  auto d = models_body("m", 123, 4096, "a small model");
  EXPECT_EQ(d["data"][0]["description"], "a small model");
  EXPECT_EQ(model_body("m", 123, 4096, "a small model")["description"], "a small model");
}

} // namespace
} // namespace metronome::net
