// Parsing OpenAI request bodies: accepted shapes, defaults, and the 400s
// (status, type, param, code) for wrong types, ranges and unsupported
// features, as the OpenAI API reference specifies them.

#include <tuple>

#include <gtest/gtest.h>

#include "net/openai_request.hpp"

namespace metronome::net {
namespace {

using json = nlohmann::json;

parse_defaults defaults() {
  parse_defaults d;
  d.model_name = "m";
  d.timeout = std::chrono::milliseconds(5000);
  return d;
}

std::expected<openai_request, api_error> chat(json body) {
  if (!body.contains("messages"))
    body["messages"] = json::array({{{"role", "user"}, {"content", "hi"}}});
  return parse_openai_request(api_kind::chat, body, defaults());
}

std::expected<openai_request, api_error> completion(json body) {
  if (!body.contains("prompt"))
    body["prompt"] = "hi";
  return parse_openai_request(api_kind::completion, body, defaults());
}

/// The request must fail with 400 naming `param`.
void expect_400(const std::expected<openai_request, api_error>& r, const std::string& param) {
  ASSERT_FALSE(r.has_value()) << "accepted, expected a 400 for " << param;
  EXPECT_EQ(r.error().status, 400);
  EXPECT_EQ(r.error().type, "invalid_request_error");
  EXPECT_EQ(r.error().param, param) << r.error().message;
  EXPECT_FALSE(r.error().message.empty());
}

// -- accepted shapes ------------------------------------------------------------------

TEST(OpenaiRequest, ChatWithAllCommonFields) {
  auto r = chat({{"model", "m"},
                 {"messages",
                  {{{"role", "system"}, {"content", "be brief"}},
                   {{"role", "user"}, {"content", "hello"}},
                   {{"role", "assistant"}, {"content", "hi"}},
                   {{"role", "user"}, {"content", "again"}}}},
                 {"temperature", 0.5},
                 {"top_p", 0.9},
                 {"top_k", 40},
                 {"min_p", 0.05},
                 {"seed", 42},
                 {"max_tokens", 33},
                 {"frequency_penalty", 0.5},
                 {"presence_penalty", -0.5},
                 {"repetition_penalty", 1.1},
                 {"stop", {"\n\n", "END"}},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}},
                 {"n", 1},
                 {"logprobs", false},
                 {"user", "someone"},
                 {"some_future_field", {{"nested", true}}}});
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const auto& req = r->request;
  EXPECT_TRUE(req.chat);
  ASSERT_EQ(req.messages.size(), 4u);
  EXPECT_EQ(req.messages[0].role, "system");
  EXPECT_EQ(req.messages[0].content, "be brief");
  EXPECT_EQ(req.messages[3].content, "again");
  EXPECT_FLOAT_EQ(req.params.temperature, 0.5f);
  EXPECT_FLOAT_EQ(req.params.top_p, 0.9f);
  EXPECT_EQ(req.params.top_k, 40);
  EXPECT_FLOAT_EQ(req.params.min_p, 0.05f);
  ASSERT_TRUE(req.params.seed.has_value());
  EXPECT_EQ(*req.params.seed, 42u);
  EXPECT_EQ(req.params.max_tokens, 33);
  EXPECT_FLOAT_EQ(req.params.frequency_penalty, 0.5f);
  EXPECT_FLOAT_EQ(req.params.presence_penalty, -0.5f);
  EXPECT_FLOAT_EQ(req.params.repetition_penalty, 1.1f);
  EXPECT_EQ(req.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(req.timeout, std::chrono::milliseconds(5000));
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(r->model, "m");
}

TEST(OpenaiRequest, NullCountsAsAbsent) {
  auto r = chat({{"temperature", nullptr},
                 {"stop", nullptr},
                 {"max_tokens", nullptr},
                 {"seed", nullptr},
                 {"stream_options", nullptr},
                 {"model", nullptr}});
  ASSERT_TRUE(r.has_value()) << r.error().message;
  sampling_params defaults_of_engine;
  EXPECT_EQ(r->request.params.temperature, defaults_of_engine.temperature);
  EXPECT_FALSE(r->request.params.seed.has_value());
  EXPECT_TRUE(r->request.stop.empty());
}

TEST(OpenaiRequest, ContentPartsAreJoined) {
  auto r = chat({{"messages",
                  {{{"role", "user"},
                    {"content",
                     {{{"type", "text"}, {"text", "first"}}, {{"type", "text"}, {"text", "second"}}}}}}}});
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->request.messages[0].content, "first\nsecond");
}

