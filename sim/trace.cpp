#include "sim/trace.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

namespace metronome::sim {

namespace {

std::string compose(const std::string& file, int64_t line, const std::string& field,
                    const std::string& problem) {
  std::string out = file;
  if (line > 0)
    out += ":" + std::to_string(line);
  if (!field.empty())
    out += ": " + field;
  return out + ": " + problem;
}

std::vector<std::string_view> split_csv(std::string_view line) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    auto comma = line.find(',', start);
    auto cell = line.substr(start, comma == std::string_view::npos ? line.npos : comma - start);
    while (!cell.empty() && (cell.front() == ' ' || cell.front() == '"'))
      cell.remove_prefix(1);
    while (!cell.empty() && (cell.back() == ' ' || cell.back() == '"' || cell.back() == '\r'))
      cell.remove_suffix(1);
    out.push_back(cell);
    if (comma == std::string_view::npos)
      break;
    start = comma + 1;
  }
  return out;
}

int32_t parse_count(std::string_view cell, const std::string& src, int64_t line,
                    const std::string& field) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(cell.data(), cell.data() + cell.size(), v);
  if (ec != std::errc{} || p != cell.data() + cell.size())
    throw trace_error(src, line, field, "'" + std::string(cell) + "' is not an integer");
  if (v < 0 || v > (int64_t(1) << 30))
    throw trace_error(src, line, field, std::to_string(v) + " is out of range (0..2^30)");
  return int32_t(v);
}

double parse_number(std::string_view cell, const std::string& src, int64_t line,
                    const std::string& field) {
  double v = 0;
  auto [p, ec] = std::from_chars(cell.data(), cell.data() + cell.size(), v);
  if (ec != std::errc{} || p != cell.data() + cell.size() || !std::isfinite(v))
    throw trace_error(src, line, field, "'" + std::string(cell) + "' is not a number");
  return v;
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

/// "YYYY-MM-DD hh:mm:ss[.fraction]" as seconds since the epoch.
double parse_timestamp(std::string_view s, const std::string& src, int64_t line) {
  auto bad = [&] {
    return trace_error(src, line, "TIMESTAMP",
                       "'" + std::string(s) + "' is not 'YYYY-MM-DD hh:mm:ss[.fraction]'");
  };
  if (s.size() < 19 || s[4] != '-' || s[7] != '-' || (s[10] != ' ' && s[10] != 'T')
      || s[13] != ':' || s[16] != ':')
    throw bad();
  auto num = [&](size_t at, size_t n) {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data() + at, s.data() + at + n, v);
    if (ec != std::errc{} || p != s.data() + at + n)
      throw bad();
    return v;
  };
  const int64_t days = days_from_civil(num(0, 4), num(5, 2), num(8, 2));
  double secs = double(days) * 86400.0 + double(num(11, 2) * 3600 + num(14, 2) * 60 + num(17, 2));
  if (s.size() > 19) {
    if (s[19] != '.')
      throw bad();
    double scale = 0.1;
    for (size_t i = 20; i < s.size(); ++i) {
      if (s[i] < '0' || s[i] > '9')
        throw bad();
      secs += (s[i] - '0') * scale;
      scale /= 10;
    }
  }
  return secs;
}

void finish(trace& t) {
  std::stable_sort(t.requests.begin(), t.requests.end(),
                   [](const auto& a, const auto& b) { return a.arrival_s < b.arrival_s; });
  if (t.requests.empty())
    return;
  const double t0 = t.requests.front().arrival_s;
  for (auto& r : t.requests) {
    r.arrival_s -= t0;
    r.output_tokens = std::max(r.output_tokens, 1);
  }
}

template <class F>
void for_each_line(std::string_view text, F&& f) {
  int64_t line = 0;
  size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string_view::npos)
      end = text.size();
    ++line;
    auto l = text.substr(start, end - start);
    if (!l.empty() && l.back() == '\r')
      l.remove_suffix(1);
    f(l, line);
    start = end + 1;
  }
}

