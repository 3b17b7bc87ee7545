#include "net/http_server.hpp"

#include <chrono>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "net/http_session.hpp"
#include "net/server_context.hpp"

namespace metronome::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

struct http_server::impl {
  impl(caf::actor_system& sys, engine eng, server_options opts)
    : ctx(std::make_shared<server_context>(sys, std::move(eng), std::move(opts))) {}

  // Declared first, destroyed last: everything below holds its executors.
  asio::io_context ioc;
  std::shared_ptr<server_context> ctx;
  std::optional<strand_type> acceptor_strand;
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::steady_timer> retry_timer;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  std::mutex mtx;
  uint16_t port = 0;
  bool started = false;
  bool stopped = false;

  /// Accepts one connection, then the next (on the acceptor's strand).
  void accept() {
    auto strand = asio::make_strand(ioc);
    acceptor->async_accept(strand, [this, strand](error_code ec, auto peer) {
      if (!acceptor->is_open())
        return;
      if (ec) {
        // Out of file descriptors and the like: try again shortly instead
        // of spinning.
        spdlog::warn("accept failed: {}", ec.message());
        retry_timer->expires_after(std::chrono::milliseconds(100));
        retry_timer->async_wait([this](error_code ec) {
          if (!ec && acceptor->is_open())
            accept();
        });
        return;
      }
      tcp::socket sock{std::move(peer)};
      error_code ignored;
      sock.set_option(tcp::no_delay(true), ignored); // one token, one packet
      std::make_shared<http_session>(std::move(sock), strand, ctx)->start();
      accept();
    });
  }
};

http_server::http_server(caf::actor_system& sys, engine eng, server_options opts)
  : impl_(std::make_unique<impl>(sys, std::move(eng), std::move(opts))) {}

http_server::~http_server() {
  stop();
}

uint16_t http_server::start() {
  auto& d = *impl_;
  std::lock_guard<std::mutex> guard{d.mtx};
  if (d.started)
    throw std::logic_error("http_server::start called twice");
  const auto& opts = d.ctx->opts;
  auto where = fmt::format("{}:{}", opts.host, opts.port);
  error_code ec;
  tcp::resolver resolver{d.ioc};
  auto results = resolver.resolve(opts.host, std::to_string(opts.port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty())
    throw std::runtime_error(
      fmt::format("cannot resolve the server address {}: {}", where, ec.message()));
  auto endpoint = results.begin()->endpoint();
  d.acceptor_strand.emplace(asio::make_strand(d.ioc));
  d.acceptor.emplace(*d.acceptor_strand);
  d.retry_timer.emplace(*d.acceptor_strand);
  auto fail = [&](std::string_view what) {
    auto msg = fmt::format("cannot listen on {}: {} ({})", where, ec.message(), what);
    d.acceptor.reset();
    d.retry_timer.reset();
    d.acceptor_strand.reset();
    throw std::runtime_error(msg);
  };
  d.acceptor->open(endpoint.protocol(), ec);
  if (ec)
    fail("open");
  d.acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  d.acceptor->bind(endpoint, ec);
  if (ec)
    fail("bind");
  d.acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    fail("listen");
  d.port = d.acceptor->local_endpoint().port();
  d.started = true;
  d.work.emplace(asio::make_work_guard(d.ioc));
  asio::post(*d.acceptor_strand, [&d] { d.accept(); });
  auto n = std::max(1, opts.io_threads);
  for (int i = 0; i < n; ++i)
    d.threads.emplace_back([&d] {
      for (;;) {
        try {
          d.ioc.run();
          return;
        } catch (const std::exception& e) {
          // A handler threw: log it, keep serving the other connections.
          spdlog::error("network thread: unexpected exception: {}", e.what());
        }
      }
    });
  spdlog::debug("listening on {}:{} with {} io threads", opts.host, d.port, n);
  return d.port;
}

void http_server::stop() {
  auto& d = *impl_;
  std::lock_guard<std::mutex> guard{d.mtx};
  if (!d.started || d.stopped)
    return;
  d.stopped = true;
  asio::post(*d.acceptor_strand, [&d] {
    error_code ignored;
    d.acceptor->close(ignored);
    d.retry_timer->cancel();
  });
  for (auto& port : d.ctx->ports.live())
    port->post([](sink_listener& l) { l.close_now(); });
  d.work.reset();
  // Closed connections finish their handlers and the io_context runs out of
  // work; give that a moment, then stop whatever is left.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (!d.ioc.stopped() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  d.ioc.stop();
  for (auto& t : d.threads)
    t.join();
  d.threads.clear();
  // No sink may post to this io_context any more.
  d.ctx->ports.close_all();
}

uint16_t http_server::port() const {
  return impl_->port;
}

const std::string& http_server::model_name() const {
  return impl_->ctx->model_name;
}

size_t http_server::connections() const {
  size_t n = 0;
  for (auto& port : impl_->ctx->ports.live())
    if (port->listener())
      ++n;
  return n;
}

} // namespace metronome::net
