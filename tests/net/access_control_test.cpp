// Security by default (issue 39, item 4): the API key, the Content-Type of
// JSON routes, Origin and Host checks, log escaping and TLS. First the pure
// rules of access_control, then the server over loopback, also with the
// connection limit and the drain (/health stays open; refusals of both kinds
// carry OpenAI-style bodies; over TLS they go through the TLS stream) and
// TLS's read timeouts.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include <unistd.h>

#include <boost/asio/ssl.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "net/access_control.hpp"
#include "net/log_text.hpp"
#include "tests/net/server_fixture.hpp"

namespace metronome::test {
namespace {

using json = nlohmann::json;
using header = http::request_header<>;
namespace ssl = asio::ssl;
using namespace std::chrono_literals;

header make_header(http::verb method, std::string target,
                   std::vector<std::pair<http::field, std::string>> fields, unsigned version = 11) {
  header h;
  h.method(method);
  h.target(target);
  h.version(version);
  for (auto& [f, v] : fields)
    h.set(f, v);
  return h;
}

net::server_options keyed_options() {
  net::server_options o;
  o.host = "127.0.0.1";
  o.api_keys = {"sk-one", "sk-two"};
  return o;
}

std::optional<int> refused_status(const net::access_control& ac, const header& h) {
  auto e = ac.check(h);
  return e ? std::optional<int>(e->status) : std::nullopt;
}

// -- the rules, without a server ------------------------------------------------------------

TEST(access_control, keys_are_required_everywhere_but_health) {
  net::access_control ac{keyed_options(), false};
  const std::pair<http::field, std::string> host{http::field::host, "127.0.0.1:8080"};
  for (auto target : {"/v1/models", "/v1/models/x", "/metrics", "/nope", "/v1/ws"}) {
    EXPECT_EQ(refused_status(ac, make_header(http::verb::get, target, {host})), 401) << target;
    EXPECT_EQ(refused_status(ac, make_header(http::verb::get, target,
                                             {host, {http::field::authorization, "Bearer sk-x"}})),
              401)
      << target;
    for (auto good : {"Bearer sk-one", "bearer  sk-two ", "BEARER sk-one"})
      EXPECT_EQ(refused_status(ac, make_header(http::verb::get, target,
                                               {host, {http::field::authorization, good}})),
                std::nullopt)
        << target << " " << good;
  }
  EXPECT_EQ(refused_status(ac, make_header(http::verb::get, "/health", {})), std::nullopt);
  EXPECT_EQ(refused_status(ac, make_header(http::verb::get, "/health",
                                           {{http::field::host, "evil.example"},
                                            {http::field::origin, "http://evil.example"}})),
            std::nullopt);
  // The error names no key and says what to send.
  auto e = ac.check(make_header(http::verb::get, "/v1/models", {host}));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "missing_api_key");
  e = ac.check(make_header(http::verb::get, "/v1/models",
                           {host, {http::field::authorization, "Bearer sk-secret-guess"}}));
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "invalid_api_key");
  EXPECT_EQ(e->message.find("sk-secret-guess"), std::string::npos);
  // Basic and other schemes are not keys.
  EXPECT_EQ(refused_status(ac, make_header(http::verb::get, "/v1/models",
                                           {host, {http::field::authorization, "Basic sk-one"}})),
            401);
}

TEST(access_control, websocket_takes_the_key_as_subprotocol_or_query) {
  net::access_control ac{keyed_options(), false};
  const std::pair<http::field, std::string> host{http::field::host, "localhost"};
  auto proto = [&](std::string offered) {
    return make_header(http::verb::get, "/v1/ws", {host, {http::field::sec_websocket_protocol,
                                                          offered}});
  };
  EXPECT_EQ(refused_status(ac, proto("metronome, bearer.sk-two")), std::nullopt);
  EXPECT_EQ(refused_status(ac, proto("bearer.sk-one")), std::nullopt);
  EXPECT_EQ(refused_status(ac, proto("bearer.nope")), 401);
  EXPECT_EQ(ac.ws_subprotocol(proto("metronome, bearer.sk-two")), "metronome");
  EXPECT_EQ(ac.ws_subprotocol(proto("bearer.sk-two")), "bearer.sk-two");
  EXPECT_EQ(ac.ws_subprotocol(make_header(http::verb::get, "/v1/ws", {host})), "");
  EXPECT_EQ(refused_status(ac, make_header(http::verb::get, "/v1/ws?x=1&api_key=sk-%6Fne", {host})),
            std::nullopt);
  EXPECT_EQ(refused_status(ac, make_header(http::verb::get, "/v1/ws?api_key=sk-bad", {host})), 401);
  // Not on the HTTP routes: a key in a URL ends up in logs and histories.
  EXPECT_EQ(refused_status(ac, make_header(http::verb::get, "/v1/models?api_key=sk-one", {host})),
            401);
}

TEST(access_control, metrics_can_be_exempted) {
  auto o = keyed_options();
  o.metrics_without_key = true;
  net::access_control ac{o, false};
  EXPECT_EQ(refused_status(ac, make_header(http::verb::get, "/metrics",
                                           {{http::field::host, "127.0.0.1"}})),
            std::nullopt);
  EXPECT_EQ(refused_status(ac, make_header(http::verb::get, "/v1/models",
                                           {{http::field::host, "127.0.0.1"}})),
            401);
}

TEST(access_control, keys_compare_by_digest) {
  net::access_control ac{keyed_options(), false};
  EXPECT_TRUE(ac.key_matches("sk-one"));
  EXPECT_TRUE(ac.key_matches("sk-two"));
  EXPECT_FALSE(ac.key_matches("sk-on"));
  EXPECT_FALSE(ac.key_matches("sk-one "));
  EXPECT_FALSE(ac.key_matches(""));
  EXPECT_FALSE(ac.key_matches(std::string("sk-one\0", 7)));
  net::access_control open{net::server_options{}, false};
  EXPECT_FALSE(open.requires_key());
  EXPECT_FALSE(open.key_matches("sk-one"));
}

