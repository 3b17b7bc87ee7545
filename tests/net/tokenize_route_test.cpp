// POST /tokenize and /detokenize: body parsing, and the answers over the
// real Llama 3 tokenizer and chat template from shared/testdata.

#include <gtest/gtest.h>

#include "actors/request_actor.hpp"
#include "model/tokenizer/chat_template.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "net/tokenize_route.hpp"
#include "tests/test_env.hpp"

namespace metronome::net {
namespace {

parse_defaults defaults() {
  parse_defaults d;
  d.model_name = "m";
  return d;
}

class TokenizeRoute : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    const auto dir = std::filesystem::path(test::env("TESTDATA")) / "tokenizers" / "llama3";
    tok_ = tokenizer::load(dir);
    tmpl_ = std::make_shared<chat_template>(chat_template::from_folder(dir));
  }
  static void TearDownTestSuite() {
    tok_.reset();
    tmpl_.reset();
  }
  static inline std::shared_ptr<const tokenizer> tok_;
  static inline std::shared_ptr<const chat_template> tmpl_;
};

TEST(TokenizeBody, PromptWithDefaults) {
  auto r = parse_tokenize_body(R"({"prompt": "Hello world"})", defaults());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_FALSE(r->chat);
  EXPECT_EQ(r->prompt, "Hello world");
  EXPECT_TRUE(r->add_special_tokens);
}

TEST(TokenizeBody, MessagesDefaultToNoSpecialTokens) {
  auto r = parse_tokenize_body(
    R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false})",
    defaults());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_TRUE(r->chat);
  ASSERT_EQ(r->messages.size(), 1u);
  EXPECT_EQ(r->messages[0].content, "Hi");
  EXPECT_FALSE(r->add_special_tokens);
  EXPECT_FALSE(r->add_generation_prompt);
}

TEST(TokenizeBody, ErrorsNameTheField) {
  struct bad {
    const char* body;
    int status;
    const char* param;
    const char* code;
  };
  const bad cases[] = {
    {R"({})", 400, "prompt", "missing_required_parameter"},
    {R"({"prompt": 5})", 400, "prompt", "invalid_type"},
    {R"({"prompt": "a", "messages": [{"role": "user", "content": "b"}]})", 400, "messages",
     "invalid_value"},
    {R"({"messages": []})", 400, "messages", "invalid_value"},
    {R"({"messages": [{"role": "robot", "content": "b"}]})", 400, "messages[0].role",
     "invalid_value"},
    {R"({"prompt": "a", "add_special_tokens": "yes"})", 400, "add_special_tokens",
     "invalid_type"},
    {R"({"prompt": "a", "model": "other"})", 404, "model", "model_not_found"},
    {R"([1, 2])", 400, "", "invalid_type"},
    {R"({"prompt": )", 400, "", "invalid_json"},
  };
  for (const auto& c : cases) {
    auto r = parse_tokenize_body(c.body, defaults());
    ASSERT_FALSE(r) << c.body;
    EXPECT_EQ(r.error().status, c.status) << c.body;
    EXPECT_EQ(r.error().param, c.param) << c.body;
    EXPECT_EQ(r.error().code, c.code) << c.body;
  }
}

TEST(DetokenizeBody, TokensAndErrors) {
  auto ok = parse_detokenize_body(R"({"tokens": [9906, 1917]})", defaults());
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(ok->tokens, (std::vector<int32_t>{9906, 1917}));
  for (const char* body : {R"({})", R"({"tokens": "9906"})", R"({"tokens": [1, "x"]})",
                           R"({"tokens": [-1]})", R"({"tokens": [1.5]})",
                           R"({"tokens": [99999999999]})"}) {
    auto r = parse_detokenize_body(body, defaults());
    ASSERT_FALSE(r) << body;
    EXPECT_EQ(r.error().status, 400) << body;
    EXPECT_TRUE(r.error().param.starts_with("tokens")) << body << ": " << r.error().param;
  }
}

TEST_F(TokenizeRoute, PromptMatchesTheTokenizer) {
  tokenize_request req;
  req.prompt = "How are you doing?";
  auto a = tokenize_answer(req, *tok_, tmpl_.get(), 4096);
  ASSERT_TRUE(a) << a.error().message;
  // Llama 3 (shared/testdata/tokenizers/vectors.json); this tokenizer.json
  // adds no BOS of its own.
  EXPECT_EQ((*a)["tokens"], nlohmann::json::array({4438, 527, 499, 3815, 30}));
  EXPECT_EQ((*a)["count"], 5);
  EXPECT_EQ((*a)["max_model_len"], 4096);
}

