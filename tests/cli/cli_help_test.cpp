// `metronome --help` and each subcommand's: every option's value type and
// default, and the error for a subcommand that does not exist.

#include <array>
#include <cctype>
#include <cstdio>
#include <regex>
#include <string>

#include <sys/wait.h>

#include <gtest/gtest.h>

#include "config/config_loader.hpp"
#include "config/config_schema.hpp"
#include "tests/test_env.hpp"

namespace metronome {
namespace {

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

/// Runs `metronome ARGS` (under a time limit: a command that should fail
/// must not start a server that never ends).
result run(const std::string& args) {
  const std::string cmd = "timeout 60 " + quote(test::env("BIN")) + " " + args + " 2>&1";
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

/// The help line of `option` ("--port"): from its name to the end of its
/// description, which CLI11 may put on the next line.
std::string option_line(const std::string& help, const std::string& option) {
  std::smatch m;
  const std::regex re("\\n  (?:-[a-z],)?" + std::regex_replace(option, std::regex("-"), "\\-")
                      + " ([^\\n]*(?:\\n {20,}[^\\n]*)?)");
  return std::regex_search(help, m, re) ? m[1].str() : std::string();
}

TEST(cli_help, serve_shows_each_flags_type_and_default) {
  const auto r = run("serve --help");
  ASSERT_EQ(r.code, 0) << r.out;
  // Written out here, not derived from the schema: what a user reads.
  const std::vector<std::pair<std::string, std::string>> expected = {
    {"--port", "INT +TCP port \\(0 = any free port\\) \\(server.port\\) \\[default: 8080\\]"},
    {"--host", "HOST .*\\[default: 127.0.0.1\\]"},
    {"--model", "PATH +Hugging Face model folder"},
    {"--device", "cpu\\|cuda:N .*\\[default: cpu\\]"},
    {"--gpu-memory-fraction", "FLOAT .*\\[default: 0.9\\]"},
    {"--policy", "\\{fcfs,ladb,srpt,ladb-literal\\}\\s.*\\[default: ladb\\]"},
    {"--kv-cache-dtype", "\\{bf16,fp8,fp8_e5m2\\}\\s.*\\[default: bf16\\]"},
    {"--log-format", "\\{text,json\\} .*\\[default: text\\]"},
    {"--api-key", "KEY,\\.\\.\\. .*\\(server.api_keys\\)$"},
    {"--config", "PATH +YAML configuration file$"},
    {"--set", "KEY=VALUE \\.\\.\\. +Override any key"},
  };
  for (const auto& [option, pattern] : expected) {
    const auto line = option_line(r.out, option);
    EXPECT_TRUE(std::regex_search(line, std::regex(pattern))) << option << ": " << line;
  }
  // Every shorthand flag: its key's type, and its default where it has one.
  for (const auto& f : config_flags()) {
    const auto* key = find_config_key(f.key_path);
    ASSERT_NE(key, nullptr) << f.flag;
    const auto line = option_line(r.out, std::string(f.flag));
    EXPECT_TRUE(line.starts_with(key->metavar) && line.size() > key->metavar.size()
                && std::isspace(static_cast<unsigned char>(line[key->metavar.size()])))
      << f.flag << ": " << line;
    EXPECT_EQ(line.starts_with("TEXT"), key->metavar == "TEXT") << f.flag;
    const auto def = default_text(*key);
    if (!def.empty())
      EXPECT_NE(line.find("[default: " + def + "]"), std::string::npos) << f.flag << ": " << line;
    else
      EXPECT_EQ(line.find("[default:"), std::string::npos) << f.flag << ": " << line;
  }
}

TEST(cli_help, other_subcommands_show_types_and_defaults) {
  const auto generate = run("generate --help");
  ASSERT_EQ(generate.code, 0) << generate.out;
  EXPECT_TRUE(std::regex_search(option_line(generate.out, "--max-tokens"),
                                std::regex("^INT\\s.*\\[default: 32\\]")))
    << generate.out;
  EXPECT_TRUE(std::regex_search(option_line(generate.out, "--temperature"),
                                std::regex("^FLOAT\\s.*\\[default: 1\\]")))
    << generate.out;
  EXPECT_TRUE(std::regex_search(option_line(generate.out, "--model"), std::regex("^PATH\\s")))
    << generate.out;
  EXPECT_TRUE(std::regex_search(option_line(generate.out, "--kv-cache-dtype"),
                                std::regex("^\\{bf16,fp8\\}\\s.*\\[default: bf16\\]")))
    << generate.out;

  const auto make_model = run("make-model --help");
  ASSERT_EQ(make_model.code, 0) << make_model.out;
  EXPECT_TRUE(std::regex_search(option_line(make_model.out, "--preset"),
                                std::regex("^\\{tiny-llama3,[a-z0-9,-]*\\}\\s")))
    << make_model.out;
  EXPECT_TRUE(std::regex_search(option_line(make_model.out, "--max-shard-mb"),
                                std::regex("^UINT\\s.*\\[default: 5000\\]")))
    << make_model.out;

  const auto bench = run("bench-serve --help");
  ASSERT_EQ(bench.code, 0) << bench.out;
  EXPECT_TRUE(std::regex_search(option_line(bench.out, "--timeout-s"),
                                std::regex("^FLOAT\\s.*\\[default: 600\\]")))
    << bench.out;
  EXPECT_TRUE(std::regex_search(option_line(bench.out, "--url"),
                                std::regex("^URL\\s.*\\[default: http://127.0.0.1:8080\\]")))
    << bench.out;

  // Every option of every subcommand: a type, and no default written
  // CLI11's way ("TYPE=default") or left in the description.
  for (const char* sub : {"serve", "generate", "tokenize", "make-model", "replay", "bench-serve"}) {
    const auto r = run(std::string(sub) + " --help");
    ASSERT_EQ(r.code, 0) << sub << "\n" << r.out;
    EXPECT_EQ(r.out.find("=default"), std::string::npos) << sub;
    EXPECT_FALSE(std::regex_search(r.out, std::regex("\\(default[: ][^)]*[0-9]")))
      << sub << ": a default in the description\n" << r.out;
    EXPECT_FALSE(std::regex_search(r.out, std::regex("\\n  --[a-z-]+ [A-Z]+:")))
      << sub << ": a validator in the type\n" << r.out;
  }
}

TEST(cli_help, an_unknown_subcommand_is_named) {
  const auto r = run("bogus --port 1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("unknown subcommand 'bogus'"), std::string::npos) << r.out;
  for (const char* sub : {"serve", "generate", "tokenize", "make-model", "replay", "bench-serve"})
    EXPECT_NE(r.out.find(sub), std::string::npos) << sub << " is not listed:\n" << r.out;
  EXPECT_EQ(r.out.find("A subcommand is required"), std::string::npos) << r.out;

  const auto none = run("");
  EXPECT_NE(none.code, 0) << none.out;
  const auto top = run("--help");
  EXPECT_EQ(top.code, 0) << top.out;
  EXPECT_NE(top.out.find("serve"), std::string::npos) << top.out;
  const auto version = run("--version");
  EXPECT_EQ(version.code, 0) << version.out;
}

} // namespace
} // namespace metronome
