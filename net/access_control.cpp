#include "net/access_control.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <stdexcept>

#include <boost/asio/ip/address.hpp>
#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include "net/http_routes.hpp"
#include "net/log_text.hpp"

namespace metronome::net {

namespace http = boost::beast::http;

namespace {

/// The subprotocol prefix that carries a key on /v1/ws.
constexpr std::string_view key_subprotocol = "bearer.";

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

/// The items of a comma-separated header value, trimmed, empty ones dropped.
std::vector<std::string_view> comma_items(std::string_view value) {
  std::vector<std::string_view> out;
  while (!value.empty()) {
    auto comma = value.find(',');
    auto item = trim(value.substr(0, comma));
    if (!item.empty())
      out.push_back(item);
    value.remove_prefix(comma == std::string_view::npos ? value.size() : comma + 1);
  }
  return out;
}

/// The host name or address of a Host header value, lower case, without
/// port, brackets or a final dot; nullopt when it is malformed.
std::optional<std::string> host_name(std::string_view value) {
  std::string_view name;
  if (value.starts_with('[')) {
    auto close = value.find(']');
    if (close == std::string_view::npos)
      return std::nullopt;
    name = value.substr(1, close - 1);
    value.remove_prefix(close + 1);
  } else {
    auto colon = value.find(':');
    name = value.substr(0, colon);
    value.remove_prefix(colon == std::string_view::npos ? value.size() : colon);
  }
  if (!value.empty()
      && (value.front() != ':' || value.substr(1).find_first_not_of("0123456789")
                                    != std::string_view::npos))
    return std::nullopt;
  if (name.ends_with('.'))
    name.remove_suffix(1);
  if (name.empty() || name.size() > 253)
    return std::nullopt;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.' && c != ':'
        && c != '_')
      return std::nullopt;
  return lower(name);
}

/// An origin ("scheme://host[:port]") in lower case without the scheme's
/// default port, so equal origins compare equal as strings.
std::string normalize_origin(std::string_view origin) {
  auto out = lower(origin);
  if (out.starts_with("http://") && out.ends_with(":80"))
    out.resize(out.size() - 3);
  else if (out.starts_with("https://") && out.ends_with(":443"))
    out.resize(out.size() - 4);
  return out;
}

std::optional<boost::asio::ip::address> parse_address(std::string_view s) {
  boost::system::error_code ec;
  auto a = boost::asio::ip::make_address(std::string(s), ec);
  if (ec)
    return std::nullopt;
  return a;
}

api_error refusal(int status, std::string message, std::string code) {
  return {status, std::move(message), "invalid_request_error", "", std::move(code)};
}

} // namespace

// -- construction -------------------------------------------------------------------

access_control::access_control(const server_options& opts, bool tls)
  : metrics_without_key_(opts.metrics_without_key), bound_(lower(opts.host)), tls_(tls) {
  for (const auto& key : opts.api_keys) {
    digest d{};
    unsigned int n = 0;
    EVP_Digest(key.data(), key.size(), d.data(), &n, EVP_sha256(), nullptr);
    if (std::find(keys_.begin(), keys_.end(), d) == keys_.end())
      keys_.push_back(d);
  }
  for (const auto& o : opts.allowed_origins) {
    if (o == "*")
      any_origin_ = true;
    else
      origins_.push_back(normalize_origin(o));
  }
  for (const auto& h : opts.allowed_hosts) {
    if (h == "*")
      any_host_ = true;
    else
      hosts_.push_back(lower(h));
  }
  if (auto a = parse_address(bound_))
    bound_wildcard_ = a->is_unspecified();
}

// -- the checks ---------------------------------------------------------------------

