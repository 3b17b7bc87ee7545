#pragma once
// The scalar syntax of metronome.yaml and of `--set key=value`: how a value's
// text becomes an integer, number, boolean or byte count, and back. Strict on
// purpose: decimal integers only (YAML 1.1's octal "010" and yaml-cpp's hex
// are not numbers here), finite numbers, a fixed set of boolean words.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace metronome {

/// A decimal integer with an optional sign; nothing else (no octal, no hex,
/// no fraction, no spaces).
std::optional<int64_t> parse_integer(std::string_view text);

/// A decimal number ("0.9", "1e-3"); "inf" and "nan" parse too, and are then
/// refused by range checks.
std::optional<double> parse_real(std::string_view text);

/// true/false, yes/no, on/off (lower case, Capitalised or UPPER CASE).
std::optional<bool> parse_boolean(std::string_view text);

/// A byte count: an integer, or an integer and a unit, with an optional
/// space: KiB, MiB, GiB (1024-based), KB, MB, GB (1000-based), B.
std::optional<int64_t> parse_bytes(std::string_view text);

/// A byte count as parse_bytes reads it back: "3MiB" where exact, else bytes.
std::string print_bytes(int64_t value);

/// Shortest text that reads back as the same double: plain decimals in the
/// range people write by hand (0.9, 300, 1000000), exponent notation beyond.
std::string print_real(double value);

/// An IPv4 or IPv6 literal, or a DNS host name (RFC 1123 labels).
bool valid_host(std::string_view host);

/// A TCP endpoint, HOST:PORT ([IPv6]:PORT for an IPv6 literal).
struct host_port {
  std::string host;
  uint16_t port = 0;
};

/// HOST:PORT with a valid_host host and a decimal port in [0, 65535];
/// nullopt otherwise.
std::optional<host_port> parse_host_port(std::string_view text);

/// batching.token_groups: "" (none) or token counts separated by commas
/// ("32,128"), each in [1, 1048576], strictly increasing, at most 8 (the
/// bounds sched/token_groups.hpp accepts). `problem` (when not null) says
/// what is wrong when nullopt is returned.
std::optional<std::vector<int32_t>> parse_token_bounds(std::string_view text,
                                                       std::string* problem = nullptr);

/// Quotes `text` as a YAML double-quoted scalar (escaping \, ", control
/// characters).
std::string yaml_quote(std::string_view text);

} // namespace metronome
