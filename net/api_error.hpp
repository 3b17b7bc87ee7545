#pragma once
// An error the network edge answers with: an HTTP status and the OpenAI error
// body {"error": {"message", "type", "param", "code"}}. Built by the request
// parser (400s), the router (404, 405, 413) and from the engine's
// generation_error (its request_errc maps to the status through
// http_status()).

#include <string>

#include <nlohmann/json.hpp>

#include "actors/messages.hpp"

namespace metronome::net {

/// One error response. Empty `param` / `code` are written as JSON null.
struct api_error {
  int status = 400;
  std::string message;
  /// OpenAI's error type ("invalid_request_error", "not_found_error", ...).
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;

  /// {"message", "type", "param", "code"}: the inner object.
  nlohmann::json inner_json() const;

  /// {"error": {...}}: the HTTP body and the SSE error event.
  nlohmann::json to_json() const;

  /// to_json() serialised (invalid UTF-8 replaced, never throws).
  std::string body() const;

  // -- factories ----------------------------------------------------------------

  /// 400 invalid_request_error.
  static api_error bad_request(std::string message, std::string param = {},
                               std::string code = "invalid_value");

  /// 404 for a route or a model that does not exist.
  static api_error not_found(std::string message, std::string code = "not_found");

  /// 405; the router adds the Allow header.
  static api_error method_not_allowed(std::string_view method, std::string_view target);

  /// 413 for a body over `limit` bytes.
  static api_error payload_too_large(size_t limit);

  /// The engine's error, mapped by http_status() / error_type().
  static api_error from(const generation_error& err);

  /// 503 shutting_down: the server drains (a new request), or its drain
  /// timed out (a request still running). Answered with Retry-After.
  static api_error shutting_down(std::string message);

  /// 503 too_many_connections: a connection over server.max_connections.
  /// Answered with Retry-After.
  static api_error too_many_connections(size_t limit);

  /// The answer carries Retry-After: 429, and the 503s above (the client
  /// may try again, here or elsewhere; an engine failure is not that).
  bool retry_later() const;
};

/// The `code` string the edge reports for an engine error code.
std::string error_code_string(request_errc code);

/// JSON text of `j` on one line; invalid UTF-8 is replaced by U+FFFD instead
/// of throwing. Every JSON the edge writes goes through here.
std::string dump_json(const nlohmann::json& j);

} // namespace metronome::net
