#pragma once
// Settings of the network edge. tools/metronome/cmd_serve.cpp fills them from
// the `server` section of metronome.yaml (server_options_from()).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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
  /// Retry-After (seconds) of a 429, and of the 503 answering a connection
  /// over max_connections or a request while the server drains.
  std::chrono::seconds retry_after{1};
  /// Open client connections (HTTP and WebSocket) at once; 0: sized from
  /// the file descriptor limit when the server starts
  /// (connection_limit_for()). A connection over the limit has its one
  /// request answered (GET /health normally, anything else 503 with
  /// Retry-After) and is closed; up to `overflow_connections` of those are
  /// handled at once, later ones are closed without an answer.
  size_t max_connections = 0;
  /// Connections over max_connections that are answered at once (see there).
  size_t overflow_connections = 32;
  /// A keep-alive connection with no request started for this long is
  /// closed; a WebSocket that answers no ping for this long is dropped.
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(120)};
  /// A request (headers and body) must be read within this long of its
  /// first byte, or the connection is closed (slow, trickling clients).
  /// Also bounds the WebSocket handshake.
  std::chrono::milliseconds header_timeout{std::chrono::seconds(30)};
  /// An HTTP write that makes no progress for this long closes the
  /// connection (a client that stopped reading its stream). WebSocket
  /// sessions rely on the ping timeout (idle_timeout) instead.
  std::chrono::milliseconds write_timeout{std::chrono::seconds(60)};
  /// drain(): how long running requests may take to finish.
  std::chrono::milliseconds drain_timeout{std::chrono::seconds(30)};
  /// Output queued to one slow client beyond this closes its connection.
  size_t max_pending_write_bytes = size_t{16} << 20;
  /// The model name of the API; empty: the engine's status->model_name.
  std::string served_model_name;

  // -- access (net/access_control.hpp) -------------------------------------------

  /// Keys a client must present on every route but /health; empty: none
  /// needed. Already merged from the file and the environment (cmd_serve).
  std::vector<std::string> api_keys;
  /// GET /metrics answers without a key.
  bool metrics_without_key = false;
  /// GET / serves the chat page (net/chat_page.hpp); false: 404.
  bool chat_page = true;
  /// Access lines carry each request's prompt and output
  /// (logging.log_prompts; net/access_record.hpp).
  bool log_prompts = false;
  /// Browser origins allowed besides the server's own ("*": any).
  std::vector<std::string> allowed_origins;
  /// Host names accepted besides the bound address and localhost names.
  std::vector<std::string> allowed_hosts;
  /// Both set: every connection speaks TLS (PEM files, loaded by start()).
  std::string tls_cert_file;
  std::string tls_key_file;
};

/// The `server` section of metronome.yaml as server_options (served model
/// name excepted: it comes from the engine).
server_options server_options_from(const server_section& section);

/// The default max_connections for a process that may open `fd_limit`
/// files (the soft RLIMIT_NOFILE): the limit less 128 and a tenth, kept for
/// the process's other files (model, logs, event loop, the actor system),
/// the connections answered over the limit, and sockets closing; at least 1.
size_t connection_limit_for(uint64_t fd_limit);

/// The soft RLIMIT_NOFILE of this process (RLIM_INFINITY and failures: a
/// large number). Any thread.
uint64_t file_descriptor_limit();

} // namespace metronome::net
