// libFuzzer target: the YAML configuration (load_config_string, what
// `metronome serve --config` runs on metronome.yaml). Properties: a bad file
// is a config_error and nothing else; an accepted configuration printed with
// to_yaml() loads back to an equal server_config (to_yaml's contract).

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "config/config_loader.hpp"
#include "tests/fuzz/fuzz_check.hpp"

using namespace metronome;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view yaml{reinterpret_cast<const char*>(data), size};
  server_config cfg;
  try {
    cfg = load_config_string(yaml, "fuzz.yaml");
  } catch (const config_error&) {
    return 0;
  }
  const auto printed = to_yaml(cfg);
  try {
    auto again = load_config_string(printed, "printed");
    FUZZ_CHECK(again == cfg, "to_yaml() does not load back to an equal configuration");
  } catch (const config_error& e) {
    std::fprintf(stderr, "%s\n--- printed:\n%s\n", e.what(), printed.c_str());
    FUZZ_CHECK(false, "to_yaml() printed a configuration that does not load");
  }
  return 0;
}
