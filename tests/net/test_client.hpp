#pragma once
// Blocking loopback clients for the net tests: raw HTTP/1.1 over one TCP
// connection (with Beast's response parser, so pipelined responses can be
// read one by one) and a WebSocket client. Test threads only.

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <string>
#include <vector>

#include <poll.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <nlohmann/json.hpp>

namespace metronome::test {

/// Aborts the test program when a test runs longer than `limit` (blocking
/// socket reads have no timeout of their own): a hang becomes a failure
/// with a message.
class watchdog {
public:
  explicit watchdog(std::chrono::seconds limit, std::string what = "test")
    : thread_([this, limit, what] {
        std::unique_lock<std::mutex> lock{mtx_};
        if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
          std::fprintf(stderr, "watchdog: %s still running after %llds, aborting\n",
                       what.c_str(), static_cast<long long>(limit.count()));
          std::abort();
        }
      }) {}

  ~watchdog() {
    {
      std::lock_guard<std::mutex> guard{mtx_};
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

private:
  std::mutex mtx_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

using response = http::response<http::string_body>;

/// One TCP connection speaking HTTP/1.1.
class http_client {
public:
  explicit http_client(uint16_t port) : socket_(ioc_) {
    socket_.connect({asio::ip::make_address("127.0.0.1"), port});
  }

  void send_raw(std::string_view bytes) {
    asio::write(socket_, asio::buffer(bytes.data(), bytes.size()));
  }

  /// Sends a request; adds Host and, with a body, Content-Type and
  /// Content-Length.
  void send(http::verb method, std::string target, std::string body = {},
            std::vector<std::pair<std::string, std::string>> headers = {}) {
    http::request<http::string_body> req{method, target, 11};
    req.set(http::field::host, "127.0.0.1");
    for (auto& [k, v] : headers)
      req.set(k, v);
    if (!body.empty() || method == http::verb::post) {
      req.set(http::field::content_type, "application/json");
      req.body() = std::move(body);
      req.prepare_payload();
    }
    http::write(socket_, req);
  }

  /// Reads one whole response (chunked bodies are joined).
  response read() {
    http::response_parser<http::string_body> parser;
    parser.body_limit(64 << 20);
    http::read(socket_, buffer_, parser);
    return parser.release();
  }

  response request(http::verb method, std::string target, std::string body = {}) {
    send(method, std::move(target), std::move(body));
    return read();
  }

  /// Reads the status line and headers only; read_some_body() continues.
  http::response_parser<http::string_body>& read_header() {
    parser_.emplace();
    parser_->body_limit(64 << 20);
    http::read_header(socket_, buffer_, *parser_);
    return *parser_;
  }

  /// Reads at least one more piece of the body started by read_header().
  void read_some_body() {
    http::read_some(socket_, buffer_, *parser_);
  }

  /// Reads the rest of the response started by read_header().
  response read_rest() {
    http::read(socket_, buffer_, *parser_);
    return parser_->release();
  }

  /// True when the server closed the connection (reads EOF).
  bool closed_by_server() {
    beast::error_code ec;
    char c;
    if (buffer_.size() > 0)
      return false;
    socket_.read_some(asio::buffer(&c, 1), ec);
    return ec == asio::error::eof || ec == asio::error::connection_reset;
  }

  /// Like closed_by_server(), but gives up after `limit`: false when the
  /// server has neither sent anything nor closed by then.
  bool closed_by_server_within(std::chrono::milliseconds limit) {
    if (buffer_.size() > 0)
      return false;
    pollfd p{socket_.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, int(limit.count())) <= 0)
      return false;
    return closed_by_server();
  }

  void close() {
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

  /// Closes with RST (SO_LINGER 0), as a crashed client would.
  void reset() {
    socket_.set_option(asio::socket_base::linger(true, 0));
    beast::error_code ec;
    socket_.close(ec);
  }

  tcp::socket& socket() {
    return socket_;
  }

private:
  asio::io_context ioc_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
  std::optional<http::response_parser<http::string_body>> parser_;
};

/// The `data:` payloads of an SSE body, in order.
inline std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    auto end = body.find("\n\n", pos);
    if (end == std::string::npos)
      break;
    auto event = body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0)
      out.push_back(event.substr(6));
    pos = end + 2;
  }
  return out;
}

/// A WebSocket client at /v1/ws.
class ws_client {
public:
  explicit ws_client(uint16_t port) : ws_(ioc_) {
    auto& sock = beast::get_lowest_layer(ws_);
    sock.connect({asio::ip::make_address("127.0.0.1"), port});
    ws_.handshake("127.0.0.1", "/v1/ws");
  }

  void send(const nlohmann::json& j) {
    send_text(j.dump());
  }

  void send_text(const std::string& text) {
    ws_.text(true);
    ws_.write(asio::buffer(text));
  }

  void send_binary(const std::string& bytes) {
    ws_.binary(true);
    ws_.write(asio::buffer(bytes));
  }

  nlohmann::json receive() {
    beast::flat_buffer buf;
    ws_.read(buf);
    return nlohmann::json::parse(beast::buffers_to_string(buf.data()));
  }

  /// Reads events until `pred` holds for one; returns all read.
  template <class Pred>
  std::vector<nlohmann::json> receive_until(Pred pred, size_t max_events = 10000) {
    std::vector<nlohmann::json> out;
    while (out.size() < max_events) {
      out.push_back(receive());
      if (pred(out.back()))
        break;
    }
    return out;
  }

  /// Reads until the server closes; returns the close code (or -1 when the
  /// read failed otherwise).
  int read_until_close() {
    beast::flat_buffer buf;
    for (;;) {
      beast::error_code ec;
      ws_.read(buf, ec);
      buf.consume(buf.size());
      if (ec == websocket::error::closed)
        return ws_.reason().code;
      if (ec)
        return -1;
    }
  }

  void close() {
    beast::error_code ec;
    ws_.close(websocket::close_code::normal, ec);
  }

  /// Drops the TCP connection without a close handshake.
  void drop() {
    beast::error_code ec;
    beast::get_lowest_layer(ws_).close(ec);
  }

  websocket::stream<tcp::socket>& stream() {
    return ws_;
  }

private:
  asio::io_context ioc_;
  websocket::stream<tcp::socket> ws_;
};

} // namespace metronome::test