TEST_F(TokenizeRoute, AddSpecialTokensAddsThePostProcessorsBos) {
  // Llama 2's tokenizer puts <s> (1) in front.
  const auto dir = std::filesystem::path(test::env("TESTDATA")) / "tokenizers" / "llama2";
  auto llama2 = tokenizer::load(dir);
  const chat_template tmpl(chat_template::format::llama2, "<s>", "</s>");
  tokenize_request req;
  req.prompt = "How are you doing?";
  auto a = tokenize_answer(req, *llama2, &tmpl, 4096);
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_EQ((*a)["tokens"], nlohmann::json::array({1, 1128, 526, 366, 2599, 29973}));
  req.add_special_tokens = false;
  a = tokenize_answer(req, *llama2, &tmpl, 4096);
  ASSERT_TRUE(a);
  EXPECT_EQ((*a)["tokens"], nlohmann::json::array({1128, 526, 366, 2599, 29973}));

  // Messages: the template's ids, with one more <s> in front when asked
  // (as vLLM does).
  tokenize_request chat;
  chat.chat = true;
  chat.add_special_tokens = false;
  chat.messages = {{"user", "Hi"}};
  a = tokenize_answer(chat, *llama2, &tmpl, 4096);
  ASSERT_TRUE(a) << a.error().message;
  const auto expected = encode_chat(*llama2, tmpl, chat.messages, true);
  EXPECT_EQ((*a)["tokens"].get<std::vector<int32_t>>(), expected);
  chat.add_special_tokens = true;
  a = tokenize_answer(chat, *llama2, &tmpl, 4096);
  ASSERT_TRUE(a);
  auto with = (*a)["tokens"].get<std::vector<int32_t>>();
  ASSERT_EQ(with.size(), expected.size() + 1);
  EXPECT_EQ(with.front(), 1);
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), with.begin() + 1));
}

TEST_F(TokenizeRoute, SpecialTokenTextInAPromptStaysText) {
  tokenize_request req;
  req.prompt = "<|eot_id|>";
  req.add_special_tokens = false;
  auto a = tokenize_answer(req, *tok_, tmpl_.get(), 4096);
  ASSERT_TRUE(a);
  EXPECT_GT((*a)["count"].get<int>(), 1); // not the one special id 128009
}

TEST_F(TokenizeRoute, MessagesAreWhatTheChatRouteFeedsTheModel) {
  tokenize_request req;
  req.chat = true;
  req.add_special_tokens = false;
  req.messages = {{"user", "Hi"}};
  auto a = tokenize_answer(req, *tok_, tmpl_.get(), 4096);
  ASSERT_TRUE(a) << a.error().message;
  const auto expected = encode_chat(*tok_, *tmpl_, req.messages, true);
  EXPECT_EQ((*a)["tokens"].get<std::vector<int32_t>>(), expected);
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(expected.front(), 128000); // the template writes its own BOS
  EXPECT_EQ((*a)["count"], expected.size());
}

TEST_F(TokenizeRoute, AddGenerationPromptReachesTheTemplate) {
  // ChatML writes "<|im_start|>assistant\n" only with the generation prompt.
  const chat_template chatml(chat_template::format::chatml, "", "<|im_end|>");
  tokenize_request req;
  req.chat = true;
  req.add_special_tokens = false;
  req.messages = {{"user", "Hi"}};
  auto with = tokenize_answer(req, *tok_, &chatml, 4096);
  ASSERT_TRUE(with) << with.error().message;
  req.add_generation_prompt = false;
  auto without = tokenize_answer(req, *tok_, &chatml, 4096);
  ASSERT_TRUE(without);
  EXPECT_EQ((*with)["tokens"].get<std::vector<int32_t>>(),
            encode_chat(*tok_, chatml, req.messages, true));
  EXPECT_EQ((*without)["tokens"].get<std::vector<int32_t>>(),
            encode_chat(*tok_, chatml, req.messages, false));
  EXPECT_LT((*without)["count"].get<size_t>(), (*with)["count"].get<size_t>());
}

TEST_F(TokenizeRoute, NoTemplateIsA400) {
  tokenize_request req;
  req.chat = true;
  req.messages = {{"user", "Hi"}};
  auto a = tokenize_answer(req, *tok_, nullptr, 4096);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().status, 400);
  EXPECT_EQ(a.error().param, "messages");
}

TEST_F(TokenizeRoute, DetokenizeIsTheInverse) {
  detokenize_request req;
  req.tokens = {128000, 4438, 527, 499, 3815, 30};
  auto a = detokenize_answer(req, *tok_);
  ASSERT_TRUE(a) << a.error().message;
  EXPECT_EQ((*a)["prompt"], "<|begin_of_text|>How are you doing?");
  req.tokens.clear();
  a = detokenize_answer(req, *tok_);
  ASSERT_TRUE(a);
  EXPECT_EQ((*a)["prompt"], "");
}

TEST_F(TokenizeRoute, DetokenizeRefusesIdsOutsideTheVocabulary) {
  detokenize_request req;
  req.tokens = {4438, tok_->vocab_size()};
  auto a = detokenize_answer(req, *tok_);
  ASSERT_FALSE(a);
  EXPECT_EQ(a.error().status, 400);
  EXPECT_EQ(a.error().param, "tokens");
  EXPECT_NE(a.error().message.find("tokens[1]"), std::string::npos) << a.error().message;
}

} // namespace
} // namespace metronome::net