TEST(access_control, json_routes_need_application_json) {
  net::access_control ac{net::server_options{}, false};
  auto post = [&](std::string target, std::string type) {
    std::vector<std::pair<http::field, std::string>> f{{http::field::host, "localhost"}};
    if (!type.empty())
      f.emplace_back(http::field::content_type, type);
    return refused_status(ac, make_header(http::verb::post, target, f));
  };
  for (auto target : {"/v1/chat/completions", "/v1/completions"}) {
    EXPECT_EQ(post(target, "application/json"), std::nullopt);
    EXPECT_EQ(post(target, "Application/JSON; charset=utf-8"), std::nullopt);
    for (auto bad : {"", "text/plain", "application/x-www-form-urlencoded",
                     "multipart/form-data; boundary=x", "application/jsonx"})
      EXPECT_EQ(post(target, bad), 415) << target << " " << bad;
  }
  // GET routes and other methods are the router's business (405, 404).
  EXPECT_EQ(post("/v1/models", "text/plain"), std::nullopt);
  EXPECT_EQ(refused_status(ac, make_header(http::verb::get, "/v1/chat/completions",
                                           {{http::field::host, "localhost"}})),
            std::nullopt);
}

TEST(access_control, host_names) {
  auto o = net::server_options{};
  o.host = "127.0.0.1";
  o.allowed_hosts = {"llm.example.com", ".internal"};
  net::access_control ac{o, false};
  auto status = [&](std::string host) {
    return refused_status(ac, make_header(http::verb::get, "/v1/models",
                                          {{http::field::host, host}}));
  };
  for (auto good : {"127.0.0.1", "127.0.0.1:8080", "localhost", "LOCALHOST:1", "app.localhost",
                    "[::1]:8080", "[::1]", "localhost.", "llm.example.com", "a.internal:80",
                    "internal", "127.0.0.2"})
    EXPECT_EQ(status(good), std::nullopt) << good;
  for (auto bad : {"evil.example", "evil.example:8080", "llm.example.com.evil.example",
                   "xinternal", "10.0.0.1", "localhost.evil.example"})
    EXPECT_EQ(status(bad), 421) << bad;
  for (auto malformed : {"", "a b", "[::1", "host:port", "a/b", "::1" /* unbracketed */})
    EXPECT_EQ(status(malformed), 400) << malformed;
  // HTTP/1.1 needs one; HTTP/1.0 may go without.
  EXPECT_EQ(refused_status(ac, make_header(http::verb::get, "/v1/models", {})), 400);
  EXPECT_EQ(refused_status(ac, make_header(http::verb::get, "/v1/models", {}, 10)), std::nullopt);

  // Bound to every interface: any address literal is this server's, names
  // still are not.
  o.host = "0.0.0.0";
  o.allowed_hosts.clear();
  net::access_control any{o, false};
  EXPECT_EQ(refused_status(any, make_header(http::verb::get, "/", {{http::field::host,
                                                                     "10.0.0.1:8080"}})),
            std::nullopt);
  EXPECT_EQ(refused_status(any, make_header(http::verb::get, "/", {{http::field::host,
                                                                     "evil.example"}})),
            421);
  o.allowed_hosts = {"*"};
  net::access_control star{o, false};
  EXPECT_EQ(refused_status(star, make_header(http::verb::get, "/", {{http::field::host,
                                                                      "evil.example"}})),
            std::nullopt);
}

TEST(access_control, origins) {
  auto o = net::server_options{};
  o.allowed_origins = {"https://chat.example.com"};
  net::access_control ac{o, false};
  auto check = [&](std::string host, std::string origin) {
    return refused_status(ac, make_header(http::verb::get, "/v1/models",
                                          {{http::field::host, host},
                                           {http::field::origin, origin}}));
  };
  // Pages of this server itself, and the listed origin.
  EXPECT_EQ(check("127.0.0.1:8080", "http://127.0.0.1:8080"), std::nullopt);
  EXPECT_EQ(check("localhost:8080", "http://LOCALHOST:8080"), std::nullopt);
  EXPECT_EQ(check("localhost", "http://localhost:80"), std::nullopt);
  EXPECT_EQ(check("localhost:8080", "https://chat.example.com"), std::nullopt);
  EXPECT_EQ(check("localhost:8080", "https://chat.example.com:443"), std::nullopt);
  // Anything else.
  for (auto bad : {"http://evil.example", "null", "http://localhost:9999", "https://localhost:8080",
                   "http://chat.example.com", "file://"})
    EXPECT_EQ(check("localhost:8080", bad), 403) << bad;
  // Listed origins get CORS headers; the server's own needs none.
  auto h = make_header(http::verb::get, "/v1/models",
                       {{http::field::host, "localhost:8080"},
                        {http::field::origin, "https://chat.example.com"}});
  EXPECT_EQ(ac.allow_origin(h), "https://chat.example.com");
  h.set(http::field::origin, "http://localhost:8080");
  EXPECT_EQ(ac.allow_origin(h), "");
  // Over TLS the server's own origin is https.
  net::access_control tls{o, true};
  EXPECT_EQ(refused_status(tls, make_header(http::verb::get, "/v1/models",
                                            {{http::field::host, "localhost:8443"},
                                             {http::field::origin, "https://localhost:8443"}})),
            std::nullopt);
  EXPECT_EQ(refused_status(tls, make_header(http::verb::get, "/v1/models",
                                            {{http::field::host, "localhost:8443"},
                                             {http::field::origin, "http://localhost:8443"}})),
            403);
}

