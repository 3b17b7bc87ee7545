#pragma once
// Settings of the network edge. tools/metronome/cmd_serve.cpp fills them from
// the `server` section of metronome.yaml (server_options_from()).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace metronome {
struct server_section;
} // namespace metronome

namespace metronome::net {

struct server_options {
  /// Address to bind: an IPv4/IPv6 literal or a host name.
  std::string host = "127.0.0.1";
  /// 0 binds a free port; start() returns the one bound.
  uint16_t port = 8080;
  /// Larger request bodies get 413.
  size_t max_body_bytes = size_t{1} << 20;
  /// Larger request headers get 431.
  size_t max_header_bytes = size_t{16} << 10;
  /// Larger WebSocket messages close the connection with status 1009.
  size_t max_ws_message_bytes = size_t{1} << 20;
  /// Requests in flight at once on one WebSocket connection.
  int32_t max_streams_per_connection = 64;
  /// Threads running the io_context.
  int32_t io_threads = 2;
  /// generate_request::timeout of every request (the engine enforces it).
  std::chrono::milliseconds request_timeout{std::chrono::minutes(10)};
  /// Retry-After (seconds) of a 429.
  std::chrono::seconds retry_after{1};
  /// A keep-alive connection with no request for this long is closed; also
  /// bounds how long a client may take to send one request.
  std::chrono::seconds idle_timeout{120};
  /// A write that makes no progress for this long closes the connection
  /// (a client that stopped reading its stream).
  std::chrono::seconds write_timeout{60};
  /// Output queued to one slow client beyond this closes its connection.
  size_t max_pending_write_bytes = size_t{16} << 20;
  /// The model name of the API; empty: the engine's status->model_name.
  std::string served_model_name;
};

/// The `server` section of metronome.yaml as server_options (served model
/// name excepted: it comes from the engine).
server_options server_options_from(const server_section& section);

} // namespace metronome::net
