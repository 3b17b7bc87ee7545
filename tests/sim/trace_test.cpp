// Trace readers: the Azure and Mooncake formats and the simple CSV, the
// shipped traces, and errors that name the file, line and field.

#include <fstream>

#include <gtest/gtest.h>

#include "sim/trace.hpp"
#include "tests/test_env.hpp"

namespace metronome::sim {
namespace {

std::string error_of(std::string_view text, trace_format f) {
  try {
    parse_trace(text, f, "t.txt");
  } catch (const trace_error& e) {
    return e.what();
  }
  return "no error";
}

TEST(trace, azure_rows_become_arrivals_relative_to_the_first) {
  auto t = parse_trace("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                       "2023-11-16 18:17:03.9799600,4808,10\n"
                       "2023-11-16 18:17:04.0319600,3180,8\r\n"
                       "2023-11-16 18:18:03.5,110,0\n",
                       trace_format::azure, "dir/az.csv");
  ASSERT_EQ(t.requests.size(), 3u);
  EXPECT_EQ(t.name, "az.csv");
  EXPECT_DOUBLE_EQ(t.requests[0].arrival_s, 0.0);
  EXPECT_NEAR(t.requests[1].arrival_s, 0.052, 1e-6);
  EXPECT_NEAR(t.requests[2].arrival_s, 59.52004, 1e-6);
  EXPECT_EQ(t.requests[0].prompt_tokens, 4808);
  EXPECT_EQ(t.requests[1].output_tokens, 8);
  EXPECT_EQ(t.requests[2].output_tokens, 1) << "the first token is always computed";
}

TEST(trace, mooncake_lines_and_unsorted_arrivals) {
  auto t = parse_trace("{\"timestamp\": 500, \"input_length\": 10, \"output_length\": 3, "
                       "\"hash_ids\": [0]}\n"
                       "\n"
                       "{\"timestamp\": 100, \"input_length\": 20, \"output_length\": 4}\n"
                       "{\"timestamp\": 100, \"input_length\": 30, \"output_length\": 5}\n",
                       trace_format::mooncake, "m.jsonl");
  ASSERT_EQ(t.requests.size(), 3u);
  EXPECT_EQ(t.requests[0].prompt_tokens, 20) << "sorted by time, ties in file order";
  EXPECT_EQ(t.requests[1].prompt_tokens, 30);
  EXPECT_DOUBLE_EQ(t.requests[2].arrival_s, 0.4);
}

TEST(trace, simple_csv_columns_in_any_order_with_optional_features) {
  auto t = parse_trace("# a comment\n"
                       "output_tokens,class,arrival_ms,prompt_tokens,non_alnum_share\n"
                       "7,chat,1500,64,0.25\n"
                       "9,code,2500,32,0\n",
                       trace_format::csv, "s.csv");
  ASSERT_EQ(t.requests.size(), 2u);
  EXPECT_DOUBLE_EQ(t.requests[1].arrival_s, 1.0);
  EXPECT_EQ(t.requests[0].request_class, "chat");
  EXPECT_FLOAT_EQ(t.requests[0].non_alnum_share, 0.25f);
  EXPECT_EQ(t.requests[1].prompt_tokens, 32);
  EXPECT_DOUBLE_EQ(t.duration_s(), 1.0);
}

TEST(trace, errors_name_the_file_line_and_field) {
  EXPECT_EQ(error_of("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17,1,1\n",
                     trace_format::azure),
            "t.txt:2: TIMESTAMP: '2023-11-16 18:17' is not 'YYYY-MM-DD hh:mm:ss[.fraction]'");
  EXPECT_EQ(error_of("TIMESTAMP,ContextTokens\n", trace_format::azure),
            "t.txt:1: GeneratedTokens: missing column in the header");
  EXPECT_EQ(error_of("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,x1,1\n",
                     trace_format::azure),
            "t.txt:2: ContextTokens: 'x1' is not an integer");
  EXPECT_EQ(error_of("{\"timestamp\": 1, \"input_length\": 5}\n", trace_format::mooncake),
            "t.txt:1: output_length: missing");
  EXPECT_EQ(error_of("{\"timestamp\": 1, \"input_length\": \"5\", \"output_length\": 1}\n",
                     trace_format::mooncake),
            "t.txt:1: input_length: expected a number, got \"5\"");
  EXPECT_NE(error_of("{\"timestamp\": 1,\n", trace_format::mooncake).find("t.txt:1: malformed JSON"),
            std::string::npos);
  EXPECT_EQ(error_of("arrival_s,prompt_tokens\n", trace_format::csv),
            "t.txt:1: output_tokens: missing column in the header");
  EXPECT_EQ(error_of("arrival_s,prompt_tokens,output_tokens\n0,0,5\n", trace_format::csv),
            "t.txt:2: prompt_tokens: must be > 0 (an empty prompt)");
  EXPECT_EQ(error_of("arrival_s,prompt_tokens,output_tokens\n0,5\n", trace_format::csv),
            "t.txt:2: output_tokens: missing value");
  EXPECT_EQ(error_of("", trace_format::csv),
            "t.txt: empty file (expected a header with arrival_s, prompt_tokens, output_tokens)");
  try {
    read_trace("/nonexistent/trace.csv", trace_format::csv);
    ADD_FAILURE() << "no error";
  } catch (const trace_error& e) {
    EXPECT_EQ(std::string(e.what()), "/nonexistent/trace.csv: cannot open the file");
  }
}

TEST(trace, the_shipped_traces_load) {
  const std::string dir = test::env("TESTDATA") + "/traces/";
  const auto azure_file = dir + "AzureLLMInferenceTrace_code.csv";
  const auto mooncake_file = dir + "synthetic_trace.jsonl";
  EXPECT_EQ(guess_trace_format(azure_file), trace_format::azure);
  EXPECT_EQ(guess_trace_format(mooncake_file), trace_format::mooncake);
  auto az = read_trace(azure_file, trace_format::azure);
  EXPECT_EQ(az.requests.size(), 8819u); // testdata/README.md
  EXPECT_NEAR(az.duration_s(), 3435.95, 0.01); // 18:17:03.980 to 19:14:19.928
  auto mc = read_trace(mooncake_file, trace_format::mooncake);
  EXPECT_EQ(mc.requests.size(), 3993u);
  EXPECT_DOUBLE_EQ(mc.duration_s(), 1022.025);
}

} // namespace
} // namespace metronome::sim
