#pragma once
// Who may use the server (docs/reliability.md, "Security"): the Host header,
// the browser's Origin, the API key and the media type of JSON bodies, all
// judged from a request's header alone, before its body is read, so a
// stranger cannot make the server read a megabyte first.
//
// Design note on the order of the checks. /health answers everyone (load
// balancers' probes carry no key and may name any host). Then:
//  1. Host (400 when an HTTP/1.1 request has none, 421 for a name the server
//     does not answer to): a page of evil.example whose name was rebound to
//     this server's address sends `Host: evil.example`. This comes first
//     because the Origin check below trusts Host to say what "same origin" is.
//  2. Origin (403): any page can make the browser send requests; only pages
//     of this server itself and of `allowed_origins` may. Requests without
//     Origin come from non-browser clients and pass.
//  3. The API key (401): `Authorization: Bearer KEY`; on the WebSocket route
//     also the subprotocol `bearer.KEY` or `?api_key=KEY`, since browsers
//     cannot set headers on a WebSocket. Compared in constant time. The
//     chat page (GET /) needs none: a navigation cannot carry one, and the
//     page asks for it and sends it with the requests it makes.
//  4. Content-Type (415) on the POST routes: only application/json, which a
//     "simple" cross-site request (sent by browsers without a preflight)
//     cannot carry.
// A CORS preflight (OPTIONS with Origin and Access-Control-Request-Method)
// from an allowed origin passes 3 and 4: browsers send it without the key.

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/beast/http.hpp>

#include "net/api_error.hpp"
#include "net/server_options.hpp"

namespace metronome::net {

class access_control {
public:
  using header_type = boost::beast::http::request_header<>;
  using response_type = boost::beast::http::response<boost::beast::http::string_body>;

  /// From the server's options; `tls` tells the scheme of the server's own
  /// origin (https or http).
  access_control(const server_options& opts, bool tls);

  /// The answer for a request that may not go on to routing, or nullopt.
  /// Any thread (const, no shared state).
  std::optional<api_error> check(const header_type& req) const;

  /// `req` is a CORS preflight from an allowed origin (check() let it
  /// through); preflight_response() answers it.
  bool is_preflight(const header_type& req) const;

  /// 204 with the Access-Control-Allow-* headers for a preflight.
  response_type preflight_response(const header_type& req) const;

  /// Access-Control-Allow-Origin for the response to `req`: its Origin when
  /// that is an allowed other origin, else empty (same-origin and
  /// non-browser requests need none).
  std::string allow_origin(const header_type& req) const;

  /// The subprotocol a /v1/ws upgrade is answered with: the first one the
  /// client offered that is not a key (browsers fail a handshake that names
  /// none of those offered), else the key's own; empty when none offered.
  std::string ws_subprotocol(const header_type& req) const;

  /// A key is needed (some key is configured).
  bool requires_key() const {
    return !keys_.empty();
  }

  /// `presented` is one of the keys. Takes the same time whichever key
  /// matches or none: every key's SHA-256 digest is compared in full.
  bool key_matches(std::string_view presented) const;

  /// Logs what is enforced, once at start; warns when `bound_loopback` is
  /// false and no key is required. Called by http_server::start.
  void log_posture(std::string_view where, bool bound_loopback) const;

private:
  using digest = std::array<unsigned char, 32>;

  /// The Host check; the problem, or nullopt.
  std::optional<api_error> check_host(const header_type& req) const;
  /// The Origin check (Host already passed).
  std::optional<api_error> check_origin(const header_type& req) const;
  /// The key the request presents (empty: none).
  std::string presented_key(const header_type& req, bool websocket) const;
  bool origin_allowed(std::string_view origin, std::string_view host) const;
  bool host_allowed(std::string_view name) const;

  std::vector<digest> keys_;
  bool metrics_without_key_;
  bool any_origin_ = false;
  std::vector<std::string> origins_;
  bool any_host_ = false;
  std::vector<std::string> hosts_;
  /// opts.host, lower case: the bound address or name.
  std::string bound_;
  /// bound_ is 0.0.0.0 or :: (any address literal is this server's).
  bool bound_wildcard_ = false;
  bool tls_;
};

/// Keys from a file: one per line, surrounding blanks trimmed, blank lines
/// and lines starting with '#' skipped. Throws std::runtime_error naming the
/// file when it cannot be read or holds no key. Called at start.
std::vector<std::string> read_api_keys_file(const std::string& path);

} // namespace metronome::net