TEST(access_control, preflight_needs_no_key) {
  auto o = keyed_options();
  o.allowed_origins = {"https://chat.example.com"};
  net::access_control ac{o, false};
  auto h = make_header(http::verb::options, "/v1/chat/completions",
                       {{http::field::host, "localhost"},
                        {http::field::origin, "https://chat.example.com"},
                        {http::field::access_control_request_method, "POST"},
                        {http::field::access_control_request_headers,
                         "authorization, content-type"}});
  EXPECT_EQ(ac.check(h), std::nullopt);
  ASSERT_TRUE(ac.is_preflight(h));
  auto res = ac.preflight_response(h);
  EXPECT_EQ(res.result_int(), 204u);
  EXPECT_EQ(res[http::field::access_control_allow_origin], "https://chat.example.com");
  EXPECT_EQ(res[http::field::access_control_allow_headers], "authorization, content-type");
  // From an origin not listed: refused before anything else.
  h.set(http::field::origin, "https://evil.example");
  EXPECT_EQ(refused_status(ac, h), 403);
}

TEST(access_control, key_files) {
  auto dir = std::filesystem::temp_directory_path() / fmt::format("keys-{}", ::getpid());
  std::filesystem::create_directories(dir);
  auto path = (dir / "keys").string();
  std::ofstream(path) << "# the operators' keys\n\n  sk-a  \nsk-b\n# sk-c\n";
  EXPECT_EQ(net::read_api_keys_file(path), (std::vector<std::string>{"sk-a", "sk-b"}));
  std::ofstream(path) << "# none\n";
  EXPECT_THROW(net::read_api_keys_file(path), std::runtime_error);
  EXPECT_THROW(net::read_api_keys_file((dir / "missing").string()), std::runtime_error);
  std::filesystem::remove_all(dir);
}

TEST(log_text, escapes_what_would_end_a_line) {
  EXPECT_EQ(net::log_text("plain id-1"), "plain id-1");
  EXPECT_EQ(net::log_text("a\nb\rc\td\\e\x01\x7f"), "a\\nb\\rc\\td\\\\e\\x01\\x7f");
  EXPECT_EQ(net::log_text(std::string(300, 'x'), 10), "xxxxxxxxxx...");
  EXPECT_EQ(net::log_text("\xc3\xbc"), "\xc3\xbc"); // UTF-8 stays readable
}

// -- the server --------------------------------------------------------------------------

/// The server, started by each test after it sets opts_.
class AccessServer : public ServerTest {
protected:
  void SetUp() override {} // each test starts after setting opts_

  /// The WebSocket handshake's answer: the HTTP response the server gave
  /// (101 when it upgraded) and the error of the handshake.
  struct ws_answer {
    int status = 0;
    std::string subprotocol;
    beast::error_code ec;
  };

  ws_answer ws_handshake(std::string target, std::vector<std::pair<http::field, std::string>> headers,
                         std::string host = "127.0.0.1") {
    asio::io_context ioc;
    websocket::stream<tcp::socket> ws{ioc};
    beast::get_lowest_layer(ws).connect({asio::ip::make_address("127.0.0.1"), port_});
    ws.set_option(websocket::stream_base::decorator([headers](websocket::request_type& req) {
      for (auto& [f, v] : headers)
        req.set(f, v);
    }));
    websocket::response_type res;
    ws_answer a;
    ws.handshake(res, host, target, a.ec);
    a.status = int(res.result_int());
    a.subprotocol = std::string(res[http::field::sec_websocket_protocol]);
    if (!a.ec) {
      // The connection works: a ping is answered.
      ws.write(asio::buffer(std::string(R"({"type":"ping","id":"p"})")));
      beast::flat_buffer buf;
      ws.read(buf);
      EXPECT_EQ(json::parse(beast::buffers_to_string(buf.data()))["type"], "pong");
      ws.close(websocket::close_code::normal);
    }
    return a;
  }

  /// A GET or POST on a fresh connection with exactly these headers (and
  /// Host 127.0.0.1 unless given).
  response raw(http::verb method, std::string target,
               std::vector<std::pair<http::field, std::string>> headers, std::string body = {}) {
    http_client c{port_};
    http::request<http::string_body> req{method, target, 11};
    req.set(http::field::host, "127.0.0.1");
    for (auto& [f, v] : headers)
      req.set(f, v);
    if (!body.empty()) {
      req.body() = std::move(body);
      req.prepare_payload();
    }
    http::write(c.socket(), req);
    return c.read();
  }

  static void expect_error(const response& res, int status, const std::string& code) {
    EXPECT_EQ(res.result_int(), unsigned(status)) << res;
    EXPECT_EQ(res[http::field::content_type], "application/json");
    auto j = json::parse(res.body());
    EXPECT_EQ(j["error"]["code"], code) << res.body();
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(j["error"].contains("param"));
  }
};

const std::pair<http::field, std::string> json_type{http::field::content_type,
                                                    "application/json"};
const std::pair<http::field, std::string> good_key{http::field::authorization, "Bearer sk-one"};

TEST_F(AccessServer, NoKeyConfiguredNoKeyNeeded) {
  start();
  EXPECT_EQ(raw(http::verb::get, "/v1/models", {}).result_int(), 200u);
  EXPECT_EQ(raw(http::verb::get, "/metrics", {}).result_int(), 200u);
  EXPECT_FALSE(ws_handshake("/v1/ws", {}).ec);
}

