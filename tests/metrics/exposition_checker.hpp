#pragma once
// A checker of the Prometheus text exposition format 0.0.4, written from the
// format's rules (prometheus.io "Exposition formats"), independent of
// metrics/prometheus.cpp: it parses every line and records a test failure for
// each rule broken, naming the line.

#include <string>
#include <utility>
#include <vector>

namespace metronome::test {

struct parsed_sample {
  std::string name;
  /// Unescaped label values, in the order written.
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
  /// The value as written ("+Inf", "0.25").
  std::string value_text;
  /// 1-based line number.
  int line = 0;
};

struct parsed_family {
  std::string name;
  /// Unescaped HELP text.
  std::string help;
  std::string type;
  std::vector<parsed_sample> samples;
};

/// Parses `text`, recording a non-fatal gtest failure for every rule it
/// breaks (syntax, escaping, value format, HELP/TYPE once and before the
/// samples, grouping, unique series, histogram buckets: `le` increasing,
/// cumulative counts, a final +Inf bucket equal to _count, _sum present).
/// Returns what it could parse.
std::vector<parsed_family> check_exposition(const std::string& text);

/// The family named `name` in `families`, or nullptr.
const parsed_family* find_family(const std::vector<parsed_family>& families,
                                 const std::string& name);

/// The sample with this name and exactly these labels, or nullptr.
const parsed_sample* find_sample(const parsed_family& family, const std::string& name,
                                 const std::vector<std::pair<std::string, std::string>>& labels);

} // namespace metronome::test
