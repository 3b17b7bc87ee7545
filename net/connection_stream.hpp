#pragma once
// The byte stream under one connection: a plain TCP socket, or TLS over one
// when the server has a certificate (server.tls). http_session and
// ws_session read and write through it without knowing which; Beast's HTTP
// and WebSocket algorithms take it as their AsyncStream, and the free
// functions below are the customisation points Beast's WebSocket needs for a
// stream type of its own (teardown, close).
//
// Design note. A type-erasing wrapper rather than templating the sessions
// on the stream: the sessions stay one compiled class each, and the choice
// between plain and TLS is made once per connection, at accept. The TLS
// handshake runs before the first request is read (http_session::start),
// bounded by the server's header_timeout like a slow request header. Reads
// go through the stream, never around it: TLS may hold decrypted bytes
// that the socket's readiness does not show.

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/beast/core/role.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <boost/beast/websocket/teardown.hpp>

namespace metronome::net {

class connection_stream {
public:
  using tcp_socket = boost::asio::ip::tcp::socket;
  using tls_stream = boost::asio::ssl::stream<tcp_socket>;
  using executor_type = tcp_socket::executor_type;
  using error_code = boost::system::error_code;

  /// Plain TCP over `socket`.
  explicit connection_stream(tcp_socket socket) : tcp_(std::move(socket)) {}

  /// TLS over `socket` with `tls` (which must outlive the stream), or plain
  /// TCP when `tls` is null. A TLS stream must complete async_handshake()
  /// before it is read or written.
  connection_stream(tcp_socket socket, boost::asio::ssl::context* tls) {
    if (tls)
      tls_ = std::make_unique<tls_stream>(std::move(socket), *tls);
    else
      tcp_.emplace(std::move(socket));
  }

  connection_stream(connection_stream&&) noexcept = default;
  connection_stream& operator=(connection_stream&&) noexcept = default;

  executor_type get_executor() {
    return socket().get_executor();
  }

  /// This connection speaks TLS.
  bool is_tls() const {
    return tls_ != nullptr;
  }

  /// The TCP socket under TLS, or the plain socket.
  tcp_socket& socket() {
    return tls_ ? tls_->next_layer() : *tcp_;
  }

  /// The TLS stream; is_tls() only.
  tls_stream& tls() {
    return *tls_;
  }

  // -- AsyncReadStream / AsyncWriteStream ----------------------------------------------

  template <class MutableBuffers, class Token>
  auto async_read_some(const MutableBuffers& buffers, Token&& token) {
    return boost::asio::async_initiate<Token, void(error_code, std::size_t)>(
      [this](auto handler, const MutableBuffers& b) {
        if (tls_)
          tls_->async_read_some(b, std::move(handler));
        else
          tcp_->async_read_some(b, std::move(handler));
      },
      token, buffers);
  }

  template <class ConstBuffers, class Token>
  auto async_write_some(const ConstBuffers& buffers, Token&& token) {
    return boost::asio::async_initiate<Token, void(error_code, std::size_t)>(
      [this](auto handler, const ConstBuffers& b) {
        if (tls_)
          tls_->async_write_some(b, std::move(handler));
        else
          tcp_->async_write_some(b, std::move(handler));
      },
      token, buffers);
  }

  /// The server side of the TLS handshake; completes at once, successfully,
  /// on a plain stream.
  template <class Token>
  auto async_handshake(Token&& token) {
    return boost::asio::async_initiate<Token, void(error_code)>(
      [this](auto handler) {
        if (tls_) {
          tls_->async_handshake(tls_stream::server, std::move(handler));
        } else {
          auto ex = boost::asio::get_associated_executor(handler, get_executor());
          boost::asio::post(ex, [h = std::move(handler)]() mutable { h(error_code{}); });
        }
      },
      token);
  }

  // -- the tcp::socket calls the sessions make -------------------------------------------

  /// Shuts the TCP connection down (no TLS close_notify: the sessions close
  /// at once after, and HTTP/1.1 frames its own ends).
  void shutdown(tcp_socket::shutdown_type what, error_code& ec) {
    socket().shutdown(what, ec);
  }

  void close(error_code& ec) {
    socket().close(ec);
  }

  bool is_open() {
    return socket().is_open();
  }

private:
  std::optional<tcp_socket> tcp_;
  std::unique_ptr<tls_stream> tls_;
};

// -- Beast's customisation points (found by argument-dependent lookup) ---------------------

/// Closes the socket (Beast's WebSocket timeouts and failures).
inline void beast_close_socket(connection_stream& s) {
  boost::system::error_code ignored;
  s.close(ignored);
}

/// Ends a WebSocket connection after the close handshake.
inline void teardown(boost::beast::role_type role, connection_stream& s,
                     boost::system::error_code& ec) {
  if (s.is_tls()) {
    boost::beast::teardown(role, s.tls(), ec);
  } else {
    boost::beast::websocket::teardown(role, s.socket(), ec);
  }
}

template <class TeardownHandler>
void async_teardown(boost::beast::role_type role, connection_stream& s,
                    TeardownHandler&& handler) {
  if (s.is_tls())
    boost::beast::async_teardown(role, s.tls(), std::forward<TeardownHandler>(handler));
  else
    boost::beast::websocket::async_teardown(role, s.socket(),
                                            std::forward<TeardownHandler>(handler));
}

/// A server TLS context for the PEM certificate chain and private key at
/// these paths (TLS 1.2 and newer). Throws std::runtime_error naming the file
/// that cannot be read or does not fit. Called once, by http_server::start.
std::shared_ptr<boost::asio::ssl::context> make_tls_context(const std::string& cert_file,
                                                            const std::string& key_file);

} // namespace metronome::net