TEST(OpenaiRequest, DeveloperRoleIsSystemAndAssistantContentMayBeNull) {
  auto r = chat({{"messages",
                  {{{"role", "developer"}, {"content", "rules"}},
                   {{"role", "user"}, {"content", "q"}},
                   {{"role", "assistant"}, {"content", nullptr}},
                   {{"role", "user"}, {"content", "q2"}}}}});
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->request.messages[0].role, "system");
  EXPECT_EQ(r->request.messages[2].content, "");
}

TEST(OpenaiRequest, MaxCompletionTokensWinsOverMaxTokens) {
  auto r = chat({{"max_tokens", 10}, {"max_completion_tokens", 20}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->request.params.max_tokens, 20);
}

TEST(OpenaiRequest, MaxContextLengthIsAPositiveInteger) {
  auto r = completion({{"max_context_length", 4096}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->request.max_context, 4096);
  EXPECT_EQ(completion({})->request.max_context, 0) << "absent: no hint";
  expect_400(completion({{"max_context_length", 0}}), "max_context_length");
  expect_400(completion({{"max_context_length", "8k"}}), "max_context_length");
}

TEST(OpenaiRequest, KvHeadersChooseAmongWhatTheServerAllows) {
  generate_request req;
  EXPECT_FALSE(read_kv_headers("", "", kv_strategy::paged, req)) << "absent: the defaults";
  EXPECT_FALSE(req.kv_mode);
  EXPECT_FALSE(req.no_batch);
  EXPECT_FALSE(read_kv_headers("paged", "true", kv_strategy::bucketed, req));
  EXPECT_EQ(req.kv_mode, kv_strategy::paged);
  EXPECT_TRUE(req.no_batch);
  EXPECT_FALSE(read_kv_headers("bucketed", "0", kv_strategy::bucketed, req));
  EXPECT_EQ(req.kv_mode, kv_strategy::bucketed);
  EXPECT_FALSE(req.no_batch);
  // Refused, each with a 400 naming the header.
  for (auto [mode, no_batch, configured] :
       {std::tuple{"bucketed", "", kv_strategy::paged}, std::tuple{"pooled", "", kv_strategy::bucketed},
        std::tuple{"", "yes", kv_strategy::paged}}) {
    generate_request r;
    auto err = read_kv_headers(mode, no_batch, configured, r);
    ASSERT_TRUE(err) << mode << " " << no_batch;
    EXPECT_EQ(err->status, 400);
    EXPECT_NE(err->message.find(*mode ? "X-KV-Cache-Mode" : "X-No-Batch"), std::string::npos)
      << err->message;
  }
}

TEST(OpenaiRequest, KvStrategyHeaderSaysWhatTheOverflowSupervisionDid) {
  // Other element types: the server's strategy as it is.
  EXPECT_EQ(kv_strategy_header("paged;page_size=16;dtype=bf16", ""),
            "paged;page_size=16;dtype=bf16");
  EXPECT_EQ(kv_strategy_header("bucketed;page_size=16;dtype=fp8", "rematerialized"),
            "bucketed;page_size=16;dtype=fp8");
  // fp8_e5m2: the request's own element type and what happened to it.
  const std::string e5m2 = "paged;page_size=16;dtype=fp8_e5m2";
  EXPECT_EQ(kv_strategy_header(e5m2, ""), e5m2 + ";kv=fp8_e5m2");
  EXPECT_EQ(kv_strategy_header(e5m2, "rematerialized"), e5m2 + ";kv=bf16;kv_overflow=rematerialized");
  EXPECT_EQ(kv_strategy_header(e5m2, "cooldown"), e5m2 + ";kv=bf16;kv_overflow=cooldown");
  EXPECT_EQ(kv_strategy_header(e5m2, "saturated"), e5m2 + ";kv=fp8_e5m2;kv_overflow=saturated");
}

TEST(OpenaiRequest, DefaultMaxTokens) {
  // Chat: 0, the engine's "up to the end of the context" (OpenAI's default
  // for chat); completions: 16, OpenAI's default there.
  auto c = chat({});
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->request.params.max_tokens, 0);
  auto p = completion({});
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->request.params.max_tokens, 16);
}

