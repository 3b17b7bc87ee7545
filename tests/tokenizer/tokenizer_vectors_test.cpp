// Reference vectors: every case of vectors.json for llama3 and llama2
// (transformers.js test suite) and llama3_lenml / mistral_lenml (the @lenml
// packages' encoder) must come out id for id, token for token, and decode
// back to the reference text.

#include <nlohmann/json.hpp>

#include "tests/tokenizer/tokenizer_test_util.hpp"

namespace metronome::test {
namespace {

using nlohmann::json;

const json& vectors() {
  static const json v = json::parse(read_file(testdata() / "tokenizers" / "vectors.json"));
  return v;
}

std::vector<int32_t> ids_of(const json& j) {
  return j.get<std::vector<int32_t>>();
}

// transformers.js cases: encode with the tokenizer's defaults, decode with
// special tokens kept and clean_up_tokenization_spaces as the config says.
void check_transformers_js(const std::string& name) {
  auto tok = load_tokenizer(name);
  const auto& cases = vectors().at(name);
  ASSERT_FALSE(cases.empty());
  for (auto it = cases.begin(); it != cases.end(); ++it) {
    SCOPED_TRACE(name + "/" + it.key());
    const auto& c = it.value();
    const auto text = c.at("text").get<std::string>();
    const auto expected = ids_of(c.at("ids"));
    const auto ids = tok->encode(text);
    EXPECT_EQ(ids, expected);
    // Tokens after the added BOS line up with the reference token strings.
    const auto& tokens = c.at("tokens");
    const size_t offset = expected.size() - tokens.size();
    for (size_t i = 0; i < tokens.size() && i + offset < ids.size(); ++i)
      EXPECT_EQ(tok->id_to_token(ids[i + offset]).value_or("<none>"),
                tokens[i].get<std::string>());
    const auto decoded =
      tok->decode(expected, {.skip_special_tokens = false,
                             .clean_up_spaces = tok->clean_up_tokenization_spaces()});
    EXPECT_EQ(decoded, c.at("decoded").get<std::string>());
  }
}

void check_lenml(const std::string& name, const std::string& folder) {
  auto tok = load_tokenizer(folder);
  const auto& cases = vectors().at(name);
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    const auto text = c.at("text").get<std::string>();
    SCOPED_TRACE(name + ": '" + text + "'");
    const auto without = ids_of(c.at("ids_no_special"));
    EXPECT_EQ(tok->encode(text, {.add_special_tokens = false}), without);
    EXPECT_EQ(tok->encode(text), ids_of(c.at("ids_with_special")));
    // The reference's "decode" is the decoding of ids_no_special, special
    // tokens kept (it keeps "<|begin_of_text|>" parsed from the text).
    EXPECT_EQ(tok->decode(without, false), c.at("decode").get<std::string>());
  }
}

TEST(tokenizer_vectors, llama3_transformers_js) {
  check_transformers_js("llama3");
}

TEST(tokenizer_vectors, llama2_transformers_js) {
  check_transformers_js("llama2");
}

TEST(tokenizer_vectors, llama3_lenml) {
  check_lenml("llama3_lenml", "llama3");
}

TEST(tokenizer_vectors, mistral_lenml) {
  check_lenml("mistral_lenml", "mistral");
}

TEST(tokenizer_vectors, config_tokens) {
  auto llama3 = load_tokenizer("llama3");
  EXPECT_EQ(llama3->bos_id(), 128000);
  EXPECT_EQ(llama3->eos_id(), 128001);
  EXPECT_EQ(llama3->vocab_size(), 128256);
  EXPECT_TRUE(llama3->is_special(128009));
  EXPECT_FALSE(llama3->is_special(9906));
  EXPECT_EQ(llama3->token_to_id("<|eot_id|>"), 128009);
  auto mistral = load_tokenizer("mistral");
  EXPECT_EQ(mistral->bos_id(), 1);
  EXPECT_EQ(mistral->eos_id(), 2);
  EXPECT_EQ(mistral->vocab_size(), 32000);
  auto qwen = load_tokenizer("qwen3");
  EXPECT_FALSE(qwen->bos_id().has_value());
  EXPECT_EQ(qwen->eos_id(), qwen->token_to_id("<|im_end|>"));
  EXPECT_EQ(qwen->vocab_size(), 151669);
  // Llama 2 ships no tokenizer_config.json.
  EXPECT_FALSE(load_tokenizer("llama2")->bos_id().has_value());
}

} // namespace
} // namespace metronome::test
