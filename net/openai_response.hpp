#pragma once
// Formatting OpenAI responses: the JSON bodies of non-streaming answers, the
// chunks of streaming ones, Server-Sent Events framing and HTTP/1.1 chunked
// transfer framing. Pure functions of their arguments (the caller passes the
// clock's `created`), any thread.
//
// Streams follow the OpenAI API: a chat stream opens with a chunk whose
// delta carries the role, then one chunk per text delta, then a chunk with an
// empty delta and the finish_reason; with stream_options.include_usage every
// chunk carries "usage": null and a last chunk with "choices": [] carries the
// usage; `data: [DONE]` ends the stream.

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "actors/messages.hpp"
#include "net/openai_request.hpp"

namespace metronome::net {

/// What every chunk and body of one answer repeats.
struct response_meta {
  api_kind kind = api_kind::chat;
  /// "chatcmpl-..." or "cmpl-...".
  std::string id;
  std::string model;
  /// Unix seconds at the request's arrival.
  int64_t created = 0;
  /// Add "usage": null to content chunks and send the usage chunk.
  bool include_usage = false;
  /// The request asked for logprobs: choices carry a logprobs object.
  bool logprobs = false;
};

/// What a logprobs object of /v1/completions needs from the chunks before:
/// text_offset continues from the completion's text so far.
struct logprobs_cursor {
  /// Characters (code points) of the completion text before the next token.
  int64_t text_offset = 0;
};

/// A choice's "logprobs": chat {"content": [{token, logprob, bytes,
/// top_logprobs}], "refusal": null}; completions {tokens, token_logprobs,
/// top_logprobs, text_offset}. Log-probabilities that are not finite are
/// written as -9999.0 (as vLLM does: JSON has no infinity).
nlohmann::json logprobs_json(api_kind kind, const std::vector<position_logprobs>& positions,
                             logprobs_cursor& cursor);

/// {"prompt_tokens", "completion_tokens", "total_tokens"}.
nlohmann::json usage_json(const generation_done& done);

// -- non-streaming ----------------------------------------------------------------

/// The whole answer: "chat.completion" or "text_completion" with usage.
/// `logprobs`: every generated token's (meta.logprobs), else ignored.
nlohmann::json completion_body(const response_meta& meta, const std::string& text,
                               const generation_done& done,
                               const std::vector<position_logprobs>& logprobs = {});

// -- streaming --------------------------------------------------------------------

/// Chat only: the first chunk, delta {"role": "assistant", "content": ""}.
nlohmann::json role_chunk(const response_meta& meta);

/// A chunk carrying `text` (and, with meta.logprobs, the log-probabilities
/// of the tokens it releases; `cursor` is the stream's).
nlohmann::json delta_chunk(const response_meta& meta, std::string_view text,
                           const std::vector<position_logprobs>& logprobs = {},
                           logprobs_cursor* cursor = nullptr);

/// The chunk with an empty delta (chat) or empty text (completion) and the
/// finish_reason.
nlohmann::json finish_chunk(const response_meta& meta, finish_kind finish_reason);

/// The usage chunk: "choices": [] and the usage.
nlohmann::json usage_chunk(const response_meta& meta, const generation_done& done);

/// `data: <json>\n\n`.
std::string sse_event(const nlohmann::json& j);

/// The event that ends every stream.
inline constexpr std::string_view sse_done = "data: [DONE]\n\n";

/// One HTTP/1.1 chunk: hex size, CRLF, data, CRLF. Empty data gives "" (an
/// empty chunk would end the body).
std::string http_chunk(std::string_view data);

/// The chunk that ends a chunked body.
inline constexpr std::string_view http_last_chunk = "0\r\n\r\n";

// -- other routes -----------------------------------------------------------------

/// GET /v1/models. A non-empty `description` (the model folder's
/// metronome.json) is added to the model object as "description".
nlohmann::json models_body(const std::string& model, int64_t created, int32_t max_model_len,
                           const std::string& description = {});

/// GET /v1/models/{model}; `description` as in models_body().
nlohmann::json model_body(const std::string& model, int64_t created, int32_t max_model_len,
                          const std::string& description = {});

} // namespace metronome::net
