// Streaming decode: pushing ids one at a time yields whole characters only,
// no U+FFFD for bytes still to come, and the concatenation equals decode().

#include <random>

#include "model/tokenizer/unicode.hpp"
#include "tests/tokenizer/tokenizer_test_util.hpp"

namespace metronome::test {
namespace {

const char* const all_tokenizers[] = {"llama3", "llama2", "mistral", "qwen3", "gpt2"};

std::string stream(const std::shared_ptr<const tokenizer>& tok, const std::vector<int32_t>& ids,
                   bool skip, bool check_no_replacement) {
  incremental_decoder dec(tok, skip);
  std::string all;
  for (int32_t id : ids) {
    const auto piece = dec.push(id);
    EXPECT_TRUE(unicode::is_valid_utf8(piece));
    if (check_no_replacement) {
      EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << "U+FFFD emitted";
    }
    all += piece;
  }
  const auto rest = dec.finish();
  EXPECT_TRUE(unicode::is_valid_utf8(rest));
  return all + rest;
}

TEST(incremental_decoder, streams_equal_full_decode) {
  const std::string texts[] = {
    "Hello, world! How are you doing today?",
    "  leading spaces\n\nnew\tlines  ",
    "\U0001F999 llamas \U0001F469\u200D\U0001F469\u200D\U0001F467 and \u751F\u6D3B\u7684\u771F\u8C1B",
    "na\u00EFve caf\u00E9 \u2014 \u201Cquotes\u201D \u65E5\u672C\u8A9E",
    "\u2581This \u2581is \u2581a test",
  };
  for (const char* name : all_tokenizers) {
    auto tok = load_tokenizer(name);
    for (const auto& text : texts) {
      SCOPED_TRACE(std::string(name) + ": " + text);
      const auto ids = tok->encode(text);
      for (bool skip : {true, false})
        EXPECT_EQ(stream(tok, ids, skip, true), tok->decode(ids, skip));
    }
  }
}

TEST(incremental_decoder, holds_back_partial_characters) {
  // Llama 3 spells U+1F999 as three byte-level tokens: nothing may come out
  // until the last one.
  auto tok = load_tokenizer("llama3");
  const auto ids = tok->encode("\U0001F999");
  ASSERT_EQ(ids.size(), 3u);
  incremental_decoder dec(tok);
  EXPECT_EQ(dec.push(ids[0]), "");
  EXPECT_EQ(dec.push(ids[1]), "");
  EXPECT_EQ(dec.push(ids[2]), "\U0001F999");
  EXPECT_EQ(dec.finish(), "");
  // Llama 2 spells it as four <0x..> byte tokens after "▁".
  auto l2 = load_tokenizer("llama2");
  const auto ids2 = l2->encode("a\U0001F999", {.add_special_tokens = false});
  incremental_decoder dec2(l2);
  std::string out;
  for (size_t i = 0; i + 1 < ids2.size(); ++i)
    out += dec2.push(ids2[i]);
  EXPECT_EQ(out, "a");
  EXPECT_EQ(dec2.push(ids2.back()), "\U0001F999");
}

TEST(incremental_decoder, unfinished_bytes_come_out_at_finish) {
  auto tok = load_tokenizer("llama3");
  auto ids = tok->encode("\U0001F999");
  ids.pop_back(); // the model stopped in the middle of a character
  EXPECT_EQ(stream(tok, ids, true, true), tok->decode(ids));
  EXPECT_EQ(tok->decode(ids), "\xEF\xBF\xBD");
}

TEST(incremental_decoder, recovers_after_a_byte_run_turns_invalid) {
  // Mistral: <0x6D> ("m", valid alone) then <0xAC> (a stray continuation
  // byte). decode() reads the run as two U+FFFD; the stream has emitted "m"
  // by then, and must still deliver everything that follows the run (it
  // used to deliver nothing more, for streaming and non-streaming requests).
  auto tok = load_tokenizer("mistral");
  const auto m = tok->token_to_id("<0x6D>");
  const auto stray = tok->token_to_id("<0xAC>");
  ASSERT_TRUE(m && stray);
  std::vector<int32_t> ids{*m, *stray};
  const auto rest = tok->encode(" and the rest of the answer", {.add_special_tokens = false});
  ids.insert(ids.end(), rest.begin(), rest.end());
  ASSERT_EQ(tok->decode(ids), "\xEF\xBF\xBD\xEF\xBF\xBD  and the rest of the answer");
  incremental_decoder dec(tok);
  EXPECT_EQ(dec.push(ids[0]), "m");
  EXPECT_EQ(dec.push(ids[1]), "");
  std::string out;
  for (size_t i = 2; i < ids.size(); ++i)
    out += dec.push(ids[i]);
  out += dec.finish();
  EXPECT_EQ(out, "\xEF\xBF\xBD  and the rest of the answer");
  // A run that is only incomplete for a while still comes out whole.
  const auto han = tok->encode("\u4E2D\u4E2D", {.add_special_tokens = false});
  EXPECT_EQ(stream(tok, han, true, true), tok->decode(han));
}

TEST(incremental_decoder, random_id_sequences) {
  std::mt19937 rng(5);
  for (const char* name : all_tokenizers) {
    auto tok = load_tokenizer(name);
    std::uniform_int_distribution<int32_t> id(0, tok->vocab_size() - 1);
    for (int round = 0; round < 60; ++round) {
      std::vector<int32_t> ids(std::uniform_int_distribution<size_t>(1, 40)(rng));
      for (auto& i : ids)
        i = id(rng);
      for (bool skip : {true, false})
        ASSERT_EQ(stream(tok, ids, skip, false), tok->decode(ids, skip)) << name;
    }
  }
}

} // namespace
} // namespace metronome::test