TEST(OpenaiRequest, IntegralFloatsAreIntegers) {
  auto r = chat({{"max_tokens", 12.0}, {"seed", -1}});
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->request.params.max_tokens, 12);
  EXPECT_EQ(*r->request.params.seed, ~uint64_t{0});
  expect_400(chat({{"max_tokens", 12.5}}), "max_tokens");
}

TEST(OpenaiRequest, PromptShapes) {
  auto s = completion({{"prompt", "once upon"}});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->request.prompt, "once upon");
  EXPECT_TRUE(s->request.prompt_ids.empty());
  EXPECT_FALSE(s->request.chat);

  auto ids = completion({{"prompt", {1, 2, 3}}});
  ASSERT_TRUE(ids.has_value());
  EXPECT_EQ(ids->request.prompt_ids, (std::vector<int32_t>{1, 2, 3}));

  auto one = completion({{"prompt", {"only"}}});
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->request.prompt, "only");

  auto nested = completion({{"prompt", {{5, 6}}}});
  ASSERT_TRUE(nested.has_value());
  EXPECT_EQ(nested->request.prompt_ids, (std::vector<int32_t>{5, 6}));
}

TEST(OpenaiRequest, StopAsStringAndEmptyStringsDropped) {
  auto r = completion({{"stop", "###"}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->request.stop, (std::vector<std::string>{"###"}));
  auto e = completion({{"stop", {"", "x"}}});
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->request.stop, (std::vector<std::string>{"x"}));
}

TEST(OpenaiRequest, VllmExtensions) {
  auto r = completion({{"ignore_eos", true},
                       {"stop_token_ids", {7, 8}},
                       {"skip_special_tokens", false},
                       {"top_k", -1}});
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_TRUE(r->request.params.ignore_eos);
  EXPECT_EQ(r->request.params.stop_token_ids, (std::vector<int32_t>{7, 8}));
  EXPECT_FALSE(r->request.skip_special_tokens);
  EXPECT_EQ(r->request.params.top_k, -1);
}

TEST(OpenaiRequest, WebSocketSourceIgnoresStreamFields) {
  json body = {{"type", "chat"},
               {"id", "a"},
               {"messages", {{{"role", "user"}, {"content", "x"}}}},
               {"stream_options", {{"include_usage", true}}}};
  auto r = parse_openai_request(api_kind::chat, body, defaults(), request_source::websocket);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_FALSE(r->stream);
}

// -- errors ---------------------------------------------------------------------------

TEST(OpenaiRequestErrors, MalformedJson) {
  for (std::string body : {"", "{", "{\"a\":}", "[1,2", "nul", "{\"messages\": [}", "\xff\xfe"}) {
    auto r = parse_openai_body(api_kind::chat, body, defaults());
    ASSERT_FALSE(r.has_value()) << body;
    EXPECT_EQ(r.error().status, 400);
    EXPECT_EQ(r.error().code, "invalid_json") << body;
  }
}

TEST(OpenaiRequestErrors, BodyMustBeAnObject) {
  for (std::string body : {"[]", "1", "\"x\"", "null", "true"}) {
    auto r = parse_openai_body(api_kind::chat, body, defaults());
    ASSERT_FALSE(r.has_value()) << body;
    EXPECT_EQ(r.error().status, 400);
  }
}

