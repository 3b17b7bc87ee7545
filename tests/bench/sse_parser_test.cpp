// SSE framing and OpenAI stream chunks into native types
// (bench/serve/sse_parser.hpp).

#include <gtest/gtest.h>

#include "bench/serve/sse_parser.hpp"

namespace metronome::bench {
namespace {

TEST(sse_parser, frames_events_split_anywhere_with_either_line_end) {
  const std::string stream
    = "data: {\"choices\":[{\"index\":0,\"text\":\"Hel\",\"finish_reason\":null}],\"usage\":null}\r\n"
      "\r\n"
      ": a comment\n"
      "data: {\"choices\":[{\"index\":0,\"text\":\"lo\",\"finish_reason\":\"length\"}]}\n\n"
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n"
      "data: [DONE]\n\n";
  for (size_t step : {size_t(1), size_t(3), size_t(17), stream.size()}) {
    sse_parser p(api_endpoint::completions);
    std::vector<stream_chunk> all;
    for (size_t i = 0; i < stream.size(); i += step)
      for (auto& c : p.feed(std::string_view(stream).substr(i, step)))
        all.push_back(std::move(c));
    ASSERT_EQ(all.size(), 4u) << "step " << step;
    EXPECT_EQ(all[0].text, "Hel");
    EXPECT_EQ(all[1].text, "lo");
    EXPECT_EQ(all[1].finish_reason, "length");
    EXPECT_FALSE(all[1].completion_tokens);
    EXPECT_EQ(all[2].text, "");
    EXPECT_EQ(all[2].prompt_tokens, 7);
    EXPECT_EQ(all[2].completion_tokens, 2);
    EXPECT_TRUE(all[3].done);
    for (const auto& c : all)
      EXPECT_EQ(c.error, "");
  }
}

TEST(sse_parser, chat_chunks_read_the_delta_and_errors_are_reported) {
  auto role = parse_stream_chunk(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})",
                                 api_endpoint::chat);
  EXPECT_EQ(role.text, "");
  auto text = parse_stream_chunk(R"({"choices":[{"delta":{"content":"Hi"},"finish_reason":null}]})",
                                 api_endpoint::chat);
  EXPECT_EQ(text.text, "Hi");
  auto err = parse_stream_chunk(R"({"error":{"message":"engine stopped","type":"x"}})",
                                api_endpoint::chat);
  EXPECT_EQ(err.error, "engine stopped");
  auto junk = parse_stream_chunk("not json", api_endpoint::completions);
  EXPECT_NE(junk.error.find("malformed stream event"), std::string::npos);
}

} // namespace
} // namespace metronome::bench
