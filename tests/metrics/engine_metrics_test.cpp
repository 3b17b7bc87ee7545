// The engine's scheduling metrics: policy decisions counted by kind, and
// the step-time model's learned factors.

#include <gtest/gtest.h>

#include "actors/engine.hpp"
#include "actors/engine_metrics.hpp"

namespace metronome {
namespace {

TEST(engine_metrics, scheduling_events_and_the_step_model) {
  engine_metrics m;
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

} // namespace
} // namespace metronome