std::optional<api_error> access_control::check(const header_type& req) const {
  auto target = std::string_view(req.target());
  auto r = route_of(target.substr(0, target.find('?')));
  if (r == route::health)
    return std::nullopt;
  if (auto problem = check_host(req))
    return problem;
  if (auto problem = check_origin(req))
    return problem;
  if (is_preflight(req))
    return std::nullopt;
  // The chat page is static and holds no secret; it asks for the key and
  // sends it with the requests it makes.
  if (requires_key() && r != route::page && !(r == route::metrics && metrics_without_key_)) {
    auto key = presented_key(req, r == route::websocket);
    if (key.empty())
      return refusal(401,
                     r == route::websocket
                       ? "missing API key: send Authorization: Bearer KEY, the subprotocol "
                         "bearer.KEY or ?api_key=KEY"
                       : "missing API key: send Authorization: Bearer KEY",
                     "missing_api_key");
    if (!key_matches(key))
      return refusal(401, "incorrect API key provided", "invalid_api_key");
  }
  if (takes_json_body(r) && req.method() == http::verb::post) {
    std::string_view type = req[http::field::content_type];
    auto media = lower(trim(type.substr(0, type.find(';'))));
    if (media != "application/json")
      return refusal(415,
                     type.empty() ? "Content-Type must be application/json, got none"
                                  : fmt::format("Content-Type must be application/json, got {}",
                                                log_text(type, 100)),
                     "unsupported_media_type");
  }
  return std::nullopt;
}

std::optional<api_error> access_control::check_host(const header_type& req) const {
  auto n = req.count(http::field::host);
  if (n == 0) {
    // HTTP/1.0 clients may omit it; browsers never do, so no rebinding risk.
    if (req.version() < 11)
      return std::nullopt;
    return refusal(400, "missing Host header", "missing_host");
  }
  if (n > 1)
    return refusal(400, "more than one Host header", "invalid_host");
  std::string_view value = req[http::field::host];
  auto name = host_name(value);
  if (!name)
    return refusal(400, fmt::format("malformed Host header {}", log_text(value, 100)),
                   "invalid_host");
  if (!host_allowed(*name))
    return refusal(421,
                   fmt::format("this server does not answer to the host name {} (add it to "
                               "server.allowed_hosts)",
                               log_text(*name, 100)),
                   "host_not_allowed");
  return std::nullopt;
}

bool access_control::host_allowed(std::string_view name) const {
  if (any_host_ || name == "localhost" || name.ends_with(".localhost") || name == bound_)
    return true;
  if (auto a = parse_address(name)) {
    // An address cannot be rebound to another server; this one listens on
    // loopback, on its bound address, or on all of the machine's.
    if (a->is_loopback() || bound_wildcard_)
      return true;
    if (auto b = parse_address(bound_); b && *a == *b)
      return true;
  }
  for (const auto& h : hosts_) {
    if (h == name)
      return true;
    if (h.starts_with('.') && (name == std::string_view(h).substr(1) || name.ends_with(h)))
      return true;
  }
  return false;
}

std::optional<api_error> access_control::check_origin(const header_type& req) const {
  auto it = req.find(http::field::origin);
  if (it == req.end())
    return std::nullopt;
  std::string_view origin = it->value();
  if (!origin_allowed(origin, req[http::field::host]))
    return refusal(403,
                   fmt::format("origin {} is not allowed (add it to server.allowed_origins)",
                               log_text(origin, 100)),
                   "origin_not_allowed");
  return std::nullopt;
}

bool access_control::origin_allowed(std::string_view origin, std::string_view host) const {
  if (any_origin_)
    return true;
  auto o = normalize_origin(origin);
  // The server's own origin: its scheme and the Host the browser sent (which
  // check_host() has vetted).
  if (!host.empty() && o == normalize_origin(fmt::format("{}://{}", tls_ ? "https" : "http", host)))
    return true;
  return std::find(origins_.begin(), origins_.end(), o) != origins_.end();
}

std::string access_control::presented_key(const header_type& req, bool websocket) const {
  auto auth = trim(std::string_view(req[http::field::authorization]));
  if (auth.size() > 7 && lower(auth.substr(0, 7)) == "bearer ")
    return std::string(trim(auth.substr(7)));
  if (!websocket)
    return {};
  for (auto p : comma_items(req[http::field::sec_websocket_protocol]))
    if (p.starts_with(key_subprotocol) && p.size() > key_subprotocol.size())
      return std::string(p.substr(key_subprotocol.size()));
  auto target = std::string_view(req.target());
  auto q = target.find('?');
  if (q == std::string_view::npos)
    return {};
  auto query = target.substr(q + 1);
  while (!query.empty()) {
    auto amp = query.find('&');
    auto param = query.substr(0, amp);
    if (param.starts_with("api_key="))
      return percent_decode(param.substr(8));
    query.remove_prefix(amp == std::string_view::npos ? query.size() : amp + 1);
  }
  return {};
}

