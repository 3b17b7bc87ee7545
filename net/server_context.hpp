#pragma once
// What all connections of one http_server share: the actor system, the
// engine's handles, the options, the port registry, the id generator, the
// connection and request gauges and the drain flag. Immutable after
// construction except for the atomics and the registry.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "caf/all.hpp"

#include <boost/asio/ssl/context.hpp>

#include "actors/engine.hpp"
#include "net/access_control.hpp"
#include "net/openai_request.hpp"
#include "net/request_sink.hpp"
#include "net/access_record.hpp"
#include "net/server_options.hpp"

namespace metronome::net {

/// One unit of a server gauge (connections open, requests in flight),
/// counted while the slot lives: whatever way its owner ends (answered,
/// closed, cancelled, destroyed with the io_context), the gauge goes back
/// down. Move-only; the gauge must outlive the slot (sessions keep the
/// server_context alive). Any thread.
class gauge_slot {
public:
  gauge_slot() = default;

  explicit gauge_slot(std::atomic<size_t>& gauge) : gauge_(&gauge) {
    gauge.fetch_add(1, std::memory_order_relaxed);
  }

  gauge_slot(gauge_slot&& other) noexcept : gauge_(std::exchange(other.gauge_, nullptr)) {}

  gauge_slot& operator=(gauge_slot&& other) noexcept {
    if (this != &other) {
      release();
      gauge_ = std::exchange(other.gauge_, nullptr);
    }
    return *this;
  }

  gauge_slot(const gauge_slot&) = delete;
  gauge_slot& operator=(const gauge_slot&) = delete;

  ~gauge_slot() {
    release();
  }

  /// Counts down now (idempotent).
  void release() {
    if (auto* g = std::exchange(gauge_, nullptr))
      g->fetch_sub(1, std::memory_order_relaxed);
  }

private:
  std::atomic<size_t>* gauge_ = nullptr;
};

struct server_context {
  /// Loads the TLS certificate and key when opts names them; throws
  /// std::runtime_error naming the file that cannot be used.
  server_context(caf::actor_system& sys, engine eng, server_options opts);

  caf::actor_system& sys;
  const engine eng;
  const server_options opts;
  /// The model name of the API.
  const std::string model_name;
  /// Unix seconds at the server's construction (/v1/models "created").
  const int64_t started;
  port_registry ports;
  /// The TLS context every connection handshakes with; null: plain TCP.
  const std::shared_ptr<boost::asio::ssl::context> tls;
  /// Host, Origin, API key and Content-Type checks of every request.
  const access_control access;

  /// What each access line reports to the engine's HTTP response counters.
  access_record::observer response_counter() const;

  // -- gauges and the drain (atomics, any thread) ----------------------------------

  /// Connections open within max_connections (HTTP and WebSocket; a
  /// connection keeps its slot through the upgrade).
  std::atomic<size_t> connections{0};
  /// Connections over max_connections being answered and closed.
  std::atomic<size_t> overflow_connections{0};
  /// Generation requests in progress: HTTP from the request until its last
  /// byte is written (or the connection closes), WebSocket until its final
  /// event is queued.
  std::atomic<size_t> requests_in_flight{0};
  /// Set once by http_server::drain(): new requests get 503 shutting_down,
  /// /health answers 503 "draining".
  std::atomic<bool> draining{false};

  /// The parser's view of the server.
  parse_defaults defaults() const;

  /// A fresh, unique "chatcmpl-..." / "cmpl-..." id. Any thread.
  std::string new_request_id(api_kind kind);

  /// The engine is loaded and not degraded.
  bool ready() const;

  /// engine_status::kv_cache_strategy, or "" without a status.
  std::string kv_cache_strategy() const;

private:
  const uint64_t salt_;
  std::atomic<uint64_t> next_id_{1};
};

} // namespace metronome::net
