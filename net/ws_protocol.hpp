#pragma once
// The WebSocket protocol at /v1/ws (docs/protocol.md): client messages
// parsed into native types, server events formatted as JSON text. Pure
// functions, any thread; ws_session does the I/O.
//
// Client -> server:  {"type": "chat", "id", "messages", <sampling params>}
//                    {"type": "cancel", "id"}
//                    {"type": "ping"[, "id"]}
// Server -> client:  {"type": "delta", "id", "text"[, "logprobs"]}
//                    {"type": "done", "id", "finish_reason", "usage", "timings"}
//                    {"type": "error"[, "id"], "error": {message, type, param, code}}
//                    {"type": "pong"[, "id"]}

#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "actors/messages.hpp"
#include "net/api_error.hpp"
#include "net/openai_request.hpp"

namespace metronome::net {

/// Longest client-chosen request id, in bytes.
inline constexpr size_t max_ws_id_bytes = 256;

/// {"type": "chat"}: start a request.
struct ws_chat {
  std::string id;
  openai_request request;
};

/// {"type": "cancel"}: stop a request.
struct ws_cancel {
  std::string id;
};

/// {"type": "ping"}.
struct ws_ping {
  std::optional<std::string> id;
};

/// A message the server answers with an error event; `id` when known.
struct ws_bad {
  std::optional<std::string> id;
  api_error error;
};

using ws_message = std::variant<ws_chat, ws_cancel, ws_ping, ws_bad>;

/// Parses one text message. Never throws.
ws_message parse_ws_message(std::string_view text, const parse_defaults& defaults);

// -- events -------------------------------------------------------------------------

/// `logprobs` (the request asked for them): the chat form of OpenAI's
/// logprobs object for the tokens this delta releases.
std::string ws_delta_event(const std::string& id, std::string_view text,
                           const std::vector<position_logprobs>* logprobs = nullptr);

/// The end of a request, with usage and timings in milliseconds.
std::string ws_done_event(const std::string& id, const generation_done& done);

/// The end of a request the client cancelled.
std::string ws_cancelled_event(const std::string& id);

std::string ws_error_event(const std::optional<std::string>& id, const api_error& error);

std::string ws_pong_event(const std::optional<std::string>& id);

} // namespace metronome::net
