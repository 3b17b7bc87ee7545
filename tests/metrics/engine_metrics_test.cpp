// The engine's metrics: policy decisions counted by kind, the step-time
// model's learned factors, and vLLM's model_name label on the metrics vLLM
// labels with it.

#include <gtest/gtest.h>

#include "actors/engine.hpp"
#include "actors/engine_metrics.hpp"
#include "tests/metrics/exposition_checker.hpp"

namespace metronome {
namespace {

TEST(engine_metrics, scheduling_events_and_the_step_model) {
  engine_metrics m("tiny");
  engine_status status;
  m.on_scheduling_event("limited_step", 3);
  m.on_scheduling_event("limited_step", 2);
  m.on_scheduling_event("long_step", 0);
  m.on_scheduling_event("promotion", -1); // a counter never goes down
  m.on_step_model(1.25, 0.5);
  const auto text = m.render(status);
  EXPECT_NE(text.find("metronome:scheduling_events_total{kind=\"limited_step\"} 5\n"),
            std::string::npos)
    << text;
  EXPECT_EQ(text.find("kind=\"long_step\""), std::string::npos) << "no event, no series";
  EXPECT_EQ(text.find("kind=\"promotion\""), std::string::npos);
  EXPECT_NE(text.find("metronome:step_time_model_scale{part=\"decode\"} 1.25\n"),
            std::string::npos)
    << text;
  EXPECT_NE(text.find("metronome:step_time_model_scale{part=\"prefill\"} 0.5\n"),
            std::string::npos);
}

TEST(engine_metrics, vllms_metrics_carry_the_model_name_escaped) {
  // A name with each character the text format escapes: a backslash, a
  // double quote and a newline.
  const std::string name = "org/tiny \"v2\"\\beta\nline";
  engine_metrics m(name);
  engine_status status;
  status.running = 2;
  status.waiting = 1;
  m.on_first_token(0.01, 0.05);
  m.on_token_gap(0.002);
  m.on_finish(finish_kind::stop, 0.5, 12, 7, 0.01, 0.05);
  m.on_finish(finish_kind::cancelled, 0.2, 3, 1);
  m.on_error("queue_full");
  m.on_preemptions(1);
  m.on_prefix_cache(16, 8, 1);
  m.on_step(2, 8, 3, 2, 0.01);
  m.on_http_response("/v1/completions", 200);
  const auto text = m.render(status);
  // As written: escaped, and first (before the family's own labels and le).
  const std::string escaped = R"(model_name="org/tiny \"v2\"\\beta\nline")";
  for (const auto& line :
       {"metronome:num_requests_running{" + escaped + "} 2",
        "metronome:request_success_total{" + escaped + R"(,finished_reason="stop"} 1)",
        "metronome:time_to_first_token_seconds_bucket{" + escaped + R"(,le="0.06"} 1)"})
    EXPECT_NE(text.find("\n" + line + "\n"), std::string::npos) << line << "\n" << text;

  // Read back by the format's own rules: the value is the name.
  const auto families = test::check_exposition(text);
  const std::vector<std::string> labelled = {
    "metronome:time_to_first_token_seconds", "metronome:inter_token_latency_seconds",
    "metronome:e2e_request_latency_seconds", "metronome:request_queue_time_seconds",
    "metronome:request_prefill_time_seconds", "metronome:request_decode_time_seconds",
    "metronome:request_prompt_tokens",      "metronome:request_generation_tokens",
    "metronome:prompt_tokens_total",        "metronome:generation_tokens_total",
    "metronome:request_success_total",      "metronome:request_cancelled_total",
    "metronome:request_errors_total",       "metronome:num_preemptions_total",
    "metronome:num_requests_running",       "metronome:num_requests_waiting",
    "metronome:kv_cache_usage_perc",        "metronome:prefix_cache_queries_total",
    "metronome:prefix_cache_hits_total"};
  for (const auto& family : labelled) {
    const auto* f = test::find_family(families, family);
    ASSERT_NE(f, nullptr) << family;
    ASSERT_FALSE(f->samples.empty()) << family;
    for (const auto& s : f->samples) {
      ASSERT_FALSE(s.labels.empty()) << s.name;
      EXPECT_EQ(s.labels.front().first, "model_name") << s.name;
      EXPECT_EQ(s.labels.front().second, name) << s.name;
    }
  }
  // Step, HTTP, build and process metrics are the server's, not a model's.
  for (const char* family : {"metronome:batch_size", "metronome:step_duration_seconds",
                             "metronome:http_responses_total", "metronome:build_info",
                             "process_open_fds"}) {
    const auto* f = test::find_family(families, family);
    ASSERT_NE(f, nullptr) << family;
    for (const auto& s : f->samples)
      for (const auto& [label, value] : s.labels)
        EXPECT_NE(label, "model_name") << s.name;
  }
}

} // namespace
} // namespace metronome
