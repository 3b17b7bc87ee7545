#pragma once
// Client-provided text on its way into a log line: request ids, WebSocket
// ids, paths, header values, and prompts where logging.log_prompts asks.
// Escaped so that a client cannot end the line and forge the next one (log
// injection), and cut so that it cannot flood the log.

#include <cstddef>
#include <string>
#include <string_view>

namespace metronome {

/// `text` with control characters (below 0x20, and 0x7f) and backslashes
/// written as C escapes (\n, \r, \t, \\, \xNN), cut after `max_bytes` input
/// bytes with "..." appended. Any thread.
std::string log_text(std::string_view text, size_t max_bytes = 200);

} // namespace metronome
