// `metronome tokenize` on every tokenizer folder of the test data.

#include <array>
#include <cstdio>
#include <fstream>

#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include "tests/tokenizer/tokenizer_test_util.hpp"

namespace metronome::test {
namespace {

struct result {
  int code;
  std::string out;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s)
    q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

result run(const std::string& args) {
  const std::string cmd = quote(metronome_bin()) + " tokenize " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe))
    out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(tokenize_cli, llama3_matches_reference) {
  auto r = run("--tokenizer " + quote(tokenizer_dir("llama3").string())
               + " --text 'How are you doing?' --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("ids").get<std::vector<int32_t>>(),
            (std::vector<int32_t>{4438, 527, 499, 3815, 30}));
}

TEST(tokenize_cli, every_folder_encodes_and_decodes) {
  for (auto& entry : std::filesystem::directory_iterator(testdata() / "tokenizers")) {
    if (!entry.is_directory())
      continue;
    const auto dir = quote(entry.path().string());
    SCOPED_TRACE(entry.path().string());
    auto r = run("--tokenizer " + dir + " --text 'Hello world' --json --no-special");
    ASSERT_EQ(r.code, 0) << r.out;
    auto ids = nlohmann::json::parse(r.out).at("ids").get<std::vector<int32_t>>();
    ASSERT_FALSE(ids.empty());
    std::string list;
    for (auto id : ids) {
      if (!list.empty())
        list += ',';
      list += std::to_string(id);
    }
    r = run("--tokenizer " + dir + " --decode " + list + " --json");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(nlohmann::json::parse(r.out).at("text").get<std::string>(), "Hello world");
  }
}

TEST(tokenize_cli, file_input_and_errors) {
  auto file = work_dir() / "tokenize_cli_input.txt";
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file) << "<|eot_id|>";
  const auto dir = quote(tokenizer_dir("llama3").string());
  auto r = run("--tokenizer " + dir + " --file " + quote(file.string()) + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("ids"), nlohmann::json::array({128009}));
  r = run("--tokenizer " + dir + " --file " + quote(file.string()) + " --json --plain-special");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_GT(nlohmann::json::parse(r.out).at("ids").size(), 1u);

  r = run("--tokenizer /nonexistent --text x");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("tokenizer.json"), std::string::npos) << r.out;
  r = run("--tokenizer " + dir + " --decode 1,x");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--decode"), std::string::npos) << r.out;
}

} // namespace
} // namespace metronome::test
