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
// connection lives on its own strand. Requests reach the engine as messages
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
  /// Keeps `sys` by reference: it must outlive the server.
  http_server(caf::actor_system& sys, engine eng, server_options opts);

  /// Calls stop().
  ~http_server();

  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  /// Binds host:port, starts accepting and the io threads; returns the bound
  /// port (useful with port 0). Throws std::runtime_error naming the address
  /// when it cannot bind. Call once, from any thread.
  uint16_t start();

  /// Stops accepting, cancels every request in flight (their sinks are
  /// killed), closes every connection and joins the io threads. Idempotent;
  /// call from any thread except an io thread.
  void stop();

  /// The bound port (0 before start()).
  uint16_t port() const;

  /// The model name the API reports.
  const std::string& model_name() const;

  /// Connections currently open (HTTP and WebSocket). Any thread.
  size_t connections() const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace metronome::net
