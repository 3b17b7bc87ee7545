#include "model/environment.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace metronome {

void warn_ignored_setting(const char* var, const std::string& value, const std::string& instead) {
  std::fprintf(stderr, "metronome: %s: ignoring \"%s\" (%s)\n", var, value.c_str(),
               instead.c_str());
}

std::optional<long> env_integer(const char* var, long lo, long hi, const std::string& instead,
                                int base) {
  const char* v = std::getenv(var);
  if (!v || !*v)
    return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, base);
  if (end == v || *end != '\0' || errno == ERANGE || n < lo || n > hi) {
    warn_ignored_setting(var, v, instead);
    return std::nullopt;
  }
  return n;
}

} // namespace metronome
