#include "net/server_options.hpp"

#include <algorithm>
#include <cmath>

#include <sys/resource.h>

#include "config/server_config.hpp"

namespace metronome::net {

namespace {

/// Seconds from the configuration (finite, checked by the schema) as
/// milliseconds; at least 1 ms where the value is positive.
std::chrono::milliseconds to_ms(double seconds) {
  auto ms = int64_t(std::llround(std::max(seconds, 0.0) * 1000.0));
  return std::chrono::milliseconds(seconds > 0 ? std::max<int64_t>(ms, 1) : 0);
}

} // namespace

server_options server_options_from(const server_section& s) {
  server_options o;
  o.host = s.host;
  o.port = uint16_t(std::clamp(s.port, 0, 65535));
  o.max_body_bytes = size_t(std::max<int64_t>(s.max_body_bytes, 0));
  o.max_ws_message_bytes = size_t(std::max<int64_t>(s.max_ws_message_bytes, 0));
  o.max_streams_per_connection = std::max(s.max_concurrent_streams_per_connection, 1);
  o.io_threads = std::max(s.io_threads, 1);
  o.request_timeout = std::chrono::milliseconds(int64_t(std::llround(s.request_timeout_s * 1000.0)));
  o.retry_after = std::chrono::seconds(std::max(s.retry_after_s, 1));
  o.max_connections = size_t(std::max(s.max_connections, 0));
  o.idle_timeout = to_ms(s.idle_timeout_s);
  o.header_timeout = to_ms(s.header_timeout_s);
  o.write_timeout = to_ms(s.write_timeout_s);
  o.drain_timeout = to_ms(s.drain_timeout_s);
  o.api_keys = s.api_keys;
  o.metrics_without_key = s.metrics_without_key;
  o.chat_page = s.chat_page;
  o.allowed_origins = s.allowed_origins;
  o.allowed_hosts = s.allowed_hosts;
  o.tls_cert_file = s.tls.cert_file;
  o.tls_key_file = s.tls.key_file;
  return o;
}

size_t connection_limit_for(uint64_t fd_limit) {
  const uint64_t headroom = 128 + fd_limit / 10;
  return fd_limit > headroom + 1 ? size_t(fd_limit - headroom) : 1;
}

uint64_t file_descriptor_limit() {
  constexpr uint64_t unlimited = uint64_t{1} << 20;
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
    return unlimited;
  return uint64_t(rl.rlim_cur);
}

} // namespace metronome::net
