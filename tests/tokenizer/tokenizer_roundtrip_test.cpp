// Round trips: decode(encode(x)) gives back x (after the tokenizer's own
// normalization) for every tokenizer folder, on slices of the public-domain
// corpora and on adversarial strings.

#include "model/tokenizer/unicode.hpp"
#include "tests/tokenizer/tokenizer_test_util.hpp"

namespace metronome::test {
namespace {

const char* const all_tokenizers[] = {"llama3", "llama2", "mistral", "qwen3", "gpt2"};

/// What decoding the encoding of `text` must give: the text as the
/// tokenizer's normalizer leaves it (SentencePiece models decode U+2581 as a
/// space; Qwen normalizes to NFC).
std::string expected_round_trip(const std::string& name, const std::string& text) {
  std::string t = unicode::to_valid_utf8(text);
  if (name == "qwen3")
    t = unicode::normalize(t, unicode::normal_form::nfc);
  if (name == "llama2" || name == "mistral") {
    std::string out;
    for (size_t pos = 0;;) {
      auto next = t.find("\u2581", pos);
      out.append(t, pos, next == std::string::npos ? std::string::npos : next - pos);
      if (next == std::string::npos)
        break;
      out += ' ';
      pos = next + 3;
    }
    t = out;
  }
  return t;
}

void check_round_trip(const std::string& name, const std::string& text) {
  auto tok = load_tokenizer(name);
  const auto ids = tok->encode(text, {.add_special_tokens = true, .parse_special = false});
  for (int32_t id : ids)
    ASSERT_TRUE(id >= 0 && id < tok->vocab_size());
  EXPECT_EQ(tok->decode(ids, true), expected_round_trip(name, text))
    << name << " on '" << text.substr(0, 80) << "'";
}

TEST(tokenizer_round_trip, corpora) {
  const char* corpora[] = {"moby_dick.txt", "sotu_all.txt", "kjv_bible.txt", "tinyshakespeare.txt"};
  for (const char* corpus : corpora) {
    // 64 KB of each corpus keeps the test quick; the benchmark runs the rest.
    const auto text = read_file(testdata() / "corpora" / corpus, 64 * 1024);
    // Cut at a line end so no UTF-8 character is split.
    const auto cut = text.substr(0, text.rfind('\n') + 1);
    for (const char* name : all_tokenizers) {
      SCOPED_TRACE(std::string(name) + " on " + corpus);
      check_round_trip(name, cut);
    }
  }
}

// token_bytes (what logprobs report as a token's "bytes"): joined over an
// encoding they give the decoded text byte for byte, though a token alone
// may hold part of a character (byte-level pieces, <0xAB> fallbacks).
TEST(tokenizer_round_trip, token_bytes_join_into_the_decoded_text) {
  const auto corpus = read_file(testdata() / "corpora" / "moby_dick.txt", 8 * 1024);
  const std::string texts[] = {
    corpus.substr(0, corpus.rfind('\n') + 1),
    "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80\xF0\x9F\x9A\x80 "
    "\xF0\x9D\x94\x98\xF0\x9D\x94\xAB \xE2\x80\x94 na\xC3\xAFve",
    "  leading spaces\n\n\ttabs",
  };
  for (const char* name : all_tokenizers) {
    auto tok = load_tokenizer(name);
    bool partial = false;
    for (const auto& text : texts) {
      const auto ids = tok->encode(text, {.add_special_tokens = false, .parse_special = false});
      std::string joined;
      for (int32_t id : ids) {
        const auto b = tok->token_bytes(id);
        partial = partial || !unicode::is_valid_utf8(b);
        joined += b;
      }
      auto decoded = tok->decode(ids, true);
      // A SentencePiece text's first token carries the space the decoder
      // strips from the start of a text; in the middle of one it is real.
      if ((std::string(name) == "llama2" || std::string(name) == "mistral")
          && joined.size() == decoded.size() + 1 && joined[0] == ' ')
        joined.erase(0, 1);
      EXPECT_EQ(joined, decoded) << name << " on '" << text.substr(0, 40) << "'";
    }
    EXPECT_TRUE(partial) << name << ": no token held part of a character";
  }
  // An id without a token has no bytes; an added token's are its content.
  auto tok = load_tokenizer("llama3");
  EXPECT_EQ(tok->token_bytes(-1), "");
  EXPECT_EQ(tok->token_bytes(tok->vocab_size() + 5), "");
  EXPECT_EQ(tok->token_bytes(*tok->token_to_id("<|eot_id|>")), "<|eot_id|>");
}

TEST(tokenizer_round_trip, adversarial_strings) {
  const std::string cases[] = {
    "",
    " ",
    "    ",
    "\n",
    "\n\n\n\t\t \r\n",
    "\xC2\xA0\xE2\x80\x83\xE3\x80\x80 mixed spaces",
    "a\u0301e\u0301 combining marks \u1100\u1161\u11A8 jamo",
    "\u212B\u2126 Angstrom and Ohm",
    "\U0001F469\u200D\U0001F469\u200D\U0001F467 family \U0001F1FA\U0001F1F8 flag",
    "\u0645\u0631\u062D\u0628\u0627 \u05E9\u05DC\u05D5\u05DD RTL",
    "\u0000\u0001\u001F control",
    std::string("embedded\0nul", 12),
    "<|endoftext|><|im_start|><|begin_of_text|><s></s>[INST]<think>",
    "\u2581leading metaspace \u2581\u2581",
    "'s'S'T 'RE 'll 'Ll \u017F long s",
    "1234567890123456789012345678901234567890",
    "\uFFFD replacement \uFEFF bom \U0010FFFF max",
    "ab\u00ADcd soft hyphen \u200B zero width",
    "\xF0\x9F\x98\x80\xF0\x9F\x98\x80\xF0\x9F\x98\x80",
    "CJK \u4E2D\u6587\u65E5\u672C\u8A9E\uD55C\uAD6D\uC5B4",
  };
  for (const char* name : all_tokenizers)
    for (const auto& text : cases)
      check_round_trip(name, text);
}

TEST(tokenizer_round_trip, invalid_utf8_is_replaced_like_the_reference) {
  // Each ill-formed subsequence becomes one U+FFFD (Unicode 15, section 3.9,
  // "U+FFFD Substitution of Maximal Subparts", Table 3-8's example).
  const std::string bad = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  const std::string repaired =
    "\x61\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\x62\xEF\xBF\xBD\x63\xEF\xBF\xBD\xEF\xBF\xBD\x64";
  EXPECT_EQ(unicode::to_valid_utf8(bad), repaired);
  for (const char* name : all_tokenizers) {
    auto tok = load_tokenizer(name);
    EXPECT_EQ(tok->encode(bad), tok->encode(repaired)) << name;
    EXPECT_EQ(tok->decode(tok->encode(bad, {.add_special_tokens = false})), repaired) << name;
  }
  // Truncated sequences, overlong forms and surrogates.
  EXPECT_EQ(unicode::to_valid_utf8("\xE2\x82"), "\xEF\xBF\xBD");
  EXPECT_EQ(unicode::to_valid_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(unicode::to_valid_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(tokenizer_round_trip, special_text_is_plain_when_asked) {
  auto llama3 = load_tokenizer("llama3");
  const std::string text = "hi <|eot_id|><|start_header_id|>system<|end_header_id|>";
  const auto parsed = llama3->encode(text);
  EXPECT_NE(std::find(parsed.begin(), parsed.end(), 128009), parsed.end());
  const auto plain = llama3->encode(text, {.add_special_tokens = false, .parse_special = false});
  for (int32_t id : plain)
    EXPECT_FALSE(llama3->is_special(id)) << id;
  EXPECT_EQ(llama3->decode(plain), text);

  // Qwen3's <think> is an added token that is not special: still one token.
  auto qwen = load_tokenizer("qwen3");
  const auto think = qwen->encode("<think>x</think><|im_end|>",
                                  {.add_special_tokens = false, .parse_special = false});
  ASSERT_GE(think.size(), 3u);
  EXPECT_EQ(think.front(), qwen->token_to_id("<think>"));
  EXPECT_EQ(std::count(think.begin(), think.end(), *qwen->token_to_id("<|im_end|>")), 0);

  // Llama 2: "<s>" typed by a user is text, and BOS is still added once.
  auto llama2 = load_tokenizer("llama2");
  const auto ids = llama2->encode("<s>hi", {.add_special_tokens = true, .parse_special = false});
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 1);
  EXPECT_EQ(ids.front(), 1);
}

} // namespace
} // namespace metronome::test
