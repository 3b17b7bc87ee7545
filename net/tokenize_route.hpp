#pragma once
// The answers of POST /tokenize and POST /detokenize (vLLM's routes): the
// token ids the model would see for a prompt or a conversation, and the
// text of token ids. Pure functions over the engine's tokenizer and chat
// template (both immutable and thread-safe); called on a connection's
// strand, after parse_tokenize_body / parse_detokenize_body.

#include <cstdint>
#include <expected>

#include <nlohmann/json.hpp>

#include "net/api_error.hpp"
#include "net/openai_request.hpp"

namespace metronome {
class tokenizer;
class chat_template;
} // namespace metronome

namespace metronome::net {

/// {"tokens": [...], "count": n, "max_model_len": m} for `req`. A prompt is
/// encoded as /v1/completions encodes it (special-token text in it stays
/// plain text); messages as /v1/chat/completions renders and encodes them,
/// with the post-processor's tokens around them when add_special_tokens.
/// A 400 (param "messages") for a conversation the template refuses, or
/// when there is no chat template. Never throws.
std::expected<nlohmann::json, api_error> tokenize_answer(const tokenize_request& req,
                                                         const tokenizer& tok,
                                                         const chat_template* tmpl,
                                                         int32_t max_model_len);

/// {"prompt": text} for `req`, special tokens included (the inverse of
/// tokenize). A 400 naming the first id outside [0, vocab size) as
/// tokens[i]. Never throws.
std::expected<nlohmann::json, api_error> detokenize_answer(const detokenize_request& req,
                                                           const tokenizer& tok);

} // namespace metronome::net