TEST_F(AccessServer, EveryRouteButHealthNeedsTheKey) {
  opts_.api_keys = {"sk-one", "sk-two"};
  start();
  EXPECT_EQ(raw(http::verb::get, "/health", {}).result_int(), 200u);
  for (auto target : {"/v1/models", "/v1/models/fake-model", "/metrics", "/nope"}) {
    auto res = raw(http::verb::get, target, {});
    expect_error(res, 401, "missing_api_key");
    EXPECT_EQ(res[http::field::www_authenticate], "Bearer");
    EXPECT_FALSE(res.keep_alive()) << "the body of a refused request is not read";
    expect_error(raw(http::verb::get, target, {{http::field::authorization, "Bearer sk-nope"}}),
                 401, "invalid_api_key");
    EXPECT_NE(raw(http::verb::get, target, {good_key}).result_int(), 401u) << target;
  }
  auto body = chat_body("echo hi");
  expect_error(raw(http::verb::post, "/v1/chat/completions", {json_type}, body), 401,
               "missing_api_key");
  auto ok = raw(http::verb::post, "/v1/chat/completions",
                {json_type, {http::field::authorization, "Bearer sk-two"}}, body);
  EXPECT_EQ(ok.result_int(), 200u);
  EXPECT_EQ(json::parse(ok.body())["choices"][0]["message"]["content"], "hi ");
  EXPECT_EQ(stats_->requests.load(), 1) << "only the authorised request reached the engine";
}

TEST_F(AccessServer, RefusedRequestsDoNotStopAPipeline) {
  // A refused request behind one in progress is answered after it, in order.
  opts_.api_keys = {"sk-one"};
  start();
  http_client c{port_};
  auto body = completion_body("count 3 5", {{"stream", true}});
  c.send_raw(fmt::format("POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                         "Authorization: Bearer sk-one\r\nContent-Type: application/json\r\n"
                         "Content-Length: {}\r\n\r\n{}GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n",
                         body.size(), body));
  EXPECT_EQ(c.read().result_int(), 200u);
  expect_error(c.read(), 401, "missing_api_key");
  EXPECT_TRUE(c.closed_by_server());
}

TEST_F(AccessServer, MetricsCanBeExempted) {
  opts_.api_keys = {"sk-one"};
  opts_.metrics_without_key = true;
  start();
  EXPECT_EQ(raw(http::verb::get, "/metrics", {}).result_int(), 200u);
  EXPECT_EQ(raw(http::verb::get, "/v1/models", {}).result_int(), 401u);
}

/// base64(SHA-256(text)), as a CSP hash source names a script or style.
std::string csp_hash(std::string_view text) {
  unsigned char d[32];
  unsigned int n = 0;
  EVP_Digest(text.data(), text.size(), d, &n, EVP_sha256(), nullptr);
  unsigned char out[64] = {};
  EVP_EncodeBlock(out, d, int(n));
  return "'sha256-" + std::string(reinterpret_cast<char*>(out)) + "'";
}

/// The text between the last `open` and the next `close` in `html` (the
/// page's one style and one script element come after its comments).
std::string_view between(std::string_view html, std::string_view open, std::string_view close) {
  auto begin = html.rfind(open);
  if (begin == std::string_view::npos)
    return {};
  begin += open.size();
  return html.substr(begin, html.find(close, begin) - begin);
}

