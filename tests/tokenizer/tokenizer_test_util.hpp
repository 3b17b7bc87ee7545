#pragma once
// Shared helpers of the tokenizer tests: where the test data is, and a cache
// so each tokenizer folder is loaded once per test binary.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "model/tokenizer/tokenizer.hpp"

namespace metronome::test {

/// An environment variable set by ctest, else the value compiled in.
inline std::string test_env(const char* name, const char* compiled) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string(compiled);
}

inline std::filesystem::path testdata() {
#ifdef METRONOME_TEST_TESTDATA
  return test_env("METRONOME_TESTDATA", METRONOME_TEST_TESTDATA);
#else
  return test_env("METRONOME_TESTDATA", "../shared/testdata");
#endif
}

inline std::string metronome_bin() {
#ifdef METRONOME_TEST_BIN
  return test_env("METRONOME_BIN", METRONOME_TEST_BIN);
#else
  return test_env("METRONOME_BIN", "metronome");
#endif
}

inline std::filesystem::path work_dir() {
#ifdef METRONOME_TEST_WORK_DIR
  return test_env("METRONOME_WORK_DIR", METRONOME_TEST_WORK_DIR);
#else
  return test_env("METRONOME_WORK_DIR", "/tmp");
#endif
}

inline std::filesystem::path tokenizer_dir(const std::string& name) {
  return testdata() / "tokenizers" / name;
}

inline std::shared_ptr<const tokenizer> load_tokenizer(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const tokenizer>> cache;
  std::lock_guard<std::mutex> guard(mutex);
  auto& slot = cache[name];
  if (!slot)
    slot = tokenizer::load(tokenizer_dir(name));
  return slot;
}

inline std::string read_file(const std::filesystem::path& file, size_t max_bytes = SIZE_MAX) {
  std::ifstream in(file, std::ios::binary);
  std::string data;
  data.resize(std::min<size_t>(max_bytes, std::filesystem::file_size(file)));
  in.read(data.data(), std::streamsize(data.size()));
  data.resize(size_t(in.gcount()));
  return data;
}

} // namespace metronome::test