TEST(OpenaiRequestErrors, DeepNestingIsRejectedWithoutRecursion) {
  std::string deep(100000, '[');
  auto r = parse_openai_body(api_kind::chat, deep, defaults());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, "invalid_json");
  // Brackets inside strings do not count.
  std::string in_string = "{\"messages\":[{\"role\":\"user\",\"content\":\"" +
                          std::string(1000, '[') + "\"}]}";
  EXPECT_TRUE(parse_openai_body(api_kind::chat, in_string, defaults()).has_value());
}

TEST(OpenaiRequestErrors, WrongTypes) {
  expect_400(chat({{"temperature", "hot"}}), "temperature");
  expect_400(chat({{"top_p", true}}), "top_p");
  expect_400(chat({{"max_tokens", "10"}}), "max_tokens");
  expect_400(chat({{"seed", 1.5}}), "seed");
  expect_400(chat({{"stream", "yes"}}), "stream");
  expect_400(chat({{"stop", 5}}), "stop");
  expect_400(chat({{"stop", {"a", 1}}}), "stop[1]");
  expect_400(chat({{"model", 3}}), "model");
  expect_400(chat({{"messages", "hi"}}), "messages");
  expect_400(chat({{"messages", {"hi"}}}), "messages[0]");
  expect_400(chat({{"messages", {{{"role", 1}, {"content", "x"}}}}}), "messages[0].role");
  expect_400(chat({{"messages", {{{"role", "user"}, {"content", 5}}}}}), "messages[0].content");
  expect_400(completion({{"prompt", 5}}), "prompt");
  expect_400(completion({{"prompt", {1, "a"}}}), "prompt[1]");
  expect_400(chat({{"stream", true}, {"stream_options", {{"include_usage", "yes"}}}}),
             "include_usage");
}

TEST(OpenaiRequestErrors, TypeErrorsSayInvalidType) {
  auto r = chat({{"temperature", "hot"}});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, "invalid_type");
}

TEST(OpenaiRequestErrors, MissingRequiredFields) {
  auto r = parse_openai_request(api_kind::chat, json::object(), defaults());
  expect_400(r, "messages");
  EXPECT_EQ(r.error().code, "missing_required_parameter");
  auto p = parse_openai_request(api_kind::completion, json{{"model", "m"}}, defaults());
  expect_400(p, "prompt");
  expect_400(chat({{"messages", json::array()}}), "messages");
  expect_400(chat({{"messages", {{{"content", "x"}}}}}), "messages[0].role");
  expect_400(chat({{"messages", {{{"role", "user"}}}}}), "messages[0].content");
}

TEST(OpenaiRequestErrors, Ranges) {
  // Bounds from the OpenAI API reference (vLLM's for its extensions).
  expect_400(chat({{"temperature", -0.1}}), "temperature");
  expect_400(chat({{"temperature", 2.01}}), "temperature");
  expect_400(chat({{"top_p", 0}}), "top_p");
  expect_400(chat({{"top_p", 1.5}}), "top_p");
  expect_400(chat({{"min_p", -0.1}}), "min_p");
  expect_400(chat({{"frequency_penalty", 2.5}}), "frequency_penalty");
  expect_400(chat({{"presence_penalty", -2.5}}), "presence_penalty");
  expect_400(chat({{"repetition_penalty", 0}}), "repetition_penalty");
  expect_400(chat({{"top_k", -2}}), "top_k");
  expect_400(chat({{"max_tokens", 0}}), "max_tokens");
  expect_400(chat({{"max_completion_tokens", -5}}), "max_completion_tokens");
  expect_400(chat({{"max_tokens", 1e12}}), "max_tokens");
  expect_400(chat({{"stop", {"a", "b", "c", "d", "e"}}}), "stop");
  expect_400(completion({{"prompt", {-1}}}), "prompt");
  expect_400(completion({{"prompt", {int64_t{1} << 40}}}), "prompt");
  expect_400(completion({{"prompt", json::array()}}), "prompt");
  // Out of double's range: rejected one way or the other.
  auto huge = parse_openai_body(
    api_kind::chat, R"({"messages":[{"role":"user","content":"x"}],"temperature":1e400})",
    defaults());
  ASSERT_FALSE(huge.has_value());
  EXPECT_EQ(huge.error().status, 400);
  // Edges are inside.
  EXPECT_TRUE(chat({{"temperature", 0}, {"top_p", 1}, {"frequency_penalty", -2}}).has_value());
  EXPECT_TRUE(chat({{"temperature", 2}, {"presence_penalty", 2}}).has_value());
}

