#include "metrics/prometheus.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>

namespace metronome::prometheus {

std::string_view to_string(metric_type type) {
  switch (type) {
    case metric_type::counter: return "counter";
    case metric_type::gauge: return "gauge";
    case metric_type::histogram: return "histogram";
  }
  return "untyped";
}

// -- text format helpers -------------------------------------------------------

std::string format_value(double value) {
  if (std::isnan(value))
    return "NaN";
  if (std::isinf(value))
    return value > 0 ? "+Inf" : "-Inf";
  std::array<char, 64> buf{};
  auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), value);
  return std::string(buf.data(), end);
}

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

std::string escape_help(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

bool is_alpha_(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

void append_count(std::string& out, uint64_t n) {
  std::array<char, 24> buf{};
  auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), n);
  out.append(buf.data(), end);
}

/// One sample line: name{labels} value.
void append_sample(std::string& out, std::string_view name, std::string_view suffix,
                   std::string_view labels, std::string_view value) {
  out += name;
  out += suffix;
  if (!labels.empty()) {
    out += '{';
    out += labels;
    out += '}';
  }
  out += ' ';
  out += value;
  out += '\n';
}

} // namespace

bool valid_metric_name(std::string_view name) {
  if (name.empty() || !(is_alpha_(name[0]) || name[0] == ':'))
    return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return is_alpha_(c) || is_digit(c) || c == ':'; });
}

bool valid_label_name(std::string_view name) {
  if (name.empty() || !is_alpha_(name[0]) || name.starts_with("__"))
    return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return is_alpha_(c) || is_digit(c); });
}

// -- counter -------------------------------------------------------------------

void counter::throw_negative(double amount) {
  throw std::invalid_argument("prometheus counter: cannot add " + format_value(amount)
                              + " (counters only go up)");
}

// -- histogram -----------------------------------------------------------------

histogram::histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)) {
  if (!bounds_.empty() && bounds_.back() == std::numeric_limits<double>::infinity())
    bounds_.pop_back();
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]))
      throw std::invalid_argument("prometheus histogram: bucket bound "
                                  + format_value(bounds_[i]) + " is not finite");
    if (i > 0 && !(bounds_[i] > bounds_[i - 1]))
      throw std::invalid_argument("prometheus histogram: bucket bounds must increase strictly, "
                                  "got " + format_value(bounds_[i - 1]) + " then "
                                  + format_value(bounds_[i]));
  }
  counts_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
}

void histogram::observe(double value) noexcept {
  if (std::isnan(value))
    return;
  // First bound >= value: the bucket `le` that value belongs to.
  auto i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value)
                               - bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

histogram_snapshot histogram::snapshot() const {
  histogram_snapshot s;
  s.upper_bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

double histogram_snapshot::mean() const noexcept {
  auto n = count();
  return n == 0 ? std::numeric_limits<double>::quiet_NaN() : sum / static_cast<double>(n);
}

double histogram_snapshot::quantile(double q) const noexcept {
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  constexpr double inf = std::numeric_limits<double>::infinity();
  if (std::isnan(q))
    return nan;
  if (q < 0)
    return -inf;
  if (q > 1)
    return inf;
  auto n = count();
  if (n == 0 || upper_bounds.empty())
    return nan;
  double rank = q * static_cast<double>(n);
  // The first bucket whose cumulative count reaches the rank; a zero rank
  // goes to the first non-empty bucket.
  size_t b = 0;
  while (b < upper_bounds.size()
         && (static_cast<double>(cumulative[b]) < rank || cumulative[b] == 0))
    ++b;
  if (b == upper_bounds.size())
    return upper_bounds.back(); // in the +Inf bucket: the highest finite bound
  if (b == 0 && upper_bounds[0] <= 0)
    return upper_bounds[0];
  double start = b == 0 ? 0.0 : upper_bounds[b - 1];
  double end = upper_bounds[b];
  double below = b == 0 ? 0.0 : static_cast<double>(cumulative[b - 1]);
  double in_bucket = static_cast<double>(cumulative[b]) - below;
  return start + (end - start) * ((rank - below) / in_bucket);
}

histogram_snapshot histogram_snapshot::since(const histogram_snapshot& earlier) const {
  if (earlier.upper_bounds != upper_bounds)
    throw std::invalid_argument("histogram_snapshot::since: snapshots of different histograms");
  histogram_snapshot d;
  d.upper_bounds = upper_bounds;
  d.cumulative.resize(cumulative.size());
  for (size_t i = 0; i < cumulative.size(); ++i)
    d.cumulative[i] = cumulative[i] - std::min(cumulative[i], earlier.cumulative[i]);
  d.sum = sum - earlier.sum;
  return d;
}

// -- bucket layouts ------------------------------------------------------------

std::vector<double> linear_buckets(double start, double width, size_t count) {
  if (!(width > 0))
    throw std::invalid_argument("linear_buckets: width must be > 0");
  std::vector<double> out;
  for (size_t i = 0; i < count; ++i)
    out.push_back(start + width * static_cast<double>(i));
  return out;
}

std::vector<double> exponential_buckets(double start, double factor, size_t count) {
  if (!(start > 0) || !(factor > 1))
    throw std::invalid_argument("exponential_buckets: need start > 0 and factor > 1");
  std::vector<double> out;
  double x = start;
  for (size_t i = 0; i < count; ++i, x *= factor)
    out.push_back(x);
  return out;
}

namespace buckets {

std::vector<double> time_to_first_token_seconds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}

std::vector<double> inter_token_latency_seconds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
          0.4,   0.5,    0.75,  1.0,  2.5,   5.0,  7.5,   10.0, 20.0, 40.0, 80.0};
}

