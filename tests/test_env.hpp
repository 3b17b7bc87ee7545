#pragma once
// Where tests find the CLI, the shared testdata, the sources and a scratch
// folder: the environment (METRONOME_BIN, ...) wins over the paths compiled in
// by metronome_test() in tests/CMakeLists.txt.

#include <cstdlib>
#include <string>
#include <string_view>

namespace metronome::test {

/// The value of METRONOME_<name> from the environment or the build.
/// name is one of BIN, TESTDATA, SOURCE_DIR, WORK_DIR.
inline std::string env(std::string_view name) {
  std::string var = "METRONOME_" + std::string(name);
  if (const char* v = std::getenv(var.c_str()); v && *v)
    return v;
#ifdef METRONOME_TEST_BIN
  if (name == "BIN")
    return METRONOME_TEST_BIN;
  if (name == "TESTDATA")
    return METRONOME_TEST_TESTDATA;
  if (name == "SOURCE_DIR")
    return METRONOME_TEST_SOURCE_DIR;
  if (name == "WORK_DIR")
    return METRONOME_TEST_WORK_DIR;
#endif
  return {};
}

} // namespace metronome::test