TEST(OpenaiRequest, LogprobsBecomeTheNumberOfAlternatives) {
  // Chat: a flag plus top_logprobs; absent or false: none (-1).
  EXPECT_EQ(chat({})->request.params.logprobs, -1);
  EXPECT_EQ(chat({{"logprobs", false}})->request.params.logprobs, -1);
  EXPECT_EQ(chat({{"logprobs", true}})->request.params.logprobs, 0);
  EXPECT_EQ(chat({{"logprobs", true}, {"top_logprobs", 5}})->request.params.logprobs, 5);
  EXPECT_EQ(chat({{"logprobs", true}, {"top_logprobs", 20}})->request.params.logprobs, 20);
  EXPECT_EQ(chat({{"logprobs", false}, {"top_logprobs", 0}})->request.params.logprobs, -1);
  EXPECT_EQ(chat({{"logprobs", nullptr}, {"top_logprobs", nullptr}})->request.params.logprobs, -1);
  // Completions: the number itself (vLLM's limit of 20, above OpenAI's 5).
  EXPECT_EQ(completion({})->request.params.logprobs, -1);
  EXPECT_EQ(completion({{"logprobs", 0}})->request.params.logprobs, 0);
  EXPECT_EQ(completion({{"logprobs", 3}})->request.params.logprobs, 3);
  EXPECT_EQ(completion({{"logprobs", nullptr}})->request.params.logprobs, -1);
}

TEST(OpenaiRequestErrors, LogprobsOutOfRangeOrWithoutTheFlag) {
  expect_400(chat({{"top_logprobs", 3}}), "top_logprobs"); // logprobs not true
  expect_400(chat({{"logprobs", true}, {"top_logprobs", 21}}), "top_logprobs");
  expect_400(chat({{"logprobs", true}, {"top_logprobs", -1}}), "top_logprobs");
  expect_400(chat({{"logprobs", 1}}), "logprobs"); // not a boolean
  expect_400(completion({{"logprobs", 21}}), "logprobs");
  expect_400(completion({{"logprobs", true}}), "logprobs");
  expect_400(completion({{"logprobs", -1}}), "logprobs");
}

