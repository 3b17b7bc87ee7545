#include "net/chat_page.hpp"

#include <array>
#include <stdexcept>
#include <vector>

#include <openssl/evp.h>

namespace metronome::embedded {
// cmake/embed_file.cmake's output for net/chat_page.html (build dir).
extern const unsigned char chat_page_html[];
extern const std::size_t chat_page_html_size;
} // namespace metronome::embedded

namespace metronome::net {

namespace http = boost::beast::http;

namespace {

std::array<unsigned char, 32> sha256(std::string_view data) {
  std::array<unsigned char, 32> d{};
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), d.data(), &n, EVP_sha256(), nullptr);
  return d;
}

std::string base64(const std::array<unsigned char, 32>& d) {
  std::string out(4 * ((d.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), d.data(), int(d.size()));
  out.resize(size_t(n));
  return out;
}

/// The contents of every <tag>...</tag> of `html` outside comments (the
/// page writes these tags plainly: no attributes, lower case).
std::vector<std::string_view> elements(std::string_view html, std::string_view tag) {
  const std::string open = "<" + std::string(tag) + ">";
  const std::string close = "</" + std::string(tag) + ">";
  std::vector<std::string_view> out;
  size_t at = 0;
  while (at < html.size()) {
    const size_t comment = html.find("<!--", at);
    const size_t next = html.find(open, at);
    if (next == std::string_view::npos)
      break;
    if (comment < next) {
      const size_t end = html.find("-->", comment + 4);
      if (end == std::string_view::npos)
        break;
      at = end + 3;
      continue;
    }
    const size_t begin = next + open.size();
    const size_t end = html.find(close, begin);
    if (end == std::string_view::npos)
      break;
    out.push_back(html.substr(begin, end - begin));
    at = end + close.size();
  }
  return out;
}

/// 'sha256-...' sources for the CSP, one per element.
std::string hash_sources(std::string_view html, std::string_view tag) {
  std::string out;
  for (auto body : elements(html, tag))
    out += " 'sha256-" + base64(sha256(body)) + "'";
  if (out.empty())
    throw std::logic_error("the chat page has no <" + std::string(tag) + "> element");
  return out;
}

} // namespace

const chat_page& chat_page::get() {
  static const chat_page page;
  return page;
}

chat_page::chat_page()
  : html_(reinterpret_cast<const char*>(embedded::chat_page_html), embedded::chat_page_html_size) {
  // Exactly this file's style and script, connections to this server only
  // ('self' covers ws:/wss: to the same host), nothing else: no plug-ins,
  // no framing, no form posts, no <base> tricks.
  csp_ = "default-src 'none'; script-src" + hash_sources(html_, "script") + "; style-src"
         + hash_sources(html_, "style")
         + "; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
           "frame-ancestors 'none'";
  etag_ = "\"" + base64(sha256(html_)).substr(0, 22) + "\"";
}

chat_page::response_type chat_page::response(std::string_view if_none_match,
                                             unsigned version) const {
  const bool fresh = !if_none_match.empty()
                     && (if_none_match == "*"
                         || if_none_match.find(etag_) != std::string_view::npos);
  response_type res{fresh ? http::status::not_modified : http::status::ok, version};
  // Revalidated on every load (a new binary may serve a new page), sent
  // again only when it changed.
  res.set(http::field::cache_control, "no-cache");
  res.set(http::field::etag, etag_);
  res.set("Content-Security-Policy", csp_);
  res.set("X-Content-Type-Options", "nosniff");
  res.set("X-Frame-Options", "DENY");
  res.set("Referrer-Policy", "no-referrer");
  res.set("Cross-Origin-Opener-Policy", "same-origin");
  if (!fresh) {
    res.set(http::field::content_type, "text/html; charset=utf-8");
    res.body() = std::string(html_);
  }
  return res;
}

} // namespace metronome::net
