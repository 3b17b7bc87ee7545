// The log's output (metrics/log_event.hpp): structured events in text and
// JSON, client text that cannot forge a line or break the JSON, and the
// JSON formatter's lines for ordinary messages too.

#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/ostream_sink.h>

#include "metrics/log_event.hpp"

namespace metronome {
namespace {

using json = nlohmann::json;

/// The default logger writes to a string with `formatter` while alive.
class captured_log {
public:
  explicit captured_log(std::unique_ptr<spdlog::formatter> formatter)
    : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)),
      previous_(spdlog::default_logger()),
      level_(spdlog::get_level()) {
    sink_->set_formatter(std::move(formatter));
    auto logger = std::make_shared<spdlog::logger>("test", sink_);
    logger->set_level(spdlog::level::debug);
    spdlog::set_default_logger(logger);
  }

  ~captured_log() {
    spdlog::set_default_logger(previous_);
    spdlog::set_level(level_);
  }

  std::string text() {
    sink_->flush();
    return out_.str();
  }

private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> previous_;
  spdlog::level::level_enum level_;
};

log_event sample_event() {
  log_event e("access");
  e.add("method", "POST")
    .add("route", "/v1/chat/completions")
    .add("status", int64_t{200})
    .add("ws_id", "a b\nFORGED \"x\"=1")
    .add("ttft_ms", 12.345, 1)
    .add_null("prefix_cache_hit_rate");
  return e;
}

TEST(LogEvent, TextIsKeyValuePairsWithClientTextEscapedAndQuoted) {
  EXPECT_EQ(sample_event().text(),
            "access method=POST route=/v1/chat/completions status=200 "
            "ws_id=\"a b\\nFORGED \\\"x\\\"=1\" ttft_ms=12.3 prefix_cache_hit_rate=-");
  EXPECT_EQ(log_event("e").add("empty", "").text(), "e empty=\"\"");
}

TEST(LogEvent, LongValuesAreCut) {
  auto text = log_event("e").add("v", std::string(500, 'x'), 10).text();
  EXPECT_EQ(text, "e v=xxxxxxxxxx...");
}

TEST(LogEvent, JsonMembersKeepTypes) {
  auto j = json::parse("{" + sample_event().json() + "}");
  EXPECT_EQ(j["event"], "access");
  EXPECT_EQ(j["status"], 200);
  EXPECT_EQ(j["ws_id"], "a b\nFORGED \"x\"=1");
  EXPECT_DOUBLE_EQ(j["ttft_ms"].get<double>(), 12.3);
  EXPECT_TRUE(j["prefix_cache_hit_rate"].is_null());
}

TEST(LogEvent, JsonSurvivesInvalidUtf8) {
  auto j = json::parse("{" + log_event("e").add("id", "ok\xff\xfe").json() + "}");
  EXPECT_EQ(j["id"], "ok\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(LogEvent, TheJsonFormatterWritesOneObjectALine) {
  captured_log log(make_json_formatter());
  sample_event().write(spdlog::level::info);
  spdlog::warn("plain {} with a\nnewline", "message");
  log_event("quiet").write(spdlog::level::trace); // below the level: nothing
  std::istringstream lines(log.text());
  std::string line;
  std::vector<json> objects;
  while (std::getline(lines, line))
    objects.push_back(json::parse(line));
  ASSERT_EQ(objects.size(), 2u) << log.text();
  EXPECT_EQ(objects[0]["level"], "info");
  EXPECT_EQ(objects[0]["event"], "access");
  EXPECT_EQ(objects[0]["ws_id"], "a b\nFORGED \"x\"=1");
  EXPECT_TRUE(objects[0]["time"].get<std::string>().ends_with("Z"));
  EXPECT_EQ(objects[0]["time"].get<std::string>().size(), std::string("2026-01-01T00:00:00.000Z").size());
  EXPECT_EQ(objects[1]["level"], "warning");
  EXPECT_EQ(objects[1]["msg"], "plain message with a\nnewline");
  EXPECT_FALSE(objects[1].contains("event"));
}

TEST(LogEvent, TextLoggersGetTheTextRendering) {
  captured_log log(std::make_unique<spdlog::pattern_formatter>("%l %v"));
  sample_event().write(spdlog::level::info);
  EXPECT_EQ(log.text(), "info " + sample_event().text() + "\n");
}

} // namespace
} // namespace metronome
