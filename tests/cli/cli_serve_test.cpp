// `metronome serve` refusing a configuration at start-up, run as a user
// would: one clear message and a non-zero exit, before anything listens.

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <sys/wait.h>

#include <gtest/gtest.h>

#include "tests/test_env.hpp"

namespace metronome {
namespace {

namespace fs = std::filesystem;

struct result {
  int code = -1;
  std::string out; ///< stdout and stderr
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s)
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// Runs `metronome serve ARGS` on a free port, under a time limit (a server
/// that starts would never end on its own: exit code 124).
result serve(const std::string& args) {
  const std::string cmd =
    "timeout 60 " + quote(test::env("BIN")) + " serve --port 0 " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  result r;
  if (pipe == nullptr)
    return r;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe))
    r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

fs::path scratch() {
  auto dir = fs::path(test::env("WORK_DIR")) / "cli_serve_test";
  fs::create_directories(dir);
  return dir;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const char* const formats = "the formats understood are Llama 3, Llama 3.1+, Llama 2, Mistral, "
                            "ChatML/Qwen, Qwen3, plain text";

TEST(cli_serve, a_missing_chat_template_file_is_refused_naming_it) {
  const auto file = scratch() / "no-such-template.jinja";
  fs::remove(file);
  const auto r = serve("--chat-template " + quote(file.string()));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "error: " + file.string() + ": cannot read the chat template"))
    << r.out;
  EXPECT_FALSE(contains(r.out, "serving")) << r.out;
}

TEST(cli_serve, a_chat_template_file_of_an_unknown_format_is_refused_naming_it) {
  const auto file = scratch() / "vicuna.jinja";
  std::ofstream(file) << "{% for message in messages %}{{ message['role'] | upper }}: "
                         "{{ message['content'] }}\n{% endfor %}ASSISTANT:";
  const auto r = serve("--chat-template " + quote(file.string()));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "error: " + file.string()
                                + ": not a chat template of a recognised format; " + formats))
    << r.out;
  EXPECT_FALSE(contains(r.out, "serving")) << r.out;
}

TEST(cli_serve, a_chat_template_that_is_no_name_and_no_path_is_a_configuration_error) {
  const auto r = serve("--chat-template vicuna");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "--chat-template: model.chat_template: expected \"\", llama3, "
                              "llama2, mistral, chatml, or the path of a Jinja template file"))
    << r.out;
}

} // namespace
} // namespace metronome
