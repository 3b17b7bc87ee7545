// Bad tokenizer folders give a model_error that names the file and the field.

#include <fstream>

#include <nlohmann/json.hpp>

#include "model/model_error.hpp"
#include "tests/tokenizer/tokenizer_test_util.hpp"

namespace metronome::test {
namespace {

using nlohmann::json;

/// A minimal valid byte-level BPE tokenizer.json, to break one field at a time.
json minimal() {
  return json::parse(R"({
    "version": "1.0", "added_tokens": [{"id": 3, "content": "<eos>", "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": null, "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
}

std::string load_error(const json& j, const std::string& name) {
  auto dir = work_dir() / "tokenizer_errors" / name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << j.dump();
  try {
    tokenizer::load(dir);
  } catch (const model_error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
    return e.field();
  }
  return "<loaded>";
}

TEST(tokenizer_errors, minimal_file_loads_and_works) {
  EXPECT_EQ(load_error(minimal(), "ok"), "<loaded>");
  auto tok = tokenizer::load(work_dir() / "tokenizer_errors" / "ok");
  EXPECT_EQ(tok->encode("abab<eos>"), (std::vector<int32_t>{2, 2, 3}));
  EXPECT_EQ(tok->vocab_size(), 4);
}

TEST(tokenizer_errors, fields_are_named) {
  auto j = minimal();
  j["model"]["type"] = "Unigram";
  EXPECT_EQ(load_error(j, "unigram"), "model.type");
  j = minimal();
  j["model"]["merges"] = {"a c"};
  EXPECT_EQ(load_error(j, "merge"), "model.merges[0]");
  j = minimal();
  j["model"]["merges"] = {"a b c"};
  EXPECT_EQ(load_error(j, "merge_form"), "model.merges[0]");
  j = minimal();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}},
                        {"behavior", "Isolated"}};
  EXPECT_EQ(load_error(j, "regex"), "pre_tokenizer.pattern.Regex");
  j = minimal();
  j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "Nope"}}}}};
  EXPECT_EQ(load_error(j, "decoder"), "decoder.decoders[0].type");
  j = minimal();
  j["added_tokens"][0].erase("content");
  EXPECT_EQ(load_error(j, "added"), "added_tokens[0].content");
  j = minimal();
  j["model"]["vocab"]["a"] = "zero";
  EXPECT_EQ(load_error(j, "vocab"), "model.vocab.a");
}

TEST(tokenizer_errors, missing_and_broken_files) {
  auto dir = work_dir() / "tokenizer_errors" / "empty";
  std::filesystem::create_directories(dir);
  std::filesystem::remove(dir / "tokenizer.json");
  EXPECT_THROW(tokenizer::load(dir), model_error);
  std::ofstream(dir / "tokenizer.json") << "{ not json";
  EXPECT_THROW(tokenizer::load(dir), model_error);
}

} // namespace
} // namespace metronome::test
