// The text exposition format 0.0.4 as registry::render() writes it: exact
// lines for a small registry, escaping, float formatting, cumulative buckets,
// a rule-by-rule check, and a cross-check with the Prometheus project's own
// Python client parser (prometheus_client, Debian's python3-prometheus-client).

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "metrics/prometheus.hpp"
#include "tests/metrics/exposition_checker.hpp"

namespace metronome::prometheus {
namespace {

using test::check_exposition;
using test::find_family;
using test::find_sample;

constexpr double inf = std::numeric_limits<double>::infinity();
constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// -- exact output ------------------------------------------------------------------

TEST(prometheus_format, small_registry_line_by_line) {
  registry reg;
  reg.add_counter("metronome:requests_total", "Finished requests.", {{"model", "tiny"}}).inc(3);
  reg.add_gauge("metronome:kv_cache_usage_perc", "KV-cache usage (0 to 1).").set(0.25);
  auto& ttft = reg.add_histogram("metronome:time_to_first_token_seconds", "Time to first token.",
                                 {0.125, 0.5});
  for (double v : {0.0625, 0.125, 0.375, 2.0}) // 0.125 sits on a bound: le is inclusive
    ttft.observe(v);
  auto& switches = reg.add_counter_family("metronome:ladb_switches_total", "Policy switches.",
                                          {"to"});
  switches.with({"ladb"}).inc(2);
  switches.with({"fcfs"}).inc();

  // Families sorted by name, children by label value; cumulative buckets with
  // +Inf equal to _count; exact sums of binary fractions.
  const std::string expected =
    "# HELP metronome:kv_cache_usage_perc KV-cache usage (0 to 1).\n"
    "# TYPE metronome:kv_cache_usage_perc gauge\n"
    "metronome:kv_cache_usage_perc 0.25\n"
    "# HELP metronome:ladb_switches_total Policy switches.\n"
    "# TYPE metronome:ladb_switches_total counter\n"
    "metronome:ladb_switches_total{to=\"fcfs\"} 1\n"
    "metronome:ladb_switches_total{to=\"ladb\"} 2\n"
    "# HELP metronome:requests_total Finished requests.\n"
    "# TYPE metronome:requests_total counter\n"
    "metronome:requests_total{model=\"tiny\"} 3\n"
    "# HELP metronome:time_to_first_token_seconds Time to first token.\n"
    "# TYPE metronome:time_to_first_token_seconds histogram\n"
    "metronome:time_to_first_token_seconds_bucket{le=\"0.125\"} 2\n"
    "metronome:time_to_first_token_seconds_bucket{le=\"0.5\"} 3\n"
    "metronome:time_to_first_token_seconds_bucket{le=\"+Inf\"} 4\n"
    "metronome:time_to_first_token_seconds_sum 2.5625\n"
    "metronome:time_to_first_token_seconds_count 4\n";
  auto text = reg.render();
  EXPECT_EQ(text, expected);
  check_exposition(text);
  EXPECT_EQ(registry::content_type, "text/plain; version=0.0.4; charset=utf-8");
}

TEST(prometheus_format, labelled_histograms_put_le_last) {
  registry reg;
  auto& fam = reg.add_histogram_family("metronome:step_seconds", "Step time.", {"phase"},
                                       {0.01, 0.1}, {{"device", "cpu"}});
  fam.with({"decode"}).observe(0.05);
  auto text = reg.render();
  EXPECT_NE(text.find("metronome:step_seconds_bucket{device=\"cpu\",phase=\"decode\",le=\"0.01\"} "
                      "0\n"),
            std::string::npos)
    << text;
  EXPECT_NE(text.find("metronome:step_seconds_bucket{device=\"cpu\",phase=\"decode\",le=\"0.1\"} "
                      "1\n"),
            std::string::npos)
    << text;
  EXPECT_NE(text.find("metronome:step_seconds_sum{device=\"cpu\",phase=\"decode\"} 0.05\n"),
            std::string::npos)
    << text;
  EXPECT_NE(text.find("metronome:step_seconds_count{device=\"cpu\",phase=\"decode\"} 1\n"),
            std::string::npos)
    << text;
  check_exposition(text);
}

TEST(prometheus_format, empty_metrics) {
  registry reg;
  reg.add_histogram("h", "Nothing observed.", {1, 2});
  reg.add_counter_family("c_total", "No child yet.", {"kind"});
  reg.add_gauge("g", "");
  EXPECT_EQ(reg.render(),
            "# HELP c_total No child yet.\n"
            "# TYPE c_total counter\n"
            "# TYPE g gauge\n"
            "g 0\n"
            "# HELP h Nothing observed.\n"
            "# TYPE h histogram\n"
            "h_bucket{le=\"1\"} 0\n"
            "h_bucket{le=\"2\"} 0\n"
            "h_bucket{le=\"+Inf\"} 0\n"
            "h_sum 0\n"
            "h_count 0\n");
  EXPECT_EQ(registry().render(), "");
}

// -- escaping and numbers ------------------------------------------------------------

TEST(prometheus_format, escapes_label_values_and_help) {
  EXPECT_EQ(escape_label_value("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(escape_label_value("plain {x=1,y} \xc3\xa9"), "plain {x=1,y} \xc3\xa9");
  // HELP escapes backslash and newline only; quotes stay.
  EXPECT_EQ(escape_help("say \"hi\"\\now\nthen"), "say \"hi\"\\\\now\\nthen");

  registry reg;
  reg.add_gauge_family("odd", "Line one\nline \\two \"quoted\"", {"path"})
    .with({"C:\\dir\n\"x\""})
    .set(1);
  auto text = reg.render();
  EXPECT_EQ(text,
            "# HELP odd Line one\\nline \\\\two \"quoted\"\n"
            "# TYPE odd gauge\n"
            "odd{path=\"C:\\\\dir\\n\\\"x\\\"\"} 1\n");
  auto families = check_exposition(text);
  ASSERT_EQ(families.size(), 1u);
  EXPECT_EQ(families[0].help, "Line one\nline \\two \"quoted\"");
  ASSERT_EQ(families[0].samples.size(), 1u);
  EXPECT_EQ(families[0].samples[0].labels[0].second, "C:\\dir\n\"x\"");
}

TEST(prometheus_format, float_values) {
  EXPECT_EQ(format_value(inf), "+Inf");
  EXPECT_EQ(format_value(-inf), "-Inf");
  EXPECT_EQ(format_value(nan), "NaN");
  EXPECT_EQ(format_value(0), "0");
  EXPECT_EQ(format_value(-0.5), "-0.5");
  EXPECT_EQ(format_value(3), "3");
  EXPECT_EQ(format_value(0.1), "0.1");
  EXPECT_EQ(format_value(123456789), "123456789");
  EXPECT_EQ(format_value(1e-05), "1e-05");
  EXPECT_EQ(format_value(1e21), "1e+21");
  // Shortest text that reads back exactly.
  for (double x : {0.1 + 0.2, 1.0 / 3.0, 2560.0, 5e-324, 1.7976931348623157e308})
    EXPECT_EQ(std::strtod(format_value(x).c_str(), nullptr), x) << format_value(x);

  registry reg;
  auto& g = reg.add_gauge_family("g", "Special values.", {"v"});
  g.with({"pinf"}).set(inf);
  g.with({"ninf"}).set(-inf);
  g.with({"nan"}).set(nan);
  auto text = reg.render();
  EXPECT_NE(text.find("g{v=\"pinf\"} +Inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("g{v=\"ninf\"} -Inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("g{v=\"nan\"} NaN\n"), std::string::npos) << text;
  check_exposition(text);
}

TEST(prometheus_format, bucket_bounds_as_le_labels) {
  registry reg;
  auto& h = reg.add_histogram("metronome:time_to_first_token_seconds", "TTFT.",
                              buckets::time_to_first_token_seconds());
  h.observe(0.03);
  auto text = reg.render();
  for (auto le : {"0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5",
                  "0.75", "1", "2.5", "5", "7.5", "10", "20", "40", "80", "160", "640", "2560",
                  "+Inf"})
    EXPECT_NE(text.find(std::string("le=\"") + le + "\""), std::string::npos) << le;
  EXPECT_NE(text.find("_bucket{le=\"0.02\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("_bucket{le=\"0.04\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("_bucket{le=\"2560\"} 1\n"), std::string::npos);
  check_exposition(text);
}

// -- the checker itself catches broken text ------------------------------------------

TEST(exposition_checker, rejects_broken_text) {
  EXPECT_NONFATAL_FAILURE(check_exposition("a 1"), "newline");
  EXPECT_NONFATAL_FAILURE(check_exposition("a{b=\"x\\q\"} 1\n"), "bad label value");
  EXPECT_NONFATAL_FAILURE(check_exposition("a{__b=\"x\"} 1\n"), "bad label name");
  EXPECT_NONFATAL_FAILURE(check_exposition("a inf\n"), "bad value");
  EXPECT_NONFATAL_FAILURE(check_exposition("# TYPE a gauge\n# TYPE a gauge\na 1\n"),
                          "second TYPE");
  EXPECT_NONFATAL_FAILURE(check_exposition("a 1\n# TYPE a gauge\n"), "TYPE after samples");
  EXPECT_NONFATAL_FAILURE(check_exposition("a 1\nb 1\na{x=\"1\"} 2\n"), "not together");
  EXPECT_NONFATAL_FAILURE(check_exposition("# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                                           "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"),
                          "not cumulative");
  EXPECT_NONFATAL_FAILURE(check_exposition("# TYPE h histogram\nh_bucket{le=\"1\"} 1\n"
                                           "h_sum 1\nh_count 1\n"),
                          "+Inf");
  EXPECT_NONFATAL_FAILURE(check_exposition("# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\n"
                                           "h_sum 1\nh_count 1\n"),
                          "_count 1 != +Inf bucket 2");
  EXPECT_NONFATAL_FAILURE(check_exposition("# HELP a bad \\t escape\na 1\n"), "bad escape");
}

// -- cross-check with the Prometheus Python client's parser ------------------------------

/// Parses `text` with prometheus_client's text parser and returns its view as
/// JSON, or null when the parser is not installed.
nlohmann::json parse_with_prometheus_client(const std::string& text) {
  const char* python = "/usr/bin/python3";
  if (::access(python, X_OK) != 0)
    return nullptr;
  auto dir = std::filesystem::temp_directory_path()
             / ("metronome_prom_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir / "metrics.txt", std::ios::binary) << text;
    std::ofstream(dir / "parse.py") << R"(import json, sys
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("null")
    sys.exit(0)
text = open(sys.argv[1], encoding="utf-8").read()
out = []
for f in text_string_to_metric_families(text):
    out.append({"name": f.name, "type": f.type, "help": f.documentation,
                "samples": [{"name": s.name, "labels": s.labels, "value": repr(s.value)}
                            for s in f.samples]})
print(json.dumps(out))
)";
  }
  auto cmd = std::string(python) + " " + (dir / "parse.py").string() + " "
             + (dir / "metrics.txt").string();
  std::string output;
  if (FILE* pipe = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0)
      output.append(buf, n);
    ::pclose(pipe);
  }
  std::filesystem::remove_all(dir);
  return nlohmann::json::parse(output);
}

TEST(prometheus_format, prometheus_client_parser_reads_it_back) {
  registry reg;
  const std::string help = "Help with \\ backslash, \"quotes\" and\na newline.";
  const std::string tricky = "a\\b \"c\" {d=e,f}\nline two \xc3\xa9";
  auto& requests = reg.add_counter_family("metronome:requests_total", help, {"route", "status"},
                                          {{"model", tricky}});
  requests.with({"/v1/chat/completions", "200"}).inc(41);
  requests.with({"/v1/completions", "400"}).inc(0.5);
  reg.add_gauge("metronome:kv_cache_usage_perc", "KV usage.").set(0.375);
  reg.add_gauge("metronome:unbounded", "Infinite.").set(-inf);
  auto& h = reg.add_histogram("metronome:e2e_request_latency_seconds", "E2E latency.",
                              buckets::request_latency_seconds());
  for (double v : {0.25, 0.5, 3.0, 9999.0})
    h.observe(v);

  auto text = reg.render();
  check_exposition(text);
  auto parsed = parse_with_prometheus_client(text);
  if (parsed.is_null())
    GTEST_SKIP() << "python3-prometheus-client is not installed (apt-get install "
                    "python3-prometheus-client)";

  auto family = [&](const std::string& name) -> const nlohmann::json* {
    for (const auto& f : parsed)
      if (f["name"] == name)
        return &f;
    return nullptr;
  };
  auto value_of = [&](const nlohmann::json& f, const std::string& sample,
                      const nlohmann::json& labels) {
    for (const auto& s : f["samples"])
      if (s["name"] == sample && s["labels"] == labels)
        return std::strtod(s["value"].get<std::string>().c_str(), nullptr);
    ADD_FAILURE() << "no sample " << sample << " " << labels.dump() << " in " << f.dump();
    return nan;
  };

  ASSERT_EQ(parsed.size(), 4u) << parsed.dump(2);
  // The parser strips a counter's _total from the family name, not the samples.
  const auto* c = family("metronome:requests");
  ASSERT_NE(c, nullptr) << parsed.dump(2);
  EXPECT_EQ((*c)["type"], "counter");
  EXPECT_EQ((*c)["help"], help);
  EXPECT_EQ(value_of(*c, "metronome:requests_total",
                     {{"model", tricky}, {"route", "/v1/chat/completions"}, {"status", "200"}}),
            41.0);
  EXPECT_EQ(value_of(*c, "metronome:requests_total",
                     {{"model", tricky}, {"route", "/v1/completions"}, {"status", "400"}}),
            0.5);

  const auto* g = family("metronome:kv_cache_usage_perc");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ((*g)["type"], "gauge");
  EXPECT_EQ(value_of(*g, "metronome:kv_cache_usage_perc", nlohmann::json::object()), 0.375);
  const auto* u = family("metronome:unbounded");
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(value_of(*u, "metronome:unbounded", nlohmann::json::object()), -inf);

  const auto* hf = family("metronome:e2e_request_latency_seconds");
  ASSERT_NE(hf, nullptr);
  EXPECT_EQ((*hf)["type"], "histogram");
  const std::string base = "metronome:e2e_request_latency_seconds";
  EXPECT_EQ(value_of(*hf, base + "_bucket", {{"le", "0.3"}}), 1.0);
  EXPECT_EQ(value_of(*hf, base + "_bucket", {{"le", "0.5"}}), 2.0);
  EXPECT_EQ(value_of(*hf, base + "_bucket", {{"le", "5"}}), 3.0);
  EXPECT_EQ(value_of(*hf, base + "_bucket", {{"le", "7680"}}), 3.0);
  EXPECT_EQ(value_of(*hf, base + "_bucket", {{"le", "+Inf"}}), 4.0);
  EXPECT_EQ(value_of(*hf, base + "_sum", nlohmann::json::object()), 10002.75);
  EXPECT_EQ(value_of(*hf, base + "_count", nlohmann::json::object()), 4.0);
  EXPECT_EQ((*hf)["samples"].size(), buckets::request_latency_seconds().size() + 1 + 2);
}

} // namespace
} // namespace metronome::prometheus