std::vector<double> request_latency_seconds() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

std::vector<double> ratio() {
  std::vector<double> out;
  for (int i = 1; i <= 20; ++i)
    out.push_back(i / 20.0); // exact multiples, printed as 0.05, 0.1, ...
  return out;
}

std::vector<double> powers_of_two() {
  return exponential_buckets(1, 2, 14);
}

} // namespace buckets

// -- families ------------------------------------------------------------------

namespace detail {

std::string render_labels(const label_set& constant, const std::vector<std::string>& names,
                          std::span<const std::string> values) {
  std::string out;
  auto add = [&out](std::string_view name, std::string_view value) {
    if (!out.empty())
      out += ',';
    out += name;
    out += "=\"";
    out += escape_label_value(value);
    out += '"';
  };
  for (const auto& [name, value] : constant)
    add(name, value);
  for (size_t i = 0; i < names.size() && i < values.size(); ++i)
    add(names[i], values[i]);
  return out;
}

void render_samples(std::string& out, const std::string& name, const std::string& labels,
                    const counter& m) {
  append_sample(out, name, "", labels, format_value(m.value()));
}

void render_samples(std::string& out, const std::string& name, const std::string& labels,
                    const gauge& m) {
  append_sample(out, name, "", labels, format_value(m.value()));
}

void render_samples(std::string& out, const std::string& name, const std::string& labels,
                    const histogram& m) {
  auto s = m.snapshot();
  std::string with_le = labels.empty() ? std::string() : labels + ",";
  std::string count_text;
  for (size_t i = 0; i < s.cumulative.size(); ++i) {
    auto le = i < s.upper_bounds.size() ? format_value(s.upper_bounds[i]) : "+Inf";
    count_text.clear();
    append_count(count_text, s.cumulative[i]);
    append_sample(out, name, "_bucket", with_le + "le=\"" + le + "\"", count_text);
  }
  append_sample(out, name, "_sum", labels, format_value(s.sum));
  count_text.clear();
  append_count(count_text, s.count());
  append_sample(out, name, "_count", labels, count_text);
}

} // namespace detail

family_base::family_base(std::string name, std::string help, metric_type type,
                         std::vector<std::string> label_names, label_set constant_labels)
  : name_(std::move(name)),
    help_(std::move(help)),
    type_(type),
    label_names_(std::move(label_names)),
    constant_labels_(std::move(constant_labels)) {
  if (!valid_metric_name(name_))
    throw std::invalid_argument("prometheus: invalid metric name \"" + name_ + "\"");
  std::set<std::string> seen;
  auto check = [&](const std::string& label) {
    if (!valid_label_name(label))
      throw std::invalid_argument("prometheus: " + name_ + ": invalid label name \"" + label
                                  + "\"");
    if (type_ == metric_type::histogram && label == "le")
      throw std::invalid_argument("prometheus: " + name_
                                  + ": label \"le\" is reserved for histogram buckets");
    if (!seen.insert(label).second)
      throw std::invalid_argument("prometheus: " + name_ + ": label \"" + label
                                  + "\" given twice");
  };
  for (const auto& [label, value] : constant_labels_)
    check(label);
  for (const auto& label : label_names_)
    check(label);
}

