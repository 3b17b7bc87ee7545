// metronome.json (model/model_card.hpp): what a model folder says it is.

#include <fstream>

#include <gtest/gtest.h>

#include "model/model_card.hpp"
#include "model/model_error.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

std::filesystem::path folder_with(const std::string& name, const std::string& text) {
  auto dir = test::scratch_dir("model-card-" + name);
  std::ofstream(dir / model_card_file) << text;
  return dir;
}

TEST(model_card, absent_means_nothing_is_claimed) {
  EXPECT_FALSE(read_model_card(test::scratch_dir("model-card-none")));
}

TEST(model_card, reads_id_and_description) {
  auto card = read_model_card(folder_with("ok", R"({"id": "metronome-tiny",
    "description": "a small model", "other": 1})"));
  ASSERT_TRUE(card);
  EXPECT_EQ(card->id, "metronome-tiny");
  EXPECT_EQ(card->description, "a small model");
  card = read_model_card(folder_with("empty", "{}"));
  ASSERT_TRUE(card);
  EXPECT_TRUE(card->id.empty() && card->description.empty());
}

TEST(model_card, refuses_what_it_cannot_show) {
  for (const char* text : {"[]", "{\"id\": 3}", "{\"id\": \"two words\"}",
                           "{\"description\": \"line\\nbreak\"}", "{\"id\": \"x\"", ""})
    EXPECT_THROW(read_model_card(folder_with("bad", text)), model_error) << text;
  EXPECT_THROW(read_model_card(folder_with("long", "{\"description\": \"" + std::string(501, 'x')
                                                     + "\"}")),
               model_error);
}

TEST(model_card, make_model_says_its_weights_are_random) {
  auto card = read_model_card(test::tiny_model("tiny-llama3", 7));
  ASSERT_TRUE(card);
  EXPECT_TRUE(card->id.empty());
  EXPECT_NE(card->description.find("random weights"), std::string::npos);
  EXPECT_NE(card->description.find("seed 7"), std::string::npos);
}

} // namespace
} // namespace metronome
