// The rules, as the format documents them:
//  - lines end in '\n'; '#' lines are HELP, TYPE or free comments;
//  - "# HELP name text": text escapes only '\\' and '\n';
//  - "# TYPE name type": counter, gauge, histogram, summary or untyped; at
//    most once per name and before the first sample of that name;
//  - samples: name [ "{" label="value" { "," label="value" } [","] "}" ] value
//    [ timestamp ]; label values escape '\\', '\"' and '\n'; values are Go
//    floats or +Inf, -Inf, NaN;
//  - all lines of one family are together; a series appears once;
//  - histograms: name_bucket with an "le" label per bucket, increasing, with
//    cumulative counts, one le="+Inf" bucket equal to name_count, and
//    name_sum.

#include "tests/metrics/exposition_checker.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

namespace metronome::test {

namespace {

bool name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}

bool name_char(char c) {
  return name_start(c) || (c >= '0' && c <= '9');
}

bool label_name_ok(const std::string& s) {
  if (s.empty() || s[0] == ':' || !name_start(s[0]) || s.starts_with("__"))
    return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return name_char(c) && c != ':'; });
}

bool metric_name_ok(const std::string& s) {
  return !s.empty() && name_start(s[0]) && std::all_of(s.begin(), s.end(), name_char);
}

/// Go's ParseFloat syntax (decimal) plus the text format's special values.
bool parse_value(const std::string& s, double& out) {
  if (s == "+Inf" || s == "Inf") {
    out = std::numeric_limits<double>::infinity();
    return true;
  }
  if (s == "-Inf") {
    out = -std::numeric_limits<double>::infinity();
    return true;
  }
  if (s == "NaN") {
    out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  std::string_view v = s;
  bool negative = false;
  if (!v.empty() && (v[0] == '+' || v[0] == '-')) {
    negative = v[0] == '-';
    v.remove_prefix(1);
  }
  if (v.empty() || !(std::isdigit(static_cast<unsigned char>(v[0])) || v[0] == '.'))
    return false;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc{} || end != v.data() + v.size())
    return false;
  if (negative)
    out = -out;
  return true;
}

struct line_parser {
  std::string_view s;
  size_t pos = 0;
  int line = 0;

  bool done() const {
    return pos >= s.size();
  }

  char peek() const {
    return done() ? '\0' : s[pos];
  }

  std::string take_name() {
    size_t start = pos;
    while (!done() && name_char(s[pos]))
      ++pos;
    return std::string(s.substr(start, pos - start));
  }
};

/// Unescapes a label value up to the closing quote; false on a bad escape or
/// a missing quote.
bool take_label_value(line_parser& p, std::string& out) {
  while (!p.done()) {
    char c = p.s[p.pos++];
    if (c == '"')
      return true;
    if (c == '\n')
      return false;
    if (c == '\\') {
      if (p.done())
        return false;
      char e = p.s[p.pos++];
      if (e == '\\')
        out += '\\';
      else if (e == '"')
        out += '"';
      else if (e == 'n')
        out += '\n';
      else
        return false;
    } else {
      out += c;
    }
  }
  return false;
}

std::string series_key(const parsed_sample& s) {
  auto labels = s.labels;
  std::sort(labels.begin(), labels.end());
  std::string key = s.name + "{";
  for (const auto& [k, v] : labels)
    key += k + "=" + v + "\x1f";
  return key + "}";
}

