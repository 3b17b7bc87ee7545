// The environment switches' parser (model/environment.hpp): what it takes,
// and that what it does not take is named on stderr and left to the default.

#include "model/environment.hpp"

#include <cstdlib>
#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace metronome {
namespace {

constexpr const char* var = "METRONOME_TEST_ENV_INTEGER";

/// env_integer(var, lo, hi) with var set to `value` (unset for nullptr), and
/// what it wrote to stderr.
std::optional<long> parse(const char* value, long lo, long hi, std::string* err, int base = 10) {
  if (value)
    ::setenv(var, value, 1);
  else
    ::unsetenv(var);
  testing::internal::CaptureStderr();
  const auto got = env_integer(var, lo, hi, "expected 1 to 8; 4", base);
  *err = testing::internal::GetCapturedStderr();
  ::unsetenv(var);
  return got;
}

TEST(environment, env_integer_takes_whole_numbers_in_range) {
  std::string err;
  EXPECT_EQ(parse("3", 1, 8, &err), 3);
  EXPECT_EQ(err, "");
  EXPECT_EQ(parse("8", 1, 8, &err), 8);
  EXPECT_EQ(parse("0x5", 0, 7, &err, 0), 5);
  EXPECT_EQ(err, "");
  EXPECT_EQ(parse(nullptr, 1, 8, &err), std::nullopt);
  EXPECT_EQ(err, "") << "unset is the default, silently";
  EXPECT_EQ(parse("", 1, 8, &err), std::nullopt);
  EXPECT_EQ(err, "");
}

TEST(environment, env_integer_names_what_it_ignores) {
  for (const char* bad : {"abc", "3x", "0", "9", "-1", "0x5", "99999999999999999999999"}) {
    SCOPED_TRACE(bad);
    std::string err;
    EXPECT_EQ(parse(bad, 1, 8, &err), std::nullopt);
    EXPECT_EQ(err, std::string("metronome: ") + var + ": ignoring \"" + bad
                     + "\" (expected 1 to 8; 4)\n");
  }
}

} // namespace
} // namespace metronome
