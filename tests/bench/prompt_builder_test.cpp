// Prompts cut to exact token counts (bench/serve/prompt_builder.hpp) with
// the real tokenizers of shared/testdata: the count the server will see
// (BOS included for a completions prompt, content only for chat) must equal
// the request, for many lengths and offsets.

#include <set>

#include <gtest/gtest.h>

#include "bench/serve/prompt_builder.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "tests/test_env.hpp"

namespace metronome::bench {
namespace {

std::filesystem::path testdata() {
  return test::env("TESTDATA");
}

std::shared_ptr<const tokenizer> load(const std::string& name) {
  return tokenizer::load(testdata() / "tokenizers" / name);
}

const std::filesystem::path corpus = testdata() / "corpora" / "moby_dick.txt";

class exact_counts : public ::testing::TestWithParam<std::string> {};

TEST_P(exact_counts, every_length_and_offset_is_hit_exactly) {
  auto tok = load(GetParam());
  for (bool special : {true, false}) {
    auto b = prompt_builder::from_file(tok, corpus, special, 400'000);
    ASSERT_GT(b.corpus_tokens(), 50'000);
    // Lengths from tiny to long, at consecutive offsets like a real run.
    const std::vector<int32_t> lengths = {2, 3, 5, 8, 13, 31, 64, 100, 129, 257, 513, 1000, 2048};
    int64_t offset = 0;
    std::set<std::string> texts;
    for (int round = 0; round < 3; ++round)
      for (int32_t n : lengths) {
        auto p = b.make(n, offset);
        ASSERT_EQ(p.tokens, n) << GetParam() << " special " << special << " offset " << offset;
        const auto ids
          = tok->encode(p.text, {.add_special_tokens = special, .parse_special = false});
        ASSERT_EQ(int32_t(ids.size()), n) << GetParam() << " '" << p.text.substr(0, 80) << "'";
        if (n >= 8) // one-token windows may well repeat
          texts.insert(p.text);
        offset += n;
      }
    EXPECT_EQ(texts.size(), 3 * (lengths.size() - 3)) << "distinct windows, distinct prompts";
  }
}

INSTANTIATE_TEST_SUITE_P(tokenizers, exact_counts,
                         ::testing::Values("llama3", "mistral", "qwen3", "gpt2"));

TEST(prompt_builder, counts_below_the_special_tokens_are_raised_to_the_minimum) {
  // Mistral's post-processor adds BOS (this llama3 tokenizer.json adds none).
  auto tok = load("mistral");
  auto b = prompt_builder::from_file(tok, corpus, true, 100'000);
  EXPECT_EQ(b.min_tokens(), 2) << "BOS and one token";
  auto p = b.make(1, 0);
  EXPECT_EQ(p.tokens, 2);
  EXPECT_EQ(b.count(p.text), 2);
  EXPECT_EQ(tok->encode(p.text).front(), 1) << "counted with BOS, as a completions server does";
  auto chat = prompt_builder::from_file(tok, corpus, false, 100'000);
  EXPECT_EQ(chat.min_tokens(), 1);
  EXPECT_EQ(chat.make(1, 5).tokens, 1);
}

TEST(prompt_builder, offsets_wrap_around_a_small_corpus) {
  auto tok = load("llama3");
  prompt_builder b(tok, "The quick brown fox jumps over the lazy dog. It was a bright cold day.",
                   true);
  const auto n = b.corpus_tokens();
  auto p = b.make(int32_t(n) * 3, n - 2); // longer than the corpus, across its end
  EXPECT_EQ(p.tokens, int32_t(n) * 3);
  EXPECT_EQ(b.count(p.text), int32_t(n) * 3);
}

TEST(prompt_builder, a_missing_corpus_is_named) {
  try {
    prompt_builder::from_file(load("llama3"), "/nonexistent/corpus.txt", true);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/corpus.txt"), std::string::npos);
  }
}

} // namespace
} // namespace metronome::bench