void family_base::check_arity(size_t n) const {
  if (n != label_names_.size())
    throw std::invalid_argument("prometheus: " + name_ + ": expected "
                                + std::to_string(label_names_.size()) + " label values, got "
                                + std::to_string(n));
}

// -- registry ------------------------------------------------------------------

namespace {

template <class Metric>
std::unique_ptr<Metric> make_plain(const std::vector<double>&) {
  return std::make_unique<Metric>();
}

std::unique_ptr<histogram> make_histogram(const std::vector<double>& bounds) {
  return std::make_unique<histogram>(bounds);
}

std::vector<std::string> sample_names(const std::string& name, metric_type type) {
  if (type == metric_type::histogram)
    return {name, name + "_bucket", name + "_sum", name + "_count"};
  return {name};
}

} // namespace

template <class Metric>
family<Metric>& registry::add_family(const std::string& name, const std::string& help,
                                     metric_type type, std::vector<std::string> label_names,
                                     const label_set& constant, std::vector<double> bounds) {
  if (type == metric_type::histogram) {
    // Normalise (drop +Inf) and validate the bounds once, through the same
    // constructor every child uses.
    bounds = histogram(std::move(bounds)).upper_bounds();
  }
  std::lock_guard<std::mutex> guard(mtx_);
  if (auto i = families_.find(name); i != families_.end()) {
    auto* existing = dynamic_cast<family<Metric>*>(i->second.get());
    if (existing == nullptr || existing->type() != type || existing->help() != help
        || existing->label_names() != label_names || existing->constant_labels() != constant
        || existing->bounds() != bounds)
      throw std::invalid_argument("prometheus: metric \"" + name
                                  + "\" is already registered with a different definition");
    return *existing;
  }
  auto names = sample_names(name, type);
  for (const auto& n : names)
    if (taken_.count(n))
      throw std::invalid_argument("prometheus: metric \"" + name + "\" clashes with the sample \""
                                  + n + "\" of another metric");
  typename family<Metric>::factory make = nullptr;
  if constexpr (std::is_same_v<Metric, histogram>)
    make = &make_histogram;
  else
    make = &make_plain<Metric>;
  auto fam = std::make_unique<family<Metric>>(name, help, type, std::move(label_names), constant,
                                              std::move(bounds), make);
  auto& ref = *fam;
  families_.emplace(name, std::move(fam));
  taken_.insert(names.begin(), names.end());
  return ref;
}

counter& registry::add_counter(const std::string& name, const std::string& help,
                               const label_set& constant_labels) {
  return add_family<counter>(name, help, metric_type::counter, {}, constant_labels, {}).with({});
}

gauge& registry::add_gauge(const std::string& name, const std::string& help,
                           const label_set& constant_labels) {
  return add_family<gauge>(name, help, metric_type::gauge, {}, constant_labels, {}).with({});
}

histogram& registry::add_histogram(const std::string& name, const std::string& help,
                                   std::vector<double> upper_bounds,
                                   const label_set& constant_labels) {
  return add_family<histogram>(name, help, metric_type::histogram, {}, constant_labels,
                               std::move(upper_bounds))
    .with({});
}

family<counter>& registry::add_counter_family(const std::string& name, const std::string& help,
                                              std::vector<std::string> label_names,
                                              const label_set& constant_labels) {
  return add_family<counter>(name, help, metric_type::counter, std::move(label_names),
                             constant_labels, {});
}

family<gauge>& registry::add_gauge_family(const std::string& name, const std::string& help,
                                          std::vector<std::string> label_names,
                                          const label_set& constant_labels) {
  return add_family<gauge>(name, help, metric_type::gauge, std::move(label_names),
                           constant_labels, {});
}

family<histogram>& registry::add_histogram_family(const std::string& name,
                                                  const std::string& help,
                                                  std::vector<std::string> label_names,
                                                  std::vector<double> upper_bounds,
                                                  const label_set& constant_labels) {
  return add_family<histogram>(name, help, metric_type::histogram, std::move(label_names),
                               constant_labels, std::move(upper_bounds));
}

void registry::render_to(std::string& out) const {
  std::lock_guard<std::mutex> guard(mtx_);
  for (const auto& [name, fam] : families_)
    fam->render(out);
}

std::string registry::render() const {
  std::string out;
  render_to(out);
  return out;
}

} // namespace metronome::prometheus
