#include "tests/model/test_support.hpp"

#include <array>
#include <cstdio>
#include <map>
#include <mutex>

namespace metronome::test {

namespace fs = std::filesystem;

fs::path scratch_dir(const std::string& name) {
  auto base = env("WORK_DIR");
  fs::path root = base.empty() ? fs::temp_directory_path() / "metronome-test" : fs::path(base);
  auto dir = root / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

namespace {

/// Removes this process's model folders when the test program ends.
struct model_folders {
  std::map<std::pair<std::string, uint64_t>, fs::path> made;
  ~model_folders() {
    std::error_code ec;
    for (const auto& [_, dir] : made)
      fs::remove_all(dir, ec);
  }
};

} // namespace

fs::path tiny_model(const std::string& preset, uint64_t seed) {
  static std::mutex mtx;
  static model_folders folders;
  auto& made = folders.made;
  std::lock_guard guard{mtx};
  auto key = std::make_pair(preset, seed);
  if (auto i = made.find(key); i != made.end())
    return i->second;
  make_model_options o;
  o.config = *preset_config(preset);
  o.seed = seed;
  o.out_dir = scratch_dir("models-" + std::to_string(::getpid()) + "-" + preset + "-"
                          + std::to_string(seed));
  make_model(o);
  made[key] = o.out_dir;
  return o.out_dir;
}

fs::path served_model(const std::string& preset, const std::string& tokenizer) {
  static std::mutex mtx;
  static model_folders folders;
  std::lock_guard guard{mtx};
  auto key = std::make_pair(preset + "+" + tokenizer, uint64_t{7});
  if (auto i = folders.made.find(key); i != folders.made.end())
    return i->second;
  make_model_options o;
  o.config = *preset_config(preset);
  o.seed = 7;
  o.tokenizer_dir = env("TESTDATA") + "/tokenizers/" + tokenizer;
  o.out_dir = scratch_dir("served-" + std::to_string(::getpid()) + "-" + preset);
  make_model(o);
  folders.made[key] = o.out_dir;
  return o.out_dir;
}

command_result run_command(const std::string& cmd) {
  command_result r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p)
    return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0)
    r.output.append(buf.data(), n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

} // namespace metronome::test