TEST_F(AccessServer, TheChatPageLoadsWithoutAKeyUnderAStrictPolicy) {
  opts_.api_keys = {"sk-one"};
  start();
  auto page = raw(http::verb::get, "/", {});
  ASSERT_EQ(page.result_int(), 200u) << page;
  EXPECT_EQ(page[http::field::content_type], "text/html; charset=utf-8");
  EXPECT_EQ(page[http::field::cache_control], "no-cache");
  EXPECT_EQ(page["X-Content-Type-Options"], "nosniff");
  EXPECT_EQ(page["X-Frame-Options"], "DENY");
  EXPECT_NE(page.body().find("/v1/ws"), std::string::npos);
  // Exactly the page's own script and style run: by their digests, no
  // 'unsafe-inline', nothing from elsewhere; connections to this server.
  std::string csp(page["Content-Security-Policy"]);
  EXPECT_NE(csp.find("default-src 'none'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("connect-src 'self'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("frame-ancestors 'none'"), std::string::npos) << csp;
  EXPECT_EQ(csp.find("unsafe"), std::string::npos) << csp;
  EXPECT_EQ(csp.find("http"), std::string::npos) << csp;
  auto script = between(page.body(), "<script>", "</script>");
  auto style = between(page.body(), "<style>", "</style>");
  ASSERT_FALSE(script.empty());
  ASSERT_FALSE(style.empty());
  EXPECT_NE(csp.find("script-src " + csp_hash(script)), std::string::npos) << csp;
  EXPECT_NE(csp.find("style-src " + csp_hash(style)), std::string::npos) << csp;
  // Revalidation: the same ETag is a 304 without a body.
  std::string etag(page[http::field::etag]);
  ASSERT_FALSE(etag.empty());
  auto again = raw(http::verb::get, "/", {{http::field::if_none_match, etag}});
  EXPECT_EQ(again.result_int(), 304u);
  EXPECT_TRUE(again.body().empty());
  EXPECT_EQ(raw(http::verb::get, "/", {{http::field::if_none_match, R"("other")"}}).result_int(),
            200u);
  // The key is still needed for everything the page does, and the page is
  // no way around the Origin and Host checks.
  EXPECT_EQ(raw(http::verb::get, "/v1/models", {}).result_int(), 401u);
  expect_error(raw(http::verb::get, "/", {{http::field::origin, "http://evil.example"}}), 403,
               "origin_not_allowed");
  expect_error(raw(http::verb::get, "/", {{http::field::host, "evil.example"}}), 421,
               "host_not_allowed");
  EXPECT_EQ(raw(http::verb::post, "/", {json_type}, "{}").result_int(), 405u);
}

TEST_F(AccessServer, TheChatPageCanBeTurnedOff) {
  opts_.chat_page = false;
  start();
  expect_error(raw(http::verb::get, "/", {}), 404, "not_found");
}

TEST_F(AccessServer, WebSocketUpgradeNeedsTheKey) {
  opts_.api_keys = {"sk-one"};
  start();
  auto none = ws_handshake("/v1/ws", {});
  EXPECT_TRUE(none.ec);
  EXPECT_EQ(none.status, 401);
  EXPECT_EQ(ws_handshake("/v1/ws", {{http::field::authorization, "Bearer sk-bad"}}).status, 401);
  // A header (non-browser clients), a subprotocol or the query (browsers).
  EXPECT_FALSE(ws_handshake("/v1/ws", {good_key}).ec);
  auto proto = ws_handshake("/v1/ws", {{http::field::sec_websocket_protocol,
                                        "metronome, bearer.sk-one"}});
  EXPECT_FALSE(proto.ec) << proto.ec.message();
  EXPECT_EQ(proto.subprotocol, "metronome");
  EXPECT_FALSE(ws_handshake("/v1/ws?api_key=sk-one", {}).ec);
  EXPECT_EQ(ws_handshake("/v1/ws?api_key=sk-two", {}).status, 401);
}

TEST_F(AccessServer, JsonRoutesRefuseOtherMediaTypes) {
  // A text/plain POST is a "simple" request: any web page can make a
  // browser send it cross-site without a preflight.
  start();
  auto body = chat_body("echo hi");
  for (auto type : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"})
    expect_error(raw(http::verb::post, "/v1/chat/completions",
                     {{http::field::content_type, type}}, body),
                 415, "unsupported_media_type");
  expect_error(raw(http::verb::post, "/v1/completions", {}, completion_body("echo hi")), 415,
               "unsupported_media_type");
  EXPECT_EQ(stats_->requests.load(), 0);
  EXPECT_EQ(raw(http::verb::post, "/v1/chat/completions",
                {{http::field::content_type, "application/json; charset=utf-8"}}, body)
              .result_int(),
            200u);
}

TEST_F(AccessServer, ForeignOriginsAreRefused) {
  start();
  auto evil = std::pair{http::field::origin, std::string("http://evil.example")};
  expect_error(raw(http::verb::post, "/v1/chat/completions", {json_type, evil},
                   chat_body("echo hi")),
               403, "origin_not_allowed");
  auto ws = ws_handshake("/v1/ws", {evil});
  EXPECT_EQ(ws.status, 403);
  // A page of this server itself.
  auto own = std::pair{http::field::origin, fmt::format("http://127.0.0.1:{}", port_)};
  EXPECT_FALSE(ws_handshake("/v1/ws", {own}, fmt::format("127.0.0.1:{}", port_)).ec);
  EXPECT_EQ(stats_->requests.load(), 0);
}

TEST_F(AccessServer, AllowedOriginsGetCors) {
  opts_.api_keys = {"sk-one"};
  opts_.allowed_origins = {"https://chat.example.com"};
  start();
  auto origin = std::pair{http::field::origin, std::string("https://chat.example.com")};
  // The preflight carries no key.
  auto pre = raw(http::verb::options, "/v1/chat/completions",
                 {origin, {http::field::access_control_request_method, "POST"},
                  {http::field::access_control_request_headers, "authorization,content-type"}});
  EXPECT_EQ(pre.result_int(), 204u);
  EXPECT_EQ(pre[http::field::access_control_allow_origin], "https://chat.example.com");
  EXPECT_NE(pre[http::field::access_control_allow_methods].find("POST"), std::string::npos);
  // The request itself, streamed and not, and its refusals, can be read by
  // the page.
  auto res = raw(http::verb::post, "/v1/chat/completions", {origin, json_type, good_key},
                 chat_body("echo hi"));
  EXPECT_EQ(res.result_int(), 200u);
  EXPECT_EQ(res[http::field::access_control_allow_origin], "https://chat.example.com");
  auto stream = raw(http::verb::post, "/v1/chat/completions", {origin, json_type, good_key},
                    chat_body("echo hi", {{"stream", true}}));
  EXPECT_EQ(stream[http::field::access_control_allow_origin], "https://chat.example.com");
  auto refused = raw(http::verb::get, "/v1/models", {origin});
  EXPECT_EQ(refused.result_int(), 401u);
  EXPECT_EQ(refused[http::field::access_control_allow_origin], "https://chat.example.com");
  EXPECT_FALSE(ws_handshake("/v1/ws?api_key=sk-one", {origin}).ec);
  // Other origins still are not.
  EXPECT_EQ(raw(http::verb::options, "/v1/chat/completions",
                {{http::field::origin, "https://evil.example"},
                 {http::field::access_control_request_method, "POST"}})
              .result_int(),
            403u);
}

TEST_F(AccessServer, ForeignHostNamesAreRefused) {
  // DNS rebinding: evil.example now resolves to 127.0.0.1, and the page's
  // requests carry its name.
  start();
  auto res = raw(http::verb::get, "/v1/models", {{http::field::host, "evil.example:8080"}});
  expect_error(res, 421, "host_not_allowed");
  EXPECT_EQ(ws_handshake("/v1/ws", {}, "evil.example").status, 421);
  EXPECT_EQ(raw(http::verb::get, "/v1/models", {{http::field::host, "localhost"}}).result_int(),
            200u);
  stop();
  opts_.allowed_hosts = {"evil.example"};
  start();
  EXPECT_EQ(raw(http::verb::get, "/v1/models", {{http::field::host, "evil.example:8080"}})
              .result_int(),
            200u);
}

/// Captures the log (at debug level) while alive. spdlog's macros log
/// through a raw pointer to the default logger, so the server must be stopped
/// (its io threads joined) before a capture ends: a thread still logging would
/// use the capture's logger after it is destroyed.
class log_capture {
public:
  log_capture()
    : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)),
      previous_(spdlog::default_logger()),
      level_(spdlog::get_level()) {
    auto logger = std::make_shared<spdlog::logger>("capture", sink_);
    logger->set_level(spdlog::level::debug);
    spdlog::set_default_logger(logger);
    spdlog::set_level(spdlog::level::debug);
  }

  ~log_capture() {
    spdlog::set_default_logger(previous_);
    spdlog::set_level(level_);
  }

  std::string text() {
    sink_->flush();
    return out_.str();
  }

private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> previous_;
  spdlog::level::level_enum level_;
};

