#pragma once
// The chat page at GET / (net/chat_page.html, docs/protocol.md "The chat
// page"): one static HTML file with its CSS and JavaScript inline, embedded
// into the binary at build time (cmake/embed_file.cmake) and served with
// headers that keep it on its own: a Content-Security-Policy that allows
// only this file's <style> and <script> (by SHA-256) and connections back to
// this server, no framing, no referrer, no MIME sniffing.
//
// It is served without an API key (a browser's navigation cannot carry
// one, and the page holds no secret): the page asks for the key and sends
// it with every request it makes (the WebSocket's bearer.KEY subprotocol).
// The Host and Origin checks apply as on every route.

#include <string>
#include <string_view>

#include <boost/beast/http.hpp>

namespace metronome::net {

class chat_page {
public:
  using response_type = boost::beast::http::response<boost::beast::http::string_body>;

  /// The one page of this binary; built on first use. Any thread.
  static const chat_page& get();

  /// The HTML, as embedded.
  std::string_view html() const {
    return html_;
  }

  /// The Content-Security-Policy header's value.
  const std::string& content_security_policy() const {
    return csp_;
  }

  /// The ETag header's value: a quoted digest of the HTML.
  const std::string& etag() const {
    return etag_;
  }

  /// The answer to GET /: 200 with the page, or 304 when `if_none_match`
  /// (the request's If-None-Match) names the page's ETag. Keep-alive is
  /// left to the caller. Any thread.
  response_type response(std::string_view if_none_match, unsigned version) const;

private:
  chat_page();

  std::string_view html_;
  std::string csp_;
  std::string etag_;
};

} // namespace metronome::net