void check_histogram(const parsed_family& fam) {
  // Group by the labels other than le.
  struct group {
    std::vector<std::pair<double, const parsed_sample*>> buckets;
    const parsed_sample* sum = nullptr;
    const parsed_sample* count = nullptr;
  };
  std::map<std::string, group> groups;
  for (const auto& s : fam.samples) {
    parsed_sample key = s;
    key.name = fam.name;
    std::optional<double> le;
    key.labels.clear();
    for (const auto& [k, v] : s.labels) {
      if (k == "le") {
        double x = 0;
        if (s.name != fam.name + "_bucket" || !parse_value(v, x))
          ADD_FAILURE() << "line " << s.line << ": bad le label \"" << v << "\" on " << s.name;
        else
          le = x;
      } else {
        key.labels.emplace_back(k, v);
      }
    }
    auto& g = groups[series_key(key)];
    if (s.name == fam.name + "_bucket") {
      if (!le)
        ADD_FAILURE() << "line " << s.line << ": bucket without le";
      else
        g.buckets.emplace_back(*le, &s);
    } else if (s.name == fam.name + "_sum") {
      g.sum = &s;
    } else if (s.name == fam.name + "_count") {
      g.count = &s;
    } else {
      ADD_FAILURE() << "line " << s.line << ": " << s.name << " in histogram " << fam.name;
    }
  }
  for (const auto& [key, g] : groups) {
    if (g.buckets.empty()) {
      ADD_FAILURE() << fam.name << " " << key << ": no buckets";
      continue;
    }
    for (size_t i = 1; i < g.buckets.size(); ++i) {
      if (!(g.buckets[i].first > g.buckets[i - 1].first))
        ADD_FAILURE() << "line " << g.buckets[i].second->line << ": le not increasing";
      if (g.buckets[i].second->value < g.buckets[i - 1].second->value)
        ADD_FAILURE() << "line " << g.buckets[i].second->line << ": bucket counts not cumulative";
    }
    for (const auto& [le, s] : g.buckets)
      if (s->value < 0 || s->value != std::floor(s->value))
        ADD_FAILURE() << "line " << s->line << ": bucket count " << s->value_text;
    if (!std::isinf(g.buckets.back().first) || g.buckets.back().first < 0)
      ADD_FAILURE() << fam.name << " " << key << ": last bucket is not le=\"+Inf\"";
    if (g.count == nullptr)
      ADD_FAILURE() << fam.name << " " << key << ": no _count";
    else if (g.count->value != g.buckets.back().second->value)
      ADD_FAILURE() << "line " << g.count->line << ": _count " << g.count->value_text
                    << " != +Inf bucket " << g.buckets.back().second->value_text;
    if (g.sum == nullptr)
      ADD_FAILURE() << fam.name << " " << key << ": no _sum";
  }
}

bool belongs(const std::string& sample, const parsed_family& fam) {
  if (sample == fam.name)
    return fam.type != "histogram" && fam.type != "summary";
  if (fam.type == "histogram")
    return sample == fam.name + "_bucket" || sample == fam.name + "_sum"
           || sample == fam.name + "_count";
  if (fam.type == "summary")
    return sample == fam.name + "_sum" || sample == fam.name + "_count";
  return false;
}

} // namespace

