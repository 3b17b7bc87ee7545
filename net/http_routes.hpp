#pragma once
// The server's routes, and the answers of those that need no engine round
// trip: GET /v1/models, /v1/models/{model}, /health, /metrics, /version,
// and the error answers of the router itself (404, 405, 426). Called on a
// connection's strand; reads only atomics and immutable state of the engine.

#include <string>
#include <string_view>

#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "net/server_context.hpp"

namespace metronome::net {

/// What a request's path names.
enum class route {
  /// GET /: the chat page (net/chat_page.hpp).
  page,
  chat,
  completions,
  /// POST /tokenize, POST /detokenize (vLLM's; net/tokenize_route.hpp).
  tokenize,
  detokenize,
  models,
  model,
  health,
  metrics,
  /// GET /version: the build.
  version,
  websocket,
  unknown,
};

/// The route of a path (without its query string).
route route_of(std::string_view path);

/// The one method a route accepts (POST for generation and the tokenizer
/// routes, GET otherwise).
boost::beast::http::verb method_of(route r);

/// Longest X-Request-Id a client may send that the server uses.
inline constexpr size_t max_request_id_bytes = 128;

/// Whether a client's X-Request-Id is used as the request's id: 1 to
/// max_request_id_bytes visible ASCII characters (0x21-0x7E; no spaces or
/// control bytes), so it is safe in a header and a log line as it is.
bool valid_request_id(std::string_view id);

/// Percent-decodes a path segment ("%2F" -> "/"); invalid escapes stay.
std::string percent_decode(std::string_view s);

using info_response = boost::beast::http::response<boost::beast::http::string_body>;

/// Routes whose POST body is JSON (Content-Type checked by access_control).
bool takes_json_body(route r);

/// The body of GET /version: {"version", "cuda", "build_type", "compiler"}.
nlohmann::json version_body();

/// The answer of a GET route that needs no engine round trip (models, model,
/// health, metrics, version) for `path`. Keep-alive is left to the caller.
info_response answer_info_route(route r, std::string_view path, unsigned version,
                                const server_context& ctx);

/// 405 with Allow, for a route asked with the wrong method.
info_response method_not_allowed_response(route r, std::string_view method,
                                          std::string_view path, unsigned version);

/// 426 for a plain GET on the WebSocket route.
info_response upgrade_required_response(unsigned version);

} // namespace metronome::net
