// libFuzzer target: the tokenizer (model/tokenizer/tokenizer.hpp) on three
// real tokenizer.json files of different families from shared/testdata:
// Llama 3 (byte-level BPE, ignore_merges), Qwen 3 (NFC, byte-level BPE, added
// tokens) and Mistral (SentencePiece-style Metaspace with byte fallback).
// Input: one mode byte (tokenizer, encode options, text or ids), then text
// to encode or little-endian 32-bit ids to decode. Properties: encode and
// decode never throw on any input and give ids within the vocabulary; the
// incremental decoder's pushes plus finish() are valid UTF-8 and equal
// decode() of the same ids, for encoded and for arbitrary ids, except after
// a byte-fallback run that turns invalid, where the text after the run must
// still be the same (the contract in tokenizer.hpp).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "model/tokenizer/tokenizer.hpp"
#include "model/tokenizer/unicode.hpp"
#include "tests/fuzz/fuzz_check.hpp"

using namespace metronome;

namespace {

std::string testdata() {
  if (const char* env = std::getenv("METRONOME_TESTDATA"))
    return env;
  return METRONOME_TEST_TESTDATA;
}

const std::vector<std::shared_ptr<const tokenizer>>& tokenizers() {
  static const auto* all = [] {
    auto* v = new std::vector<std::shared_ptr<const tokenizer>>;
    for (const char* name : {"llama3", "qwen3", "mistral"})
      v->push_back(tokenizer::load(testdata() + "/tokenizers/" + name));
    return v;
  }();
  return *all;
}

constexpr std::string_view replacement = "\xEF\xBF\xBD";

void check_streaming(const std::shared_ptr<const tokenizer>& tok, const std::vector<int32_t>& ids,
                     bool skip_special) {
  const std::string whole = tok->decode(ids, skip_special);
  incremental_decoder inc{tok, skip_special};
  std::string streamed;
  for (auto id : ids)
    streamed += inc.push(id);
  streamed += inc.finish();
  FUZZ_CHECK(unicode::is_valid_utf8(streamed), "incremental decode gave invalid UTF-8");
  const auto last_replacement = whole.rfind(replacement);
  if (last_replacement == std::string::npos) {
    FUZZ_CHECK(streamed == whole, "incremental decode differs from decode");
  } else {
    // The documented exception (a byte-fallback run that turns invalid):
    // the text after the last U+FFFD is the same.
    FUZZ_CHECK(streamed.ends_with(std::string_view(whole).substr(last_replacement + 3)),
               "incremental decode lost text after an invalid byte run");
  }
}

} // namespace

// The three tokenizers load before the first input: loading tokenizer.json
// under ASan takes seconds, and on a busy machine it ran past the per-input
// timeout (-timeout=20) when it was part of the first input.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1)
    return 0;
  const uint8_t mode = data[0];
  const auto& tok = tokenizers()[(mode & 3) % tokenizers().size()];
  const bool skip_special = mode & 0x20;
  if (mode & 0x10) {
    // Arbitrary ids, including ones without a token (skipped by contract).
    std::vector<int32_t> ids((size - 1) / 4);
    if (!ids.empty())
      std::memcpy(ids.data(), data + 1, ids.size() * 4);
    check_streaming(tok, ids, skip_special);
    return 0;
  }
  const std::string_view text{reinterpret_cast<const char*>(data + 1), size - 1};
  tokenizer::encode_options options;
  options.add_special_tokens = mode & 0x04;
  options.parse_special = mode & 0x08;
  auto ids = tok->encode(text, options);
  for (auto id : ids)
    FUZZ_CHECK(id >= 0 && id < tok->vocab_size(), "encode gave an id outside the vocabulary");
  check_streaming(tok, ids, skip_special);
  return 0;
}
