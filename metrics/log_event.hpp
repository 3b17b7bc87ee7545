#pragma once
// The log's output, for operators (docs/operations.md): every line on
// stderr, as text (the default) or one JSON object a line
// (`--log-format json`, logging.format), and structured events (the access
// line of each request, the engine's stats line) that come out as
// `name key=value ...` in text and as JSON fields in JSON.
//
// Design note. spdlog formats a line in the thread that logs it (the
// loggers here are synchronous), so an event shows itself to the JSON
// formatter through a thread-local pointer for the duration of that one
// call, and the formatter writes its fields; ordinary spdlog calls are
// unaffected and become {"msg": ...}. Any other formatter (text, a test's)
// sees the event's text rendering as the message.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <spdlog/spdlog.h>

namespace metronome {

enum class log_format : uint8_t { text, json };

/// Replaces the default logger with one writing to stderr in `format` at
/// `level`. Call on the main thread before other threads log (main() once
/// for text, `serve` again with the configured format).
void configure_logging(log_format format, spdlog::level::level_enum level);

/// A formatter writing one JSON object per line: {"time" (UTC, ISO 8601,
/// milliseconds), "level", then an event's fields or "msg"}. Exposed for
/// tests, which put it on their own sinks.
std::unique_ptr<spdlog::formatter> make_json_formatter();

/// One structured log line: a name and fields in the order added. Strings
/// are client-safe in both renderings (text: log_text escaping and quotes
/// where needed; JSON: JSON escaping, invalid UTF-8 replaced). Build it,
/// then write() it; any thread.
class log_event {
public:
  explicit log_event(std::string_view name);

  log_event& add(std::string_view key, std::string_view value, size_t max_bytes = 200);
  log_event& add(std::string_view key, const char* value) {
    return add(key, std::string_view(value));
  }
  log_event& add(std::string_view key, int64_t value);
  log_event& add(std::string_view key, int32_t value) {
    return add(key, int64_t(value));
  }
  /// Written with `decimals` digits after the point (JSON: a number).
  log_event& add(std::string_view key, double value, int decimals);
  /// JSON null; text "-".
  log_event& add_null(std::string_view key);

  /// `name key=value ...`, as the text format writes it.
  std::string text() const;

  /// `"event":name,"key":value,...`: the members the JSON format writes
  /// after "time" and "level" (no braces).
  std::string json() const;

  /// Logs the event at `level` on the default logger.
  void write(spdlog::level::level_enum level) const;

private:
  struct field {
    std::string key;
    std::variant<std::monostate, std::string, int64_t, double> value;
    int decimals = 0;
  };

  std::string name_;
  std::vector<field> fields_;
};

} // namespace metronome
