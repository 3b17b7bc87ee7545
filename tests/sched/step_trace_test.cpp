// The step trace (sched/step_trace.hpp): the header and one line per step,
// in the columns tools/fit_cost_model.py --trace reads.

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "sched/step_trace.hpp"

namespace metronome {
namespace {

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  for (std::string field; std::getline(ss, field, ',');)
    out.push_back(field);
  return out;
}

TEST(step_trace, writes_a_header_and_a_line_per_step_with_its_shape_and_times) {
  const auto path = std::filesystem::temp_directory_path()
                    / ("step_trace_test_" + std::to_string(::getpid()) + ".csv");
  {
    step_trace trace(path);
    step_record r;
    r.step = 41;
    r.shape.add_chunk(100, 1, true);
    r.shape.add_chunk(200, 1, true);
    r.shape.add_chunk(0, 64, false);
    r.predicted_ms = 7.25;
    r.prior_ms = 7.0;
    r.wall_ms = 8.5;
    r.device_ms = 8.25;
    trace.write(1.5, r);
    EXPECT_EQ(trace.lines(), 1);
  }
  std::ifstream in(path);
  std::string header, line, extra;
  ASSERT_TRUE(std::getline(in, header));
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_FALSE(std::getline(in, extra));
  const auto h = split(header);
  const auto v = split(line);
  ASSERT_EQ(h.size(), v.size());
  auto at = [&](const std::string& column) {
    for (size_t i = 0; i < h.size(); ++i)
      if (h[i] == column)
        return std::stod(v[i]);
    ADD_FAILURE() << "no column " << column;
    return -1.0;
  };
  EXPECT_DOUBLE_EQ(at("t_s"), 1.5);
  EXPECT_DOUBLE_EQ(at("step"), 41);
  EXPECT_DOUBLE_EQ(at("decode_seqs"), 2);
  EXPECT_DOUBLE_EQ(at("prefill_seqs"), 1);
  EXPECT_DOUBLE_EQ(at("prefill_tokens"), 64);
  EXPECT_GT(at("decode_kv_tokens"), 300);
  EXPECT_GT(at("prefill_attention_pairs"), 0);
  EXPECT_DOUBLE_EQ(at("predicted_ms"), 7.25);
  EXPECT_DOUBLE_EQ(at("prior_ms"), 7.0);
  EXPECT_DOUBLE_EQ(at("wall_ms"), 8.5);
  EXPECT_DOUBLE_EQ(at("device_ms"), 8.25);
  std::filesystem::remove(path);
}

TEST(step_trace, a_path_that_cannot_be_written_is_named) {
  try {
    step_trace trace("/nonexistent-dir/steps.csv");
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/steps.csv"), std::string::npos);
  }
}

} // namespace
} // namespace metronome
