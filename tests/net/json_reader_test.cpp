// net::read_json against nlohmann::json::parse, the parser it replaces on
// the request path: the same verdict (JSON or not) and the same document,
// types included (unsigned against signed integers, doubles), on hand-picked
// edge cases and on many random documents and mutations of them.

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "net/json_reader.hpp"

namespace metronome::net {
namespace {

using json = nlohmann::json;

/// Equal values of equal types all the way down (nlohmann's == lets 1u equal
/// 1 and 1.0). One exception, documented in net/json_reader.hpp: "-0" is a
/// signed zero to nlohmann and an unsigned one to read_json.
bool same(const json& a, const json& b) {
  if (a.is_number_integer() && b.is_number_integer() && a == 0 && b == 0)
    return true;
  if (a.type() != b.type())
    return false;
  switch (a.type()) {
    case json::value_t::array: {
      if (a.size() != b.size())
        return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (!same(a[i], b[i]))
          return false;
      return true;
    }
    case json::value_t::object: {
      if (a.size() != b.size())
        return false;
      for (auto it = a.begin(); it != a.end(); ++it) {
        auto other = b.find(it.key());
        if (other == b.end() || !same(*it, *other))
          return false;
      }
      return true;
    }
    case json::value_t::number_float: {
      const double x = a.get<double>(), y = b.get<double>();
      return x == y ? std::signbit(x) == std::signbit(y) : (x != x && y != y);
    }
    default:
      return a == b;
  }
}

/// Both parsers, one verdict; prints the text when they differ.
void expect_agree(const std::string& text) {
  const json reference = json::parse(text, nullptr, false);
  const auto fast = read_json(text);
  ASSERT_EQ(fast.has_value(), !reference.is_discarded())
    << "verdicts differ on " << testing::PrintToString(text);
  if (fast) {
    EXPECT_TRUE(same(*fast, reference))
      << testing::PrintToString(text) << "\n read_json: " << fast->dump()
      << "\n nlohmann:  " << reference.dump();
  }
}

TEST(json_reader, edge_cases_match_nlohmann) {
  const std::vector<std::string> cases = {
    "{}", "[]", "0", "-0", "-0.0", "0.0", "1", "-1", "1.5", "1e2", "1E-2", "-1e+2", "1e400",
    "-1e400", "1e-400", "123456789012345678", "9223372036854775807", "9223372036854775808",
    "-9223372036854775808", "-9223372036854775809", "18446744073709551615",
    "18446744073709551616", "123456789012345678901234567890", "0.1", "2.2250738585072014e-308",
    "4.9e-324", "01", "-", "1.", ".5", "+1", "1e", "0x10", "NaN", "Infinity", "true", "false",
    "null", "tru", "nul", "\"\"", "\"a\"", "\"\\u00e9\"", "\"\\ud83d\\ude00\"", "\"\\ud800\"",
    "\"\\udc00\"", "\"\\ud800x\"", "\"\\ud800\\u0041\"", "\"\\u0000\"", "\"\\/\"", "\"\\x\"",
    "\"\t\"", "\"\x01\"", "\"\xc3\xa9\"", "\"\xc3\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"",
    "\"\xc0\xaf\"", "\xef\xbb\xbf{}", "\xef\xbb\xbf", " {} ", "{} x", "{}{}", "[1,]", "[,1]",
    "{\"a\":1,}", "{\"a\" 1}", "{1:1}", "{\"a\":1,\"a\":2}", "{\"a\":{\"b\":1},\"a\":[2]}",
    "[1,[2,[3,[4]]]]", "{\"a\":null,\"b\":[true,false,null]}", "\v{}", "\f{}", "{}\n",
    "{\"prompt\":[1,2,3],\"max_tokens\":16,\"temperature\":0.7,\"stream\":true}",
    std::string("\"a\0b\"", 5), std::string("{}\0", 3), "", " ", "[", "{", "\"", "/*x*/{}",
    "[1e309]", "[-1e-400]", "[1.7976931348623157e308]", "[-123.456e-7]"};
  for (const auto& text : cases)
    expect_agree(text);
}

/// A random document: objects, arrays, strings with escapes and non-ASCII,
/// integers of every width, doubles.
json random_document(std::mt19937_64& rng, int depth) {
  std::uniform_int_distribution<int> kind(0, depth > 3 ? 5 : 7);
  switch (kind(rng)) {
    case 0:
      return json(nullptr);
    case 1:
      return json(bool(rng() & 1));
    case 2: {
      const int bits = int(rng() % 64);
      const int64_t v = int64_t(rng() >> (63 - bits)) * ((rng() & 1) ? -1 : 1);
      return json(v);
    }
    case 3:
      return json(uint64_t(rng()));
    case 4: {
      std::uniform_real_distribution<double> d(-1e6, 1e6);
      const double scale = std::pow(10.0, double(int(rng() % 40) - 20));
      return json(d(rng) * scale);
    }
    case 5: {
      static const char* pieces[] = {"a", "Z", " ", "\"", "\\", "/", "\n", "\t", "\x01",
                                     "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "0", "{"};
      std::string s;
      for (int i = int(rng() % 12); i > 0; --i)
        s += pieces[rng() % (sizeof(pieces) / sizeof(*pieces))];
      return json(s);
    }
    case 6: {
      json a = json::array();
      for (int i = int(rng() % 6); i > 0; --i)
        a.push_back(random_document(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      for (int i = int(rng() % 6); i > 0; --i)
        o[std::string(1, char('a' + rng() % 8))] = random_document(rng, depth + 1);
      return o;
    }
  }
}

TEST(json_reader, random_documents_match_nlohmann) {
  std::mt19937_64 rng(2026);
  for (int i = 0; i < 3000; ++i) {
    const json doc = random_document(rng, 0);
    expect_agree(doc.dump());
    expect_agree(doc.dump(2)); // with whitespace
    expect_agree(doc.dump(-1, ' ', true)); // non-ASCII escaped as \u
  }
}

TEST(json_reader, mutated_documents_match_nlohmann) {
  std::mt19937_64 rng(7);
  static const char* inserts[] = {"\"", "\\", "{", "}", "[", "]", ",", ":", "-", "e", "0",
                                  ".", "\\u", "\\ud800", "\xff", "\xc3", "\x00", " ", "1e999"};
  for (int i = 0; i < 6000; ++i) {
    std::string text = random_document(rng, 0).dump();
    for (int edits = 1 + int(rng() % 3); edits > 0; --edits) {
      const size_t at = text.empty() ? 0 : rng() % (text.size() + 1);
      switch (rng() % 3) {
        case 0: { // insert
          const char* piece = inserts[rng() % (sizeof(inserts) / sizeof(*inserts))];
          text.insert(at, piece[0] ? std::string(piece) : std::string(1, '\0'));
          break;
        }
        case 1: // delete
          if (at < text.size())
            text.erase(at, 1 + rng() % 3);
          break;
        default: // flip a byte
          if (at < text.size())
            text[at] = char(rng());
      }
    }
    expect_agree(text);
  }
}

TEST(json_reader, a_large_token_id_prompt_reads_as_unsigned_integers) {
  std::string text = R"({"model":"m","prompt":[)";
  for (int i = 0; i < 4100; ++i) {
    if (i)
      text += ',';
    text += std::to_string((i * 7919) % 128000);
  }
  text += R"(],"max_tokens":1})";
  const auto doc = read_json(text);
  ASSERT_TRUE(doc.has_value());
  const auto& prompt = (*doc)["prompt"];
  ASSERT_EQ(prompt.size(), 4100u);
  EXPECT_TRUE(prompt[4099].is_number_unsigned());
  EXPECT_EQ(prompt[4099].get<int64_t>(), (4099 * 7919) % 128000);
  expect_agree(text);
}

TEST(json_reader, a_large_body_after_small_ones_reads_the_same) {
  // The thread's parser gives back what a large body made it allocate; the
  // bodies after it must still read correctly.
  std::string big = "[";
  for (int i = 0; i < 300000; ++i) {
    if (i)
      big += ',';
    big += '"' + std::to_string(i) + '"';
  }
  big += "]";
  ASSERT_TRUE(read_json("{\"a\":1}").has_value());
  const auto doc = read_json(big);
  ASSERT_TRUE(doc.has_value());
  EXPECT_EQ(doc->size(), 300000u);
  EXPECT_EQ((*doc)[299999].get<std::string>(), "299999");
  expect_agree("{\"a\":[1,-2,3.5]}");
  EXPECT_FALSE(read_json("{\"a\":").has_value());
}

} // namespace
} // namespace metronome::net
