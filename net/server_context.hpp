#pragma once
// What all connections of one http_server share: the actor system, the
// engine's handles, the options, the port registry and the id generator.
// Immutable after construction except for the atomics and the registry.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "caf/all.hpp"

#include "actors/engine.hpp"
#include "net/openai_request.hpp"
#include "net/request_sink.hpp"
#include "net/server_options.hpp"

namespace metronome::net {

struct server_context {
  server_context(caf::actor_system& sys, engine eng, server_options opts);

  caf::actor_system& sys;
  const engine eng;
  const server_options opts;
  /// The model name of the API.
  const std::string model_name;
  /// Unix seconds at the server's construction (/v1/models "created").
  const int64_t started;
  port_registry ports;

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
