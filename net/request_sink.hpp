#pragma once
// The bridge between a connection (Asio, its strand) and the engine (CAF
// actors): one small sink actor per request (PRIMER section 9, pattern A).
//
// The connection spawns the sink on its io thread; the sink sends the
// generate_request to the engine's frontend from itself, so the engine sees
// it as the request's sink and monitors it. Every text_delta and the final
// generation_done or generation_error are posted to the connection's strand
// through its strand_port, where the connection formats them; the sink quits
// after the last. To cancel (client gone, WebSocket `cancel`), the
// connection kills the sink: the engine's request actor sees it DOWN and
// frees the request's KV pages.
//
// Lifetimes: the sink holds the port, never the connection (a weak pointer
// to the listener) or the io_context: the port's executor is dropped when
// the connection ends or the server stops, so a late event from a sink is
// discarded instead of touching a closed connection or a destroyed
// io_context.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>

#include "caf/all.hpp"

#include "actors/interfaces.hpp"

namespace metronome::net {

using strand_type = boost::asio::strand<boost::asio::io_context::executor_type>;

/// What a connection does with its requests' events. Called on the
/// connection's strand only; `tag` names the request within the connection.
class sink_listener {
public:
  virtual ~sink_listener() = default;

  virtual void on_delta(uint64_t tag, text_delta& delta) = 0;

  virtual void on_done(uint64_t tag, generation_done& done) = 0;

  virtual void on_error(uint64_t tag, generation_error& error) = 0;

  /// The server stops: cancel every request, close the socket.
  virtual void close_now() = 0;

  /// The server's drain timed out (http_server::drain()): end every request
  /// still running with a shutting_down error its client can read (an SSE
  /// error event and [DONE]; a 503 body; a WebSocket error event), then
  /// close: idle connections at once, the others once their last bytes are
  /// written (WebSocket: with close code 1001, going away). The default
  /// closes at once.
  virtual void finish_drain() {
    close_now();
  }
};

/// A connection's mailbox slot for its sinks: posts to the connection's
/// strand while both the connection and the server are alive. Thread-safe.
class strand_port {
public:
  strand_port(strand_type strand, std::weak_ptr<sink_listener> listener)
    : strand_(std::move(strand)), listener_(std::move(listener)) {}

  /// Runs `f(listener)` on the strand if the port is open and the listener
  /// alive; otherwise drops it. Any thread.
  template <class F>
  void post(F f) {
    std::lock_guard<std::mutex> guard{mtx_};
    if (!strand_)
      return;
    boost::asio::post(*strand_, [w = listener_, f = std::move(f)]() mutable {
      if (auto l = w.lock())
        f(*l);
    });
  }

  /// Drops the executor: later posts are discarded. Any thread; call before
  /// the io_context is destroyed.
  void close() {
    std::optional<strand_type> dropped;
    std::lock_guard<std::mutex> guard{mtx_};
    dropped.swap(strand_);
  }

  /// The listener, if it is still alive (for the server's stop()).
  std::shared_ptr<sink_listener> listener() const {
    return listener_.lock();
  }

private:
  std::mutex mtx_;
  std::optional<strand_type> strand_;
  std::weak_ptr<sink_listener> listener_;
};

/// The ports of all connections of one server, so stop() can reach every
/// connection and close every port before the io_context goes away.
class port_registry {
public:
  /// Adds a port (prunes expired entries now and then). Any thread.
  void add(const std::shared_ptr<strand_port>& port);

  /// The live ports. Any thread.
  std::vector<std::shared_ptr<strand_port>> live() const;

  /// Closes every port; later adds are closed at once. Any thread.
  void close_all();

private:
  mutable std::mutex mtx_;
  std::vector<std::weak_ptr<strand_port>> ports_;
  size_t prune_at_ = 64;
  bool closed_ = false;
};

/// Spawns a sink for `req` (see the top of this file). `tag` comes back with
/// every event. The sink monitors the frontend, and the engine's actor that
/// answers once it has answered: if either dies before the final event, the
/// sink reports generation_error unavailable itself, so a connection never
/// waits for an engine that is gone. (The engine enforces the request's
/// timeout.) Any thread (normally the connection's strand).
request_sink_actor spawn_request_sink(caf::actor_system& sys, const frontend_actor& frontend,
                                      generate_request req, std::shared_ptr<strand_port> port,
                                      uint64_t tag);

/// Cancels a request: kills its sink (the engine frees the request).
void cancel_request_sink(const request_sink_actor& sink);

} // namespace metronome::net