trace parse_azure(std::string_view text, const std::string& src) {
  trace t;
  std::map<std::string, size_t> cols;
  for_each_line(text, [&](std::string_view l, int64_t line) {
    if (l.empty())
      return;
    auto cells = split_csv(l);
    if (cols.empty()) {
      for (size_t i = 0; i < cells.size(); ++i)
        cols[std::string(cells[i])] = i;
      for (auto name : {"TIMESTAMP", "ContextTokens", "GeneratedTokens"})
        if (!cols.contains(name))
          throw trace_error(src, line, name, "missing column in the header");
      return;
    }
    auto cell = [&](const char* name) -> std::string_view {
      auto i = cols.at(name);
      if (i >= cells.size())
        throw trace_error(src, line, name, "missing value");
      return cells[i];
    };
    trace_request r;
    r.arrival_s = parse_timestamp(cell("TIMESTAMP"), src, line);
    r.prompt_tokens = parse_count(cell("ContextTokens"), src, line, "ContextTokens");
    if (r.prompt_tokens == 0)
      throw trace_error(src, line, "ContextTokens", "must be > 0 (an empty prompt)");
    r.output_tokens = parse_count(cell("GeneratedTokens"), src, line, "GeneratedTokens");
    t.requests.push_back(std::move(r));
  });
  if (cols.empty())
    throw trace_error(src, 0, "", "empty file (expected a header TIMESTAMP,ContextTokens,"
                                  "GeneratedTokens)");
  return t;
}

trace parse_mooncake(std::string_view text, const std::string& src) {
  trace t;
  for_each_line(text, [&](std::string_view l, int64_t line) {
    if (l.find_first_not_of(" \t") == std::string_view::npos)
      return;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(l);
    } catch (const nlohmann::json::exception& e) {
      throw trace_error(src, line, "", std::string("malformed JSON: ") + e.what());
    }
    if (!j.is_object())
      throw trace_error(src, line, "", "expected a JSON object");
    auto get = [&](const char* key) -> const nlohmann::json& {
      auto i = j.find(key);
      if (i == j.end())
        throw trace_error(src, line, key, "missing");
      if (!i->is_number())
        throw trace_error(src, line, key, "expected a number, got " + i->dump());
      return *i;
    };
    trace_request r;
    const double ms = get("timestamp").get<double>();
    if (!std::isfinite(ms) || ms < 0)
      throw trace_error(src, line, "timestamp", "must be a finite number >= 0");
    r.arrival_s = ms / 1e3;
    auto count = [&](const char* key) {
      const auto& v = get(key);
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > (int64_t(1) << 30))
        throw trace_error(src, line, key, "expected an integer in 0..2^30, got " + v.dump());
      return int32_t(v.get<int64_t>());
    };
    r.prompt_tokens = count("input_length");
    if (r.prompt_tokens == 0)
      throw trace_error(src, line, "input_length", "must be > 0 (an empty prompt)");
    r.output_tokens = count("output_length");
    if (auto h = j.find("hash_ids"); h != j.end()) {
      if (!h->is_array())
        throw trace_error(src, line, "hash_ids", "expected an array of block ids");
      for (const auto& id : *h) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0)
          throw trace_error(src, line, "hash_ids",
                            "expected integers >= 0, got " + id.dump());
        r.hash_ids.push_back(id.get<int64_t>());
      }
      if (int64_t(r.hash_ids.size()) * hash_block_tokens
          >= int64_t(r.prompt_tokens) + hash_block_tokens)
        throw trace_error(src, line, "hash_ids",
                          std::to_string(r.hash_ids.size()) + " blocks of "
                            + std::to_string(hash_block_tokens) + " tokens exceed input_length "
                            + std::to_string(r.prompt_tokens));
    }
    t.requests.push_back(std::move(r));
  });
  return t;
}

