// Unicode normalization against the examples of UAX #15 and the Unicode
// standard (not against our own output).

#include "model/tokenizer/unicode.hpp"
#include "tests/tokenizer/tokenizer_test_util.hpp"

namespace metronome::test {
namespace {

using unicode::normal_form;
using unicode::normalize;

TEST(unicode, nfc_composes) {
  EXPECT_EQ(normalize("e\u0301", normal_form::nfc), "\u00E9");
  EXPECT_EQ(normalize("\u1100\u1161\u11A8", normal_form::nfc), "\uAC01"); // Hangul LVT
  EXPECT_EQ(normalize("\u212B", normal_form::nfc), "\u00C5");             // singleton
  EXPECT_EQ(normalize("\u2126", normal_form::nfc), "\u03A9");
  // UAX #15 figure 3: s + dot below + dot above -> U+1E69.
  EXPECT_EQ(normalize("s\u0323\u0307", normal_form::nfc), "\u1E69");
  EXPECT_EQ(normalize("s\u0307\u0323", normal_form::nfc), "\u1E69");
  // Canonical order: d + dot above + dot below -> U+1E0D U+0307.
  EXPECT_EQ(normalize("d\u0307\u0323", normal_form::nfc), "\u1E0D\u0307");
  // Composition exclusion: U+0958 stays decomposed in NFC.
  EXPECT_EQ(normalize("\u0958", normal_form::nfc), "\u0915\u093C");
  // Blocked: a starter between base and mark.
  EXPECT_EQ(normalize("a\u0062\u0301", normal_form::nfc), "a\u0062\u0301");
  EXPECT_EQ(normalize("plain ascii", normal_form::nfc), "plain ascii");
}

TEST(unicode, nfd_nfkc_nfkd) {
  EXPECT_EQ(normalize("\u00E9", normal_form::nfd), "e\u0301");
  EXPECT_EQ(normalize("\uAC01", normal_form::nfd), "\u1100\u1161\u11A8");
  EXPECT_EQ(normalize("\u1E9B\u0323", normal_form::nfd), "\u017F\u0323\u0307");
  EXPECT_EQ(normalize("\u1E9B\u0323", normal_form::nfc), "\u1E9B\u0323");
  EXPECT_EQ(normalize("\u1E9B\u0323", normal_form::nfkd), "s\u0323\u0307");
  EXPECT_EQ(normalize("\u1E9B\u0323", normal_form::nfkc), "\u1E69");
  EXPECT_EQ(normalize("\uFB01", normal_form::nfkc), "fi");
  EXPECT_EQ(normalize("\u2460", normal_form::nfkc), "1");
  EXPECT_EQ(normalize("\uFF76", normal_form::nfkc), "\u30AB");
}

TEST(unicode, categories_and_space) {
  EXPECT_EQ(unicode::general_category(U'a'), unicode::category::letter);
  EXPECT_EQ(unicode::general_category(U'\u4E2D'), unicode::category::letter);
  EXPECT_EQ(unicode::general_category(U'7'), unicode::category::number);
  EXPECT_EQ(unicode::general_category(U'\u0301'), unicode::category::mark);
  EXPECT_EQ(unicode::general_category(U'!'), unicode::category::punctuation);
  EXPECT_TRUE(unicode::is_white_space(U'\u3000'));
  EXPECT_FALSE(unicode::is_white_space(U'\u180E'));
  EXPECT_TRUE(unicode::is_python_space(U'\u001F'));
}

} // namespace
} // namespace metronome::test
