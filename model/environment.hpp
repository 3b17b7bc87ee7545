#pragma once
// Environment switches: the benchmark and diagnosis settings of
// docs/configuration.md ("Environment switches"). They are read before any
// logger exists, so a value that is not understood is named on stderr, in
// one format, and the default is used.

#include <optional>
#include <string>

namespace metronome {

/// Writes `metronome: VAR: ignoring "value" (instead)` to stderr: var's value
/// was not understood, and `instead` says what was expected and what is used.
/// Any thread.
void warn_ignored_setting(const char* var, const std::string& value, const std::string& instead);

/// The integer in environment variable `var` when it is set, is a whole
/// number (strtol with `base`: 10, or 0 to accept 0x and 0 prefixes) and
/// lies in [lo, hi]; nullopt when it is unset or empty, and nullopt after
/// warn_ignored_setting(var, value, instead) when it is anything else. Reads
/// the environment on every call (callers keep the result). Any thread.
std::optional<long> env_integer(const char* var, long lo, long hi, const std::string& instead,
                                int base = 10);

} // namespace metronome