trace parse_simple_csv(std::string_view text, const std::string& src) {
  trace t;
  std::map<std::string, size_t> cols;
  bool header = false;
  for_each_line(text, [&](std::string_view l, int64_t line) {
    if (l.empty() || l.front() == '#')
      return;
    auto cells = split_csv(l);
    if (!header) {
      header = true;
      for (size_t i = 0; i < cells.size(); ++i)
        cols[std::string(cells[i])] = i;
      if (!cols.contains("arrival_s") && !cols.contains("arrival_ms"))
        throw trace_error(src, line, "arrival_s", "missing column in the header (arrival_s or "
                                                  "arrival_ms)");
      for (auto name : {"prompt_tokens", "output_tokens"})
        if (!cols.contains(name))
          throw trace_error(src, line, name, "missing column in the header");
      return;
    }
    auto cell = [&](const std::string& name) -> std::string_view {
      auto i = cols.at(name);
      if (i >= cells.size())
        throw trace_error(src, line, name, "missing value");
      return cells[i];
    };
    trace_request r;
    if (cols.contains("arrival_s"))
      r.arrival_s = parse_number(cell("arrival_s"), src, line, "arrival_s");
    else
      r.arrival_s = parse_number(cell("arrival_ms"), src, line, "arrival_ms") / 1e3;
    if (r.arrival_s < 0)
      throw trace_error(src, line, "arrival_s", "must be >= 0");
    r.prompt_tokens = parse_count(cell("prompt_tokens"), src, line, "prompt_tokens");
    if (r.prompt_tokens == 0)
      throw trace_error(src, line, "prompt_tokens", "must be > 0 (an empty prompt)");
    r.output_tokens = parse_count(cell("output_tokens"), src, line, "output_tokens");
    if (cols.contains("class"))
      r.request_class = std::string(cell("class"));
    if (cols.contains("non_alnum_share")) {
      const double v = parse_number(cell("non_alnum_share"), src, line, "non_alnum_share");
      if (v < 0 || v > 1)
        throw trace_error(src, line, "non_alnum_share", "must be in [0, 1]");
      r.non_alnum_share = float(v);
    }
    t.requests.push_back(std::move(r));
  });
  if (!header)
    throw trace_error(src, 0, "", "empty file (expected a header with arrival_s, "
                                  "prompt_tokens, output_tokens)");
  return t;
}

} // namespace

trace_error::trace_error(const std::string& file, int64_t line, const std::string& field,
                         const std::string& problem)
  : std::runtime_error(compose(file, line, field, problem)) {
  // nop
}

double trace::duration_s() const {
  return requests.empty() ? 0.0 : requests.back().arrival_s - requests.front().arrival_s;
}

bool parse_trace_format(std::string_view text, trace_format& out) {
  if (text == "azure")
    out = trace_format::azure;
  else if (text == "mooncake")
    out = trace_format::mooncake;
  else if (text == "csv")
    out = trace_format::csv;
  else
    return false;
  return true;
}

trace_format guess_trace_format(const std::filesystem::path& file) {
  const auto ext = file.extension().string();
  if (ext == ".jsonl" || ext == ".json")
    return trace_format::mooncake;
  std::ifstream in(file);
  std::string first;
  std::getline(in, first);
  if (first.rfind("TIMESTAMP", 0) == 0)
    return trace_format::azure;
  return trace_format::csv;
}

trace parse_trace(std::string_view text, trace_format format, const std::string& source) {
  trace t;
  switch (format) {
    case trace_format::azure:
      t = parse_azure(text, source);
      break;
    case trace_format::mooncake:
      t = parse_mooncake(text, source);
      break;
    case trace_format::csv:
      t = parse_simple_csv(text, source);
      break;
  }
  finish(t);
  t.name = std::filesystem::path(source).filename().string();
  return t;
}

trace read_trace(const std::filesystem::path& file, trace_format format) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw trace_error(file.string(), 0, "", "cannot open the file");
  std::stringstream buf;
  buf << in.rdbuf();
  return parse_trace(buf.str(), format, file.string());
}

} // namespace metronome::sim