bool access_control::key_matches(std::string_view presented) const {
  digest d{};
  unsigned int n = 0;
  EVP_Digest(presented.data(), presented.size(), d.data(), &n, EVP_sha256(), nullptr);
  // No early exit: the time does not depend on which key matches.
  int matches = 0;
  for (const auto& k : keys_)
    matches |= CRYPTO_memcmp(k.data(), d.data(), d.size()) == 0 ? 1 : 0;
  return matches != 0;
}

// -- CORS and WebSocket answers -------------------------------------------------------

bool access_control::is_preflight(const header_type& req) const {
  return req.method() == http::verb::options && req.count(http::field::origin) > 0
         && req.count(http::field::access_control_request_method) > 0;
}

access_control::response_type access_control::preflight_response(const header_type& req) const {
  response_type res{http::status::no_content, req.version()};
  res.set(http::field::access_control_allow_origin, req[http::field::origin]);
  res.set(http::field::vary, "Origin");
  res.set(http::field::access_control_allow_methods, "GET, POST, OPTIONS");
  std::string_view asked = req[http::field::access_control_request_headers];
  res.set(http::field::access_control_allow_headers,
          asked.empty() ? std::string_view("authorization, content-type") : asked);
  res.set(http::field::access_control_max_age, "600");
  return res;
}

std::string access_control::allow_origin(const header_type& req) const {
  auto it = req.find(http::field::origin);
  if (it == req.end())
    return {};
  auto o = normalize_origin(it->value());
  auto own = normalize_origin(fmt::format("{}://{}", tls_ ? "https" : "http",
                                          std::string_view(req[http::field::host])));
  if (o == own || !origin_allowed(it->value(), req[http::field::host]))
    return {};
  return std::string(it->value());
}

std::string access_control::ws_subprotocol(const header_type& req) const {
  auto offered = comma_items(req[http::field::sec_websocket_protocol]);
  for (auto p : offered)
    if (!p.starts_with(key_subprotocol))
      return std::string(p);
  return offered.empty() ? std::string() : std::string(offered.front());
}

// -- start-up -----------------------------------------------------------------------

void access_control::log_posture(std::string_view where, bool bound_loopback) const {
  if (requires_key())
    spdlog::info("access: {} API key{} required on every route but /health{}", keys_.size(),
                 keys_.size() == 1 ? "" : "s",
                 metrics_without_key_ ? " and /metrics" : "");
  else if (!bound_loopback)
    spdlog::warn("*** SECURITY: listening on {} (not loopback) WITHOUT an API key: anyone who "
                 "can reach this port can use the model. Set --api-key, METRONOME_API_KEY, "
                 "server.api_keys or server.api_keys_file. ***",
                 where);
  else
    spdlog::debug("access: no API key (listening on loopback only)");
  const bool defaults = !any_origin_ && origins_.empty() && !any_host_ && hosts_.empty() && !tls_;
  spdlog::log(defaults ? spdlog::level::debug : spdlog::level::info,
              "access: browser origins: this server's own{}; extra host names: {}; TLS {}",
              any_origin_ ? " and any other (allowed_origins: *)"
                          : origins_.empty() ? " only"
                                             : fmt::format(" and {}", fmt::join(origins_, ", ")),
              any_host_ ? "any (allowed_hosts: *)"
                        : hosts_.empty() ? "none" : fmt::format("{}", fmt::join(hosts_, ", ")),
              tls_ ? "on" : "off");
}

std::vector<std::string> read_api_keys_file(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw std::runtime_error(
      fmt::format("cannot read the API key file {} (server.api_keys_file)", path));
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    auto key = trim(line);
    if (key.empty() || key.starts_with('#'))
      continue;
    keys.emplace_back(key);
  }
  if (keys.empty())
    throw std::runtime_error(
      fmt::format("the API key file {} (server.api_keys_file) holds no key", path));
  return keys;
}

} // namespace metronome::net
