#include "net/http_server.hpp"

#include <algorithm>
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
#include "net/log_limiter.hpp"
#include "net/server_context.hpp"

namespace metronome::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

namespace {

/// The first and the longest pause before accepting again after a failed
/// accept (out of file descriptors, say): doubled on each failure in a row,
/// so the loop neither spins nor stays deaf long once descriptors free up.
constexpr auto min_accept_pause = std::chrono::milliseconds(5);
constexpr auto max_accept_pause = std::chrono::milliseconds(500);

/// After drain()'s requests have ended: how long connections get to write
/// their last bytes and close before stop() closes what is left.
constexpr auto drain_close_grace = std::chrono::seconds(3);

/// max_connections as configured, or sized from the descriptor limit.
server_options resolve_limits(server_options opts) {
  if (opts.max_connections == 0)
    opts.max_connections = connection_limit_for(file_descriptor_limit());
  return opts;
}

/// Polls `done` every 2 ms until it holds or `deadline` passes.
template <class Pred>
bool wait_until(std::chrono::steady_clock::time_point deadline, Pred done) {
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline)
      return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

} // namespace

struct http_server::impl {
  impl(caf::actor_system& sys, engine eng, server_options opts)
    : ctx(std::make_shared<server_context>(sys, std::move(eng), resolve_limits(std::move(opts)))) {
  }

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
  bool draining = false;
  // The acceptor's strand only:
  std::chrono::milliseconds accept_pause{0};
  log_limiter accept_errors;
  log_limiter refusals;

  /// Accepts one connection, then the next (on the acceptor's strand).
  void accept() {
    auto strand = asio::make_strand(ioc);
    acceptor->async_accept(strand, [this, strand](error_code ec, auto peer) {
      if (!acceptor->is_open())
        return;
      if (ec) {
        on_accept_error(ec);
        return;
      }
      accept_pause = {};
      admit(tcp::socket{std::move(peer)}, strand);
      accept();
    });
  }

  /// Out of file descriptors and the like: try again after a pause that
  /// grows while the failures go on, instead of spinning; say so once a
  /// second at most.
  void on_accept_error(error_code ec) {
    accept_pause = std::clamp(accept_pause * 2, std::chrono::milliseconds(min_accept_pause),
                              std::chrono::milliseconds(max_accept_pause));
    if (auto held = accept_errors.allow())
      spdlog::warn("accept failed: {} ({} more since the last report; {} connections open, "
                   "limit {}); retrying in {} ms",
                   ec.message(), *held, ctx->connections.load(), ctx->opts.max_connections,
                   accept_pause.count());
    retry_timer->expires_after(accept_pause);
    retry_timer->async_wait([this](error_code ec) {
      if (!ec && acceptor->is_open())
        accept();
    });
  }

  /// Starts a session for a new connection: a regular one within
  /// max_connections, one that answers a single request over it while an
  /// overflow slot is free, otherwise none (the socket closes at once).
  void admit(tcp::socket sock, strand_type strand) {
    const auto& o = ctx->opts;
    error_code ignored;
    sock.set_option(tcp::no_delay(true), ignored); // one token, one packet
    if (ctx->connections.load() < o.max_connections) {
      std::make_shared<http_session>(connection_stream(std::move(sock), ctx->tls.get()), strand,
                                     ctx, gauge_slot(ctx->connections))
        ->start();
      return;
    }
    const bool answer = ctx->overflow_connections.load() < o.overflow_connections;
    if (auto held = refusals.allow())
      spdlog::warn("connection limit reached ({} open): {} new connections ({} more since the "
                   "last report)",
                   o.max_connections, answer ? "answering 503 to" : "closing", *held);
    if (answer)
      std::make_shared<http_session>(connection_stream(std::move(sock), ctx->tls.get()), strand,
                                     ctx, gauge_slot(ctx->overflow_connections), true)
        ->start();
    else
      sock.close(ignored);
  }

  /// Closes the acceptor (on its strand; later accepts find it closed).
  void close_acceptor() {
    asio::post(*acceptor_strand, [this] {
      error_code ignored;
      acceptor->close(ignored);
      retry_timer->cancel();
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
  d.ctx->access.log_posture(fmt::format("{}:{}", opts.host, d.port),
                            endpoint.address().is_loopback());
  d.started = true;
  auto fd_limit = file_descriptor_limit();
  spdlog::info("accepting up to {} connections (file descriptor limit {})", opts.max_connections,
               fd_limit);
  if (opts.max_connections >= fd_limit)
    spdlog::warn("server.max_connections ({}) is not below the file descriptor limit ({}): the "
                 "server may run out of descriptors before it refuses connections (raise "
                 "ulimit -n or lower server.max_connections)",
                 opts.max_connections, fd_limit);
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

size_t http_server::drain() {
  auto& d = *impl_;
  {
    std::lock_guard<std::mutex> guard{d.mtx};
    if (!d.started || d.stopped || d.draining)
      return 0;
    d.draining = true;
  }
  const auto& opts = d.ctx->opts;
  d.ctx->draining.store(true);
  d.close_acceptor();
  auto running = d.ctx->requests_in_flight.load();
  spdlog::info("draining: {} requests running, {} connections open; waiting up to {} ms",
               running, d.ctx->connections.load(), opts.drain_timeout.count());
  auto t0 = std::chrono::steady_clock::now();
  wait_until(t0 + opts.drain_timeout, [&] { return d.ctx->requests_in_flight.load() == 0; });
  size_t cut = d.ctx->requests_in_flight.load();
  if (cut > 0)
    spdlog::warn("drain timeout: ending {} requests still running", cut);
  for (auto& port : d.ctx->ports.live())
    port->post([](sink_listener& l) { l.finish_drain(); });
  wait_until(std::chrono::steady_clock::now() + drain_close_grace, [&] {
    return d.ctx->connections.load() == 0 && d.ctx->overflow_connections.load() == 0;
  });
  spdlog::info("drained in {} ms ({} requests ended by the timeout)",
               std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now() - t0)
                 .count(),
               cut);
  stop();
  return cut;
}

void http_server::stop() {
  auto& d = *impl_;
  std::lock_guard<std::mutex> guard{d.mtx};
  if (!d.started || d.stopped)
    return;
  d.stopped = true;
  d.close_acceptor();
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
  return impl_->ctx->connections.load();
}

size_t http_server::max_connections() const {
  return impl_->ctx->opts.max_connections;
}

size_t http_server::requests_in_flight() const {
  return impl_->ctx->requests_in_flight.load();
}

} // namespace metronome::net
