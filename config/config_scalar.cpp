#include "config/config_scalar.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <utility>

namespace metronome {

namespace {

struct byte_unit {
  std::string_view suffix;
  int64_t factor;
};

// Longest suffixes first so "MiB" is not read as "B".
constexpr std::array<byte_unit, 7> byte_units = {{
  {"KiB", int64_t{1} << 10},
  {"MiB", int64_t{1} << 20},
  {"GiB", int64_t{1} << 30},
  {"KB", 1000},
  {"MB", 1000 * 1000},
  {"GB", 1000 * 1000 * 1000},
  {"B", 1},
}};

} // namespace

std::optional<int64_t> parse_integer(std::string_view text) {
  if (!text.empty() && text.front() == '+')
    text.remove_prefix(1);
  if (text.empty())
    return std::nullopt;
  // A leading zero (`080`, `-07`) is refused: YAML 1.1 readers take `010` as
  // octal 8, so the value would depend on who reads the file.
  const std::string_view digits = text.front() == '-' ? text.substr(1) : text;
  if (digits.size() > 1 && digits.front() == '0')
    return std::nullopt;
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size())
    return std::nullopt;
  return value;
}

std::optional<double> parse_real(std::string_view text) {
  if (!text.empty() && text.front() == '+')
    text.remove_prefix(1);
  if (text.empty())
    return std::nullopt;
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size())
    return std::nullopt;
  return value;
}

std::optional<bool> parse_boolean(std::string_view text) {
  static constexpr std::array<std::string_view, 9> yes = {
    "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static constexpr std::array<std::string_view, 9> no = {
    "false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  if (std::find(yes.begin(), yes.end(), text) != yes.end())
    return true;
  if (std::find(no.begin(), no.end(), text) != no.end())
    return false;
  return std::nullopt;
}

std::optional<int64_t> parse_bytes(std::string_view text) {
  int64_t factor = 1;
  for (const auto& unit : byte_units) {
    if (text.ends_with(unit.suffix)) {
      text.remove_suffix(unit.suffix.size());
      while (!text.empty() && text.back() == ' ')
        text.remove_suffix(1);
      factor = unit.factor;
      break;
    }
  }
  auto value = parse_integer(text);
  if (!value || *value < 0 || *value > std::numeric_limits<int64_t>::max() / factor)
    return std::nullopt;
  return *value * factor;
}

std::string print_bytes(int64_t value) {
  // Binary units only, and only when exact, so the text reads back unchanged.
  for (auto [suffix, factor] : {std::pair{"GiB", int64_t{1} << 30},
                                std::pair{"MiB", int64_t{1} << 20},
                                std::pair{"KiB", int64_t{1} << 10}})
    if (value != 0 && value % factor == 0)
      return std::to_string(value / factor) + suffix;
  return std::to_string(value);
}

std::string print_real(double value) {
  std::array<char, 400> buf{};
  auto magnitude = std::fabs(value);
  auto format = (value == 0 || (magnitude >= 1e-4 && magnitude < 1e15))
                  ? std::chars_format::fixed
                  : std::chars_format::general;
  auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), value, format);
  return std::string(buf.data(), end);
}

bool valid_host(std::string_view host) {
  std::string s(host);
  unsigned char buf[16];
  if (inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1)
    return true;
  if (host.empty() || host.size() > 253)
    return false;
  size_t start = 0;
  while (start <= host.size()) {
    auto dot = host.find('.', start);
    auto label = host.substr(start, dot == std::string_view::npos ? std::string_view::npos
                                                                   : dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-')
      return false;
    for (char c : label)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-')
        return false;
    if (dot == std::string_view::npos)
      break;
    start = dot + 1;
  }
  return true;
}

std::string yaml_quote(std::string_view text) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "\"";
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += "\\x";
          out += hex[c >> 4];
          out += hex[c & 0xf];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

std::optional<host_port> parse_host_port(std::string_view text) {
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0)
    return std::nullopt;
  auto host = text.substr(0, colon);
  if (host.starts_with('[') && host.ends_with(']'))
    host = host.substr(1, host.size() - 2);
  const auto port_text = text.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5
      || port_text.find_first_not_of("0123456789") != std::string_view::npos)
    return std::nullopt;
  const auto port = parse_integer(port_text);
  if (!port || *port > 65535 || !valid_host(host))
    return std::nullopt;
  return host_port{std::string(host), uint16_t(*port)};
}

std::optional<std::vector<int32_t>> parse_token_bounds(std::string_view text,
                                                       std::string* problem) {
  // The limits of sched/token_groups.hpp (token_groups::max_bound,
  // max_bounds): the configuration library does not link the scheduler.
  constexpr int64_t max_bound = int64_t{1} << 20;
  constexpr size_t max_bounds = 8;
  auto fail = [&](std::string why) -> std::optional<std::vector<int32_t>> {
    if (problem)
      *problem = std::move(why);
    return std::nullopt;
  };
  std::vector<int32_t> out;
  if (text.empty())
    return out;
  while (true) {
    const auto comma = text.find(',');
    auto item = text.substr(0, comma);
    while (!item.empty() && item.front() == ' ')
      item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ')
      item.remove_suffix(1);
    const auto v = parse_integer(item);
    if (!v)
      return fail("expected token counts separated by commas (\"32,128\"), got \""
                  + std::string(item) + "\"");
    if (*v < 1 || *v > max_bound)
      return fail("bound " + std::string(item) + " is outside [1, " + std::to_string(max_bound)
                  + "]");
    if (!out.empty() && *v <= out.back())
      return fail("bounds must increase, got " + std::to_string(*v) + " after "
                  + std::to_string(out.back()));
    out.push_back(int32_t(*v));
    if (out.size() > max_bounds)
      return fail("at most " + std::to_string(max_bounds) + " bounds");
    if (comma == std::string_view::npos)
      break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

} // namespace metronome
