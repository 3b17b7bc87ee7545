#include "metrics/log_event.hpp"

#include <chrono>
#include <cmath>
#include <ctime>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include "metrics/log_text.hpp"

namespace metronome {

namespace {

/// The event being written on this thread (see the top of log_event.hpp),
/// or null.
thread_local const log_event* current_event = nullptr;

/// The text format's pattern: local time, level, message.
constexpr const char* text_pattern = "[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v";

/// A JSON string literal of `s`; invalid UTF-8 becomes U+FFFD, so a client's
/// bytes can neither break the line nor the JSON.
std::string json_string(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', false,
                                             nlohmann::json::error_handler_t::replace);
}

class json_formatter final : public spdlog::formatter {
public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    using namespace std::chrono;
    const auto t = msg.time;
    const auto secs = time_point_cast<seconds>(t);
    const auto ms = duration_cast<milliseconds>(t - secs).count();
    std::time_t tt = system_clock::to_time_t(secs);
    std::tm utc{};
    gmtime_r(&tt, &utc);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &utc);
    const auto level = spdlog::level::to_string_view(msg.level);
    std::string line = fmt::format(R"({{"time":"{}.{:03}Z","level":"{}",)", stamp, ms,
                                   std::string_view(level.data(), level.size()));
    if (current_event)
      line += current_event->json();
    else
      line += "\"msg\":" + json_string(std::string_view(msg.payload.data(), msg.payload.size()));
    line += "}\n";
    dest.append(line.data(), line.data() + line.size());
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<json_formatter>();
  }
};

/// A text value: escaped, and quoted when it holds a blank, a quote or an
/// '=' (or is empty), so `key=value` pairs split unambiguously.
std::string text_value(std::string_view s) {
  auto escaped = log_text(s, s.size());
  if (!escaped.empty() && escaped.find_first_of(" \"=") == std::string::npos)
    return escaped;
  std::string out = "\"";
  for (char c : escaped) {
    if (c == '"')
      out += '\\';
    out += c;
  }
  return out + "\"";
}

} // namespace

// -- set-up -------------------------------------------------------------------------

void configure_logging(log_format format, spdlog::level::level_enum level) {
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  if (format == log_format::json)
    sink->set_formatter(make_json_formatter());
  else
    sink->set_formatter(std::make_unique<spdlog::pattern_formatter>(text_pattern));
  auto logger = std::make_shared<spdlog::logger>("metronome", std::move(sink));
  logger->set_level(level);
  spdlog::set_default_logger(std::move(logger));
  spdlog::set_level(level);
}

std::unique_ptr<spdlog::formatter> make_json_formatter() {
  return std::make_unique<json_formatter>();
}

// -- log_event ------------------------------------------------------------------------

log_event::log_event(std::string_view name) : name_(name) {}

log_event& log_event::add(std::string_view key, std::string_view value, size_t max_bytes) {
  std::string v(value.substr(0, std::min(value.size(), max_bytes)));
  if (value.size() > max_bytes)
    v += "...";
  fields_.push_back({std::string(key), std::move(v), 0});
  return *this;
}

log_event& log_event::add(std::string_view key, int64_t value) {
  fields_.push_back({std::string(key), value, 0});
  return *this;
}

log_event& log_event::add(std::string_view key, double value, int decimals) {
  fields_.push_back({std::string(key), value, decimals});
  return *this;
}

log_event& log_event::add_null(std::string_view key) {
  fields_.push_back({std::string(key), std::monostate{}, 0});
  return *this;
}

std::string log_event::text() const {
  std::string out = name_;
  for (const auto& f : fields_) {
    out += ' ';
    out += f.key;
    out += '=';
    if (auto* s = std::get_if<std::string>(&f.value))
      out += text_value(*s);
    else if (auto* i = std::get_if<int64_t>(&f.value))
      out += std::to_string(*i);
    else if (auto* d = std::get_if<double>(&f.value))
      out += fmt::format("{:.{}f}", *d, f.decimals);
    else
      out += '-';
  }
  return out;
}

std::string log_event::json() const {
  std::string out = "\"event\":" + json_string(name_);
  for (const auto& f : fields_) {
    out += ',';
    out += json_string(f.key);
    out += ':';
    if (auto* s = std::get_if<std::string>(&f.value))
      out += json_string(*s);
    else if (auto* i = std::get_if<int64_t>(&f.value))
      out += std::to_string(*i);
    else if (auto* d = std::get_if<double>(&f.value))
      out += std::isfinite(*d) ? fmt::format("{:.{}f}", *d, f.decimals) : "null";
    else
      out += "null";
  }
  return out;
}

void log_event::write(spdlog::level::level_enum level) const {
  auto* logger = spdlog::default_logger_raw();
  if (!logger->should_log(level))
    return;
  current_event = this;
  logger->log(level, "{}", text());
  current_event = nullptr;
}

} // namespace metronome
