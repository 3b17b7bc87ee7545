#pragma once
// Parsing OpenAI request bodies (POST /v1/chat/completions, /v1/completions
// and the WebSocket `chat` message) into the engine's generate_request.
//
// Design note. The edge checks everything it can without the model: JSON
// well-formedness (with a nesting limit, so no input can exhaust the stack),
// the type of every known field, the ranges of the sampling parameters as
// OpenAI documents them, and the features Metronome does not implement
// (n > 1, echo, best_of, tools, response formats), which get a 400
// naming the field instead of being silently ignored. Fields nobody knows are
// ignored. `null` counts as absent for every optional field. What needs the
// model (chat template, tokenization, context length, vocabulary range of
// token ids, queue capacity) is the engine's job; it answers with
// generation_error. Pure functions: no I/O, no CAF, any thread.

#include <chrono>
#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/messages.hpp"
#include "net/api_error.hpp"

namespace metronome::net {

/// Which OpenAI endpoint a body belongs to.
enum class api_kind : uint8_t {
  /// /v1/chat/completions (and the WebSocket `chat` message).
  chat,
  /// /v1/completions.
  completion,
};

/// Where the body came from: the WebSocket protocol has no `stream` flag.
enum class request_source : uint8_t { http, websocket };

/// Server facts the parser needs.
struct parse_defaults {
  /// The served model; a request naming another model gets 404.
  std::string model_name;
  /// generate_request::timeout of every request (0: the engine's default).
  std::chrono::milliseconds timeout{0};
};

/// A parsed request: what the engine gets and what the edge needs to format
/// the answer.
struct openai_request {
  api_kind kind = api_kind::chat;
  generate_request request;
  /// The model name to echo in responses.
  std::string model;
  bool stream = false;
  /// stream_options.include_usage.
  bool include_usage = false;
};

/// Deepest nesting of arrays/objects a body may have.
inline constexpr int max_json_depth = 64;

/// Parses `text` as one JSON value; 400 (code "invalid_json") when it is not
/// JSON or nests deeper than `max_depth`. Never throws.
std::expected<nlohmann::json, api_error> parse_json(std::string_view text,
                                                    int max_depth = max_json_depth);

/// Validates a request object and builds the engine's request. The caller
/// fills request.request_id. A chat request without max_tokens gets
/// params.max_tokens = 0, which the engine reads as "up to the end of the
/// context" (OpenAI's default); a completion request gets 16 (OpenAI's
/// default for /v1/completions). Never throws.
std::expected<openai_request, api_error>
parse_openai_request(api_kind kind, const nlohmann::json& body, const parse_defaults& defaults,
                     request_source source = request_source::http);

/// parse_json() then parse_openai_request(): an HTTP request body.
std::expected<openai_request, api_error>
parse_openai_body(api_kind kind, std::string_view body, const parse_defaults& defaults);

/// A POST /tokenize body (vLLM's shape): a text prompt or a chat
/// conversation, never both.
struct tokenize_request {
  /// `messages` was given (rendered with the chat template); else `prompt`.
  bool chat = false;
  std::string prompt;
  std::vector<chat_turn> messages;
  /// Add what the tokenizer's post-processor adds (a BOS token, for most
  /// models). Default, as vLLM's: true for a prompt, false for messages,
  /// whose chat template writes its own.
  bool add_special_tokens = true;
  /// messages: end with the assistant's turn header (default true).
  bool add_generation_prompt = true;
};

/// A POST /detokenize body: {"tokens": [ids]}. The ids are non-negative;
/// their range is the tokenizer's to check.
struct detokenize_request {
  std::vector<int32_t> tokens;
};

/// Parses a POST /tokenize body: `prompt` (a string) or `messages` (as in
/// a chat request), optional `add_special_tokens`, `add_generation_prompt`
/// and `model` (which must name the served model: 404 otherwise). A 400
/// naming the field for anything else wrong. Never throws.
std::expected<tokenize_request, api_error> parse_tokenize_body(std::string_view body,
                                                               const parse_defaults& defaults);

/// Parses a POST /detokenize body: `tokens` (an array of integer ids),
/// optional `model`. Never throws.
std::expected<detokenize_request, api_error>
parse_detokenize_body(std::string_view body, const parse_defaults& defaults);

/// The request headers X-KV-Cache-Mode ("paged", or "bucketed" where the
/// server's strategy is bucketed) and X-No-Batch ("true"/"1" or
/// "false"/"0"), empty when absent, into `req`; a 400 for any other value.
/// On the io thread, after the body is parsed.
std::optional<api_error> read_kv_headers(std::string_view mode, std::string_view no_batch,
                                        kv_strategy configured, generate_request& req);

/// The response header X-KV-Cache-Strategy of a request: `strategy` (the
/// server's, "paged;page_size=16;dtype=fp8_e5m2", with the client's mode),
/// and where the cache is fp8_e5m2 the KV element type the request's keys
/// and values were written in, with what the overflow supervision did
/// (`kv_overflow`, text_delta::kv_overflow): ";kv=fp8_e5m2" (nothing),
/// ";kv=fp8_e5m2;kv_overflow=saturated" (overflowed past the budget, kept),
/// ";kv=bf16;kv_overflow=rematerialized" (overflowed, recomputed in bf16),
/// ";kv=bf16;kv_overflow=cooldown" (admitted during a cool-down). Other
/// dtypes: `strategy` unchanged. docs/protocol.md. Any thread.
std::string kv_strategy_header(const std::string& strategy, std::string_view kv_overflow);

} // namespace metronome::net