std::vector<parsed_family> check_exposition(const std::string& text) {
  std::vector<parsed_family> families;
  if (!text.empty() && text.back() != '\n')
    ADD_FAILURE() << "the text does not end with a newline";
  std::set<std::string> helped, typed, finished, series;
  std::istringstream in(text);
  std::string raw;
  int line_no = 0;
  auto current = [&]() -> parsed_family* { return families.empty() ? nullptr : &families.back(); };
  auto family_for = [&](const std::string& name) -> parsed_family* {
    if (auto* f = current(); f && f->name == name)
      return f;
    if (auto* f = current())
      finished.insert(f->name);
    if (finished.count(name))
      ADD_FAILURE() << "line " << line_no << ": lines of " << name << " are not together";
    families.push_back(parsed_family{name, "", "untyped", {}});
    return &families.back();
  };
  while (std::getline(in, raw)) {
    ++line_no;
    if (raw.empty()) {
      ADD_FAILURE() << "line " << line_no << ": empty line";
      continue;
    }
    line_parser p{raw, 0, line_no};
    if (raw[0] == '#') {
      std::istringstream words(raw);
      std::string hash, keyword, name;
      words >> hash >> keyword >> name;
      if (hash != "#" || (keyword != "HELP" && keyword != "TYPE"))
        continue; // a free comment
      if (!metric_name_ok(name)) {
        ADD_FAILURE() << "line " << line_no << ": bad metric name \"" << name << "\"";
        continue;
      }
      auto prefix = "# " + keyword + " " + name;
      std::string rest = raw.size() > prefix.size() ? raw.substr(prefix.size() + 1) : "";
      if (raw.size() > prefix.size() && raw[prefix.size()] != ' ')
        ADD_FAILURE() << "line " << line_no << ": no space after the name";
      auto* fam = family_for(name);
      if (!fam->samples.empty())
        ADD_FAILURE() << "line " << line_no << ": " << keyword << " after samples of " << name;
      if (keyword == "HELP") {
        if (!helped.insert(name).second)
          ADD_FAILURE() << "line " << line_no << ": second HELP for " << name;
        std::string help;
        for (size_t i = 0; i < rest.size(); ++i) {
          if (rest[i] != '\\') {
            help += rest[i];
          } else if (i + 1 < rest.size() && rest[i + 1] == '\\') {
            help += '\\';
            ++i;
          } else if (i + 1 < rest.size() && rest[i + 1] == 'n') {
            help += '\n';
            ++i;
          } else {
            ADD_FAILURE() << "line " << line_no << ": bad escape in HELP";
          }
        }
        fam->help = help;
      } else {
        if (!typed.insert(name).second)
          ADD_FAILURE() << "line " << line_no << ": second TYPE for " << name;
        static const std::set<std::string> types = {"counter", "gauge", "histogram", "summary",
                                                    "untyped"};
        if (!types.count(rest))
          ADD_FAILURE() << "line " << line_no << ": unknown type \"" << rest << "\"";
        fam->type = rest;
      }
      continue;
    }
    parsed_sample sample;
    sample.line = line_no;
    sample.name = p.take_name();
    if (!metric_name_ok(sample.name)) {
      ADD_FAILURE() << "line " << line_no << ": bad metric name in \"" << raw << "\"";
      continue;
    }
    if (p.peek() == '{') {
      ++p.pos;
      std::set<std::string> seen;
      while (p.peek() != '}') {
        auto label = p.take_name();
        if (!label_name_ok(label) || p.peek() != '=') {
          ADD_FAILURE() << "line " << line_no << ": bad label name \"" << label << "\"";
          break;
        }
        ++p.pos;
        if (p.peek() != '"') {
          ADD_FAILURE() << "line " << line_no << ": label value not quoted";
          break;
        }
        ++p.pos;
        std::string value;
        if (!take_label_value(p, value)) {
          ADD_FAILURE() << "line " << line_no << ": bad label value";
          break;
        }
        if (!seen.insert(label).second)
          ADD_FAILURE() << "line " << line_no << ": label " << label << " twice";
        sample.labels.emplace_back(label, value);
        if (p.peek() == ',')
          ++p.pos;
        else if (p.peek() != '}') {
          ADD_FAILURE() << "line " << line_no << ": expected ',' or '}'";
          break;
        }
      }
      if (p.peek() != '}')
        continue;
      ++p.pos;
    }
    if (p.peek() != ' ') {
      ADD_FAILURE() << "line " << line_no << ": expected one space before the value";
      continue;
    }
    ++p.pos;
    auto rest = std::string(p.s.substr(p.pos));
    auto space = rest.find(' ');
    sample.value_text = rest.substr(0, space);
    if (!parse_value(sample.value_text, sample.value))
      ADD_FAILURE() << "line " << line_no << ": bad value \"" << sample.value_text << "\"";
    if (space != std::string::npos) {
      auto ts = rest.substr(space + 1);
      if (ts.empty() || !std::all_of(ts.begin() + (ts[0] == '-'), ts.end(), ::isdigit))
        ADD_FAILURE() << "line " << line_no << ": bad timestamp \"" << ts << "\"";
    }
    // A sample belongs to the family whose TYPE block it is in.
    auto* fam = current();
    if (fam == nullptr || !belongs(sample.name, *fam))
      fam = family_for(sample.name);
    if (fam->type == "counter" && !(sample.value >= 0))
      ADD_FAILURE() << "line " << line_no << ": counter value " << sample.value_text;
    if (!series.insert(series_key(sample)).second)
      ADD_FAILURE() << "line " << line_no << ": series repeated";
    fam->samples.push_back(std::move(sample));
  }
  for (const auto& fam : families)
    if (fam.type == "histogram")
      check_histogram(fam);
  return families;
}

const parsed_family* find_family(const std::vector<parsed_family>& families,
                                 const std::string& name) {
  for (const auto& f : families)
    if (f.name == name)
      return &f;
  return nullptr;
}

const parsed_sample* find_sample(const parsed_family& family, const std::string& name,
                                 const std::vector<std::pair<std::string, std::string>>& labels) {
  for (const auto& s : family.samples)
    if (s.name == name && s.labels == labels)
      return &s;
  return nullptr;
}

} // namespace metronome::test
