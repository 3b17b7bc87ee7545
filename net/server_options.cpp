#include "net/server_options.hpp"

#include <algorithm>
#include <cmath>

#include "config/server_config.hpp"

namespace metronome::net {

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
  return o;
}

} // namespace metronome::net
