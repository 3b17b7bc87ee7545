#pragma once
// Metronome's network front door: an HTTP/1.1 + WebSocket server on Boost.
// Beast/Asio that speaks the OpenAI API and the /v1/ws protocol and forwards
// every generation request to an engine's frontend actor.
//
// Routes: POST /v1/chat/completions, POST /v1/completions (stream or not),
// GET /v1/models, GET /v1/models/{model}, GET /health (503 until the engine
// is ready), GET /metrics (Prometheus), GET /v1/ws (WebSocket upgrade).
// docs/protocol.md documents the WebSocket protocol.
//
// Threads: start() runs `io_threads` threads on one io_context; every
// connection lives on its own strand.
//
// Limits: at most max_connections connections are served at once (sized
// from the file descriptor limit by default); one over it gets its single
// request answered (GET /health as usual, anything else 503 with
// Retry-After) and is closed. A failing accept (out of descriptors) is
// retried after a growing pause and logged once a second at most.
//
// Shutdown: drain() is the graceful way (SIGTERM), stop() the immediate one
// (and drain()'s last step). Requests reach the engine as messages
// from one sink actor each (net/request_sink.hpp); nothing on the io threads
// blocks on an actor.

#include <cstdint>
#include <memory>

#include "caf/all.hpp"

#include "actors/engine.hpp"
#include "net/server_options.hpp"

namespace metronome::net {

class http_server {
public:
  /// Keeps `sys` by reference: it must outlive the server. Loads the TLS
  /// certificate and key when `opts` names them; throws std::runtime_error
  /// naming the file that cannot be used.
  http_server(caf::actor_system& sys, engine eng, server_options opts);

  /// Calls stop().
  ~http_server();

  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  /// Binds host:port, starts accepting and the io threads; returns the bound
  /// port (useful with port 0). Throws std::runtime_error naming the address
  /// when it cannot bind. Call once, from any thread.
  uint16_t start();

  /// Drains, then stops: closes the listening socket (new connections are
  /// refused), answers new requests on open connections with 503
  /// shutting_down and /health with 503 "draining", waits up to
  /// drain_timeout for the generation requests in flight to finish, ends
  /// those still running with an error their clients can read
  /// (sink_listener::finish_drain()), gives the connections a few seconds
  /// to write it and close, then stop()s. Returns the number of requests
  /// ended by the timeout. Blocks; call once from any thread except an io
  /// thread (a second call, or one after stop(), returns 0 at once).
  size_t drain();

  /// Stops accepting, cancels every request in flight (their sinks are
  /// killed), closes every connection and joins the io threads. Idempotent;
  /// call from any thread except an io thread.
  void stop();

  /// The bound port (0 before start()).
  uint16_t port() const;

  /// The model name the API reports.
  const std::string& model_name() const;

  /// Connections currently open within max_connections (HTTP and
  /// WebSocket). Any thread.
  size_t connections() const;

  /// The connection limit in force (server_options::max_connections, or
  /// the one sized from the file descriptor limit). Any thread.
  size_t max_connections() const;

  /// Generation requests in progress (HTTP and WebSocket). Any thread.
  size_t requests_in_flight() const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace metronome::net
