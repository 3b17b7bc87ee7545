#pragma once
// Server-sent events of an OpenAI-compatible streaming response, turned
// into native types at the edge: the byte stream is cut into events
// ("data: ..." lines up to a blank line), and each event's JSON into a
// stream_chunk (text, usage, error, end marker). Nothing past this file
// sees JSON.
//
// Threading: an sse_parser belongs to one response and is used on the
// thread that reads it (the load client's io thread). Not thread-safe.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace metronome::bench {

enum class api_endpoint { completions, chat };

/// One event of the stream.
struct stream_chunk {
  /// The content it adds: choices[0].text (completions) or
  /// choices[0].delta.content (chat); empty for role-only, finish and usage
  /// chunks.
  std::string text;
  /// choices[0].finish_reason when set ("length", "stop", ...).
  std::string finish_reason;
  /// The usage chunk (stream_options.include_usage).
  std::optional<int32_t> prompt_tokens;
  std::optional<int32_t> completion_tokens;
  /// An error event ({"error": {"message": ...}}) or an event that is not
  /// a JSON object: what went wrong, for the request's error text.
  std::string error;
  /// "data: [DONE]".
  bool done = false;
};

/// Parses one event's data (the text after "data: ").
stream_chunk parse_stream_chunk(std::string_view data, api_endpoint endpoint);

/// Incremental SSE framing: feed bytes as they arrive, get whole events.
class sse_parser {
public:
  explicit sse_parser(api_endpoint endpoint) : endpoint_(endpoint) {}

  /// Appends `bytes`; returns the chunks of the events they complete, in
  /// order. Lines other than "data:" (comments, "event:", "id:") are
  /// ignored; "\r\n" and "\n" both end lines.
  std::vector<stream_chunk> feed(std::string_view bytes);

private:
  api_endpoint endpoint_;
  std::string line_;
  std::string data_;
  bool have_data_ = false;
};

} // namespace metronome::bench