TEST(OpenaiRequestErrors, UnsupportedFeaturesNameTheField) {
  expect_400(chat({{"n", 2}}), "n");
  expect_400(chat({{"tools", {{{"type", "function"}}}}}), "tools");
  expect_400(chat({{"response_format", {{"type", "json_object"}}}}), "response_format");
  expect_400(chat({{"messages", {{{"role", "tool"}, {"content", "x"}}}}}), "messages[0].role");
  expect_400(chat({{"messages",
                    {{{"role", "user"},
                      {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}}}}),
             "messages[0].content[0].type");
  expect_400(completion({{"prompt", {"a", "b"}}}), "prompt");
  expect_400(completion({{"echo", true}}), "echo");
  expect_400(completion({{"best_of", 3}}), "best_of");
  expect_400(completion({{"suffix", "tail"}}), "suffix");
  // Fields that would change the answer if honoured are refused, not dropped.
  expect_400(chat({{"logit_bias", {{"50256", -100}}}}), "logit_bias");
  expect_400(completion({{"logit_bias", {{"13", 5}}}}), "logit_bias");
  expect_400(chat({{"logit_bias", {1, 2}}}), "logit_bias"); // not an object
  expect_400(completion({{"response_format", {{"type", "json_object"}}}}), "response_format");
  expect_400(chat({{"functions", {{{"name", "f"}}}}}), "functions");
  expect_400(chat({{"tool_choice", "required"}}), "tool_choice");
  expect_400(chat({{"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}}),
             "tool_choice");
  expect_400(chat({{"function_call", {{"name", "f"}}}}), "function_call");
  expect_400(chat({{"modalities", {"text", "audio"}}}), "modalities");
  expect_400(chat({{"audio", {{"voice", "alloy"}, {"format", "wav"}}}}), "audio");
  expect_400(chat({{"guided_choice", {"yes", "no"}}}), "guided_choice");
  expect_400(completion({{"guided_regex", "[0-9]+"}}), "guided_regex");
  expect_400(chat({{"structured_outputs", {{"json", {{"type", "object"}}}}}}),
             "structured_outputs");
  // The harmless spellings of the same fields are fine.
  EXPECT_TRUE(chat({{"n", 1}, {"logprobs", false}, {"tools", json::array()}}).has_value());
  EXPECT_TRUE(chat({{"response_format", {{"type", "text"}}}}).has_value());
  EXPECT_TRUE(completion({{"echo", false}, {"best_of", 1}, {"suffix", ""}}).has_value());
  EXPECT_TRUE(chat({{"logit_bias", json::object()},
                    {"functions", json::array()},
                    {"tool_choice", "none"},
                    {"function_call", "auto"},
                    {"modalities", {"text"}},
                    {"audio", nullptr},
                    {"guided_json", nullptr}})
                .has_value());
  EXPECT_TRUE(completion({{"logit_bias", nullptr}, {"response_format", {{"type", "text"}}}})
                .has_value());
}

TEST(OpenaiRequestErrors, StreamOptionsNeedStream) {
  expect_400(chat({{"stream_options", {{"include_usage", true}}}}), "stream_options");
  expect_400(chat({{"stream", false}, {"stream_options", {{"include_usage", true}}}}),
             "stream_options");
}

TEST(OpenaiRequestErrors, UnknownModelIs404) {
  auto r = chat({{"model", "gpt-4"}});
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().status, 404);
  EXPECT_EQ(r.error().code, "model_not_found");
  EXPECT_NE(r.error().message.find("gpt-4"), std::string::npos);
}

TEST(OpenaiRequestErrors, ErrorBodyHasTheOpenAiShape) {
  auto r = chat({{"temperature", 9}});
  ASSERT_FALSE(r.has_value());
  auto body = json::parse(r.error().body());
  ASSERT_TRUE(body.contains("error"));
  const auto& e = body["error"];
  EXPECT_TRUE(e["message"].is_string());
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_EQ(e["param"], "temperature");
  EXPECT_TRUE(e["code"].is_string());
  // Without a param, "param" is null (not "").
  auto bad = parse_openai_body(api_kind::chat, "{", defaults());
  EXPECT_TRUE(json::parse(bad.error().body())["error"]["param"].is_null());
}

TEST(OpenaiRequestErrors, EngineErrorsMapThroughHttpStatus) {
  for (auto code : {request_errc::invalid_request, request_errc::context_length,
                    request_errc::queue_full, request_errc::engine_failure,
                    request_errc::timeout, request_errc::unavailable}) {
    auto e = api_error::from(generation_error{"id", code, "why", "messages"});
    EXPECT_EQ(e.status, http_status(code));
    EXPECT_EQ(e.type, error_type(code));
    EXPECT_EQ(e.param, "messages");
    EXPECT_EQ(e.message, "why");
  }
  EXPECT_EQ(api_error::from(generation_error{"id", request_errc::context_length, "x", ""}).code,
            "context_length_exceeded");
}

} // namespace
} // namespace metronome::net