TEST_F(AccessServer, ClientStringsCannotForgeLogLines) {
  log_capture log;
  start();
  {
    ws_client ws{port_};
    ws.send({{"type", "chat"},
             {"id", "x\nFORGED error: admin logged in"},
             {"model", "fake-model"},
             {"messages", {{{"role", "user"}, {"content", "echo hi"}}}}});
    ws.receive_until([](const json& e) { return e["type"] == "done"; });
    ws.close();
  }
  raw(http::verb::get, "/v1/models", {{http::field::host, "evil\x01.example"}});
  EXPECT_TRUE(eventually([&] { return stats_->live.load() == 0; }));
  auto text = log.text();
  EXPECT_NE(text.find("id=x\\nFORGED"), std::string::npos) << text;
  EXPECT_EQ(text.find("\nFORGED"), std::string::npos) << text;
  EXPECT_EQ(text.find('\x01'), std::string::npos) << text;
  stop();
}

TEST_F(AccessServer, WarnsWhenOpenBeyondLoopbackWithoutAKey) {
  {
    log_capture log;
    start();
    EXPECT_EQ(log.text().find("WITHOUT an API key"), std::string::npos);
    stop();
  }
  {
    log_capture log;
    opts_.host = "0.0.0.0";
    start();
    EXPECT_NE(log.text().find("WITHOUT an API key"), std::string::npos) << log.text();
    stop();
  }
  {
    log_capture log;
    opts_.api_keys = {"sk-one"};
    start();
    EXPECT_EQ(log.text().find("WITHOUT an API key"), std::string::npos);
    EXPECT_NE(log.text().find("1 API key required"), std::string::npos) << log.text();
    stop();
  }
}

// -- with the connection limit and the drain ---------------------------------------------

const std::pair<std::string, std::string> key_header{"Authorization", "Bearer sk-one"};

void expect_unavailable(const response& res, const std::string& code) {
  EXPECT_EQ(res.result_int(), 503u) << res.body();
  EXPECT_EQ(res[http::field::retry_after], "7");
  EXPECT_FALSE(res.keep_alive());
  auto j = json::parse(res.body());
  EXPECT_EQ(j["error"]["code"], code) << res.body();
  EXPECT_EQ(j["error"]["type"], "service_unavailable_error");
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_TRUE(j["error"].contains("param"));
}

bool connect_refused(uint16_t port) {
  try {
    http_client c{port};
    return false;
  } catch (const boost::system::system_error&) {
    return true;
  }
}

TEST_F(AccessServer, HealthNeedsNoKeyWhileTheConnectionTableIsFull) {
  opts_.api_keys = {"sk-one"};
  opts_.max_connections = 1;
  start();
  http_client a{port_};
  a.send(http::verb::get, "/v1/models", {}, {key_header});
  EXPECT_EQ(a.read().result_int(), 200u);
  {
    http_client h{port_};
    auto res = h.request(http::verb::get, "/health");
    EXPECT_EQ(res.result_int(), 200u) << res.body();
    EXPECT_EQ(json::parse(res.body())["status"], "ok");
    EXPECT_TRUE(h.closed_by_server_within(5s));
  }
  {
    // With the key: the limit's 503. Without: access control answers first.
    http_client c{port_};
    c.send(http::verb::post, "/v1/chat/completions", chat_body("echo hi"), {key_header});
    expect_unavailable(c.read(), "too_many_connections");
    EXPECT_TRUE(c.closed_by_server_within(5s));
  }
  {
    http_client c{port_};
    auto res = c.request(http::verb::post, "/v1/chat/completions", chat_body("echo hi"));
    expect_error(res, 401, "missing_api_key");
    EXPECT_TRUE(c.closed_by_server_within(5s));
  }
  EXPECT_EQ(stats_->requests.load(), 0);
}

TEST_F(AccessServer, DrainAndAccessRefusalsBothCarryOpenAiBodies) {
  opts_.api_keys = {"sk-one"};
  opts_.drain_timeout = 20s;
  start();
  http_client idle{port_};
  idle.send(http::verb::get, "/v1/models", {}, {key_header});
  EXPECT_EQ(idle.read().result_int(), 200u);
  http_client keyless{port_};
  EXPECT_EQ(keyless.request(http::verb::get, "/health").result_int(), 200u);
  http_client health{port_};
  EXPECT_EQ(health.request(http::verb::get, "/health").result_int(), 200u);
  // Keeps the drain waiting until the test lets it go.
  http_client running{port_};
  running.send(http::verb::post, "/v1/completions", completion_body("hang", {{"stream", true}}),
               {key_header});
  ASSERT_EQ(running.read_header().get().result_int(), 200u);

  std::thread drain([this] { server_->drain(); });
  EXPECT_TRUE(eventually([&] { return connect_refused(port_); }));
  auto h = health.request(http::verb::get, "/health");
  EXPECT_EQ(h.result_int(), 503u);
  EXPECT_EQ(json::parse(h.body())["status"], "draining");
  expect_error(keyless.request(http::verb::post, "/v1/chat/completions", chat_body("echo late")),
               401, "missing_api_key");
  idle.send(http::verb::post, "/v1/chat/completions", chat_body("echo late"), {key_header});
  expect_unavailable(idle.read(), "shutting_down");
  EXPECT_EQ(stats_->requests.load(), 1) << "a request reached the engine while draining";
  running.close();
  drain.join();
}

// -- TLS ----------------------------------------------------------------------------------

/// A self-signed certificate for localhost and 127.0.0.1 and its key, as PEM
/// files in a fresh folder (removed with the object).
class self_signed_pair {
public:
  self_signed_pair() {
    dir_ = std::filesystem::temp_directory_path()
           / fmt::format("metronome-tls-{}-{}", ::getpid(), counter_++);
    std::filesystem::create_directories(dir_);
    EVP_PKEY* key = EVP_EC_gen("P-256");
    X509* x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, key);
    X509_NAME* name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
    X509_set_issuer_name(x, name);
    X509V3_CTX v3;
    X509V3_set_ctx_nodb(&v3);
    X509V3_set_ctx(&v3, x, x, nullptr, nullptr, 0);
    X509_EXTENSION* san =
      X509V3_EXT_conf_nid(nullptr, &v3, NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1");
    X509_add_ext(x, san, -1);
    X509_EXTENSION_free(san);
    X509_sign(x, key, EVP_sha256());
    FILE* f = std::fopen(cert_file().c_str(), "w");
    PEM_write_X509(f, x);
    std::fclose(f);
    f = std::fopen(key_file().c_str(), "w");
    PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
    X509_free(x);
    EVP_PKEY_free(key);
  }

  ~self_signed_pair() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string cert_file() const {
    return (dir_ / "cert.pem").string();
  }

  std::string key_file() const {
    return (dir_ / "key.pem").string();
  }

private:
  static inline int counter_ = 0;
  std::filesystem::path dir_;
};

/// A client context that trusts `pair`'s certificate only and checks the
/// name.
ssl::context client_context(const self_signed_pair& pair) {
  ssl::context ctx{ssl::context::tls_client};
  ctx.load_verify_file(pair.cert_file());
  ctx.set_verify_mode(ssl::verify_peer);
  return ctx;
}

TEST_F(AccessServer, TlsServesHttpsAndWss) {
  self_signed_pair pair;
  opts_.tls_cert_file = pair.cert_file();
  opts_.tls_key_file = pair.key_file();
  opts_.api_keys = {"sk-one"};
  start();
  auto ctx = client_context(pair);
  asio::io_context ioc;
  {
    ssl::stream<tcp::socket> s{ioc, ctx};
    s.set_verify_callback(ssl::host_name_verification("localhost"));
    s.next_layer().connect({asio::ip::make_address("127.0.0.1"), port_});
    s.handshake(ssl::stream_base::client);
    for (bool stream : {false, true}) {
      http::request<http::string_body> req{http::verb::post, "/v1/chat/completions", 11};
      req.set(http::field::host, "localhost");
      req.set(http::field::content_type, "application/json");
      req.set(http::field::authorization, "Bearer sk-one");
      req.body() = chat_body("echo secure", {{"stream", stream}});
      req.prepare_payload();
      http::write(s, req);
      beast::flat_buffer buf;
      http::response<http::string_body> res;
      http::read(s, buf, res);
      EXPECT_EQ(res.result_int(), 200u);
      EXPECT_NE(res.body().find("secure"), std::string::npos) << res.body();
    }
  }
  {
    // The page's own origin is https now.
    websocket::stream<ssl::stream<tcp::socket>> ws{ioc, ctx};
    beast::get_lowest_layer(ws).connect({asio::ip::make_address("127.0.0.1"), port_});
    ws.next_layer().handshake(ssl::stream_base::client);
    ws.set_option(websocket::stream_base::decorator([this](websocket::request_type& req) {
      req.set(http::field::origin, fmt::format("https://localhost:{}", port_));
      req.set(http::field::sec_websocket_protocol, "metronome, bearer.sk-one");
    }));
    ws.handshake(fmt::format("localhost:{}", port_), "/v1/ws");
    ws.write(asio::buffer(std::string(R"({"type":"ping","id":"p"})")));
    beast::flat_buffer buf;
    ws.read(buf);
    EXPECT_EQ(json::parse(beast::buffers_to_string(buf.data()))["type"], "pong");
    ws.close(websocket::close_code::normal);
  }
  {
    // Plain HTTP on the TLS port gets no answer, and the server lives on.
    http_client c{port_};
    c.send(http::verb::get, "/health");
    beast::error_code ec;
    std::string sink;
    asio::read(c.socket(), asio::dynamic_buffer(sink), ec);
    EXPECT_EQ(sink.find("HTTP/1.1 200"), std::string::npos);
  }
  {
    // A client that does not trust the certificate refuses it.
    ssl::context untrusting{ssl::context::tls_client};
    untrusting.set_verify_mode(ssl::verify_peer);
    ssl::stream<tcp::socket> s{ioc, untrusting};
    s.next_layer().connect({asio::ip::make_address("127.0.0.1"), port_});
    beast::error_code ec;
    s.handshake(ssl::stream_base::client, ec);
    EXPECT_TRUE(ec);
  }
  EXPECT_TRUE(eventually([&] { return server_->connections() == 0; }));
}

/// One TLS connection to the server, its handshake done.
class tls_client {
public:
  tls_client(uint16_t port, ssl::context& ctx) : stream_(ioc_, ctx) {
    stream_.next_layer().connect({asio::ip::make_address("127.0.0.1"), port});
    stream_.handshake(ssl::stream_base::client);
  }

  /// Sends a request with Host, the key and, on a POST, a JSON body.
  void send(http::verb method, std::string target, std::string body = {}) {
    http::request<http::string_body> req{method, target, 11};
    req.set(http::field::host, "localhost");
    req.set(http::field::authorization, "Bearer sk-one");
    if (method == http::verb::post) {
      req.set(http::field::content_type, "application/json");
      req.body() = std::move(body);
      req.prepare_payload();
    }
    http::write(stream_, req);
  }

  response read() {
    http::response_parser<http::string_body> parser;
    http::read(stream_, buffer_, parser);
    return parser.release();
  }

  response request(http::verb method, std::string target, std::string body = {}) {
    send(method, std::move(target), std::move(body));
    return read();
  }

  /// Reads the status line and headers of a response; the rest stays.
  unsigned read_status() {
    http::response_parser<http::string_body> parser;
    http::read_header(stream_, buffer_, parser);
    return parser.get().result_int();
  }

  /// The server closed the connection (a read ends, no TLS close_notify
  /// needed).
  bool closed_by_server() {
    beast::error_code ec;
    char c;
    stream_.read_some(asio::buffer(&c, 1), ec);
    return bool(ec);
  }

  void close() {
    beast::error_code ec;
    stream_.next_layer().close(ec);
  }

private:
  asio::io_context ioc_;
  ssl::stream<tcp::socket> stream_;
  beast::flat_buffer buffer_;
};

TEST_F(AccessServer, TlsHandshakeHasTheHeaderTimeoutThenTheConnectionMayIdle) {
  self_signed_pair pair;
  opts_.tls_cert_file = pair.cert_file();
  opts_.tls_key_file = pair.key_file();
  opts_.api_keys = {"sk-one"};
  opts_.header_timeout = 300ms;
  opts_.idle_timeout = 30s;
  start();
  {
    // A client that never starts its handshake is closed at header_timeout.
    http_client silent{port_};
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(silent.closed_by_server_within(5s));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  }
  // Once the handshake is done, the connection waits for its first request
  // for idle_timeout, and for the next one too.
  auto ctx = client_context(pair);
  tls_client c{port_, ctx};
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(c.request(http::verb::get, "/v1/models").result_int(), 200u);
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(c.request(http::verb::post, "/v1/chat/completions", chat_body("echo again"))
              .result_int(),
            200u);
}

TEST_F(AccessServer, TlsRequestsSentRightAfterTheHandshakeAreRead) {
  // The requests may reach the server with the handshake's last record and
  // sit decrypted in the TLS stream, with nothing left on the socket to
  // wake a wait for readability: they must be answered at once, not at the
  // idle timeout.
  self_signed_pair pair;
  opts_.tls_cert_file = pair.cert_file();
  opts_.tls_key_file = pair.key_file();
  opts_.api_keys = {"sk-one"};
  opts_.idle_timeout = 3s;
  start();
  auto ctx = client_context(pair);
  for (int i = 0; i < 10; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    tls_client c{port_, ctx};
    c.send(http::verb::get, "/v1/models");
    c.send(http::verb::post, "/v1/chat/completions", chat_body("echo pipelined"));
    EXPECT_EQ(c.read().result_int(), 200u) << i;
    auto res = c.read();
    EXPECT_EQ(res.result_int(), 200u) << i;
    EXPECT_NE(res.body().find("pipelined"), std::string::npos) << res.body();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << i;
  }
}

TEST_F(AccessServer, TlsConnectionsOverTheLimitAndWhileDrainingAreAnsweredOverTls) {
  self_signed_pair pair;
  opts_.tls_cert_file = pair.cert_file();
  opts_.tls_key_file = pair.key_file();
  opts_.api_keys = {"sk-one"};
  opts_.max_connections = 2;
  opts_.drain_timeout = 20s;
  start();
  auto ctx = client_context(pair);
  tls_client idle{port_, ctx};
  EXPECT_EQ(idle.request(http::verb::get, "/v1/models").result_int(), 200u);
  tls_client running{port_, ctx};
  running.send(http::verb::post, "/v1/completions", completion_body("hang", {{"stream", true}}));
  ASSERT_EQ(running.read_status(), 200u);
  {
    tls_client over{port_, ctx};
    expect_unavailable(over.request(http::verb::get, "/v1/models"), "too_many_connections");
    EXPECT_TRUE(over.closed_by_server());
  }
  {
    tls_client over{port_, ctx};
    auto res = over.request(http::verb::get, "/health");
    EXPECT_EQ(res.result_int(), 200u) << res.body();
  }
  std::thread drain([this] { server_->drain(); });
  EXPECT_TRUE(eventually([&] { return connect_refused(port_); }));
  expect_unavailable(idle.request(http::verb::post, "/v1/chat/completions", chat_body("echo late")),
                     "shutting_down");
  EXPECT_TRUE(idle.closed_by_server());
  running.close();
  drain.join();
  EXPECT_EQ(stats_->requests.load(), 1);
}

TEST_F(AccessServer, TlsFilesThatDoNotLoadStopTheStart) {
  self_signed_pair pair;
  opts_.tls_cert_file = pair.cert_file();
  opts_.tls_key_file = pair.cert_file() + ".missing";
  try {
    start();
    ADD_FAILURE() << "started with a missing key file";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(".missing"), std::string::npos) << e.what();
  }
  self_signed_pair other;
  opts_.tls_key_file = other.key_file(); // a key of another certificate
  EXPECT_THROW(start(), std::runtime_error);
}

} // namespace
} // namespace metronome::test
