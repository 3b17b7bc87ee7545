#pragma once
// Prometheus metrics for /metrics: counters, gauges and histograms, label
// families, and a registry that renders the text exposition format 0.0.4.
//
// Design note: observation is the hot path (per token, per step, from the
// executor and request actors), rendering the cold one (one scrape every few
// seconds). So a counter or gauge is one std::atomic<double>, and a histogram
// is an array of atomic per-bucket counts plus an atomic sum: observe() does
// a binary search over the fixed bounds and two relaxed atomic adds, never
// locks and never allocates. Buckets are stored non-cumulative and summed at
// render time, and _count is taken as the sum of the bucket counts read, so a
// scrape racing with observations still shows cumulative buckets whose +Inf
// bucket equals _count (only _sum may be off by the observations in flight).
// Locks exist only where metrics are created (registry, families) and where
// they are rendered. No CAF in here: any thread may use these.

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace metronome::prometheus {

/// Label name/value pairs, printed in this order.
using label_set = std::vector<std::pair<std::string, std::string>>;

/// The metric types this registry renders (the TYPE line).
enum class metric_type : uint8_t { counter, gauge, histogram };

/// "counter", "gauge" or "histogram".
std::string_view to_string(metric_type type);

// -- metrics -------------------------------------------------------------------

/// A monotonically increasing count. Lock-free; any thread.
class counter {
public:
  /// Adds `amount`, which must be >= 0 (throws std::invalid_argument on a
  /// negative amount or NaN: a counter never goes down).
  void inc(double amount = 1.0) {
    if (!(amount >= 0.0))
      throw_negative(amount);
    value_.fetch_add(amount, std::memory_order_relaxed);
  }

  /// The current total.
  double value() const noexcept {
    return value_.load(std::memory_order_relaxed);
  }

private:
  [[noreturn]] static void throw_negative(double amount);

  std::atomic<double> value_{0.0};
};

/// A value that goes up and down. Lock-free; any thread.
class gauge {
public:
  /// Replaces the value.
  void set(double value) noexcept {
    value_.store(value, std::memory_order_relaxed);
  }

  /// Adds `amount` (may be negative).
  void inc(double amount = 1.0) noexcept {
    value_.fetch_add(amount, std::memory_order_relaxed);
  }

  /// Subtracts `amount`.
  void dec(double amount = 1.0) noexcept {
    value_.fetch_sub(amount, std::memory_order_relaxed);
  }

  double value() const noexcept {
    return value_.load(std::memory_order_relaxed);
  }

private:
  std::atomic<double> value_{0.0};
};

/// A copy of a histogram's state at one moment, for rendering, tests and
/// reports. Plain value; not shared.
struct histogram_snapshot {
  /// The finite upper bounds, ascending; the +Inf bucket is implied.
  std::vector<double> upper_bounds;
  /// Cumulative counts: cumulative[i] = observations <= upper_bounds[i];
  /// one more entry at the end for +Inf, equal to count().
  std::vector<uint64_t> cumulative;
  /// Sum of all observed values.
  double sum = 0.0;

  /// Number of observations.
  uint64_t count() const noexcept {
    return cumulative.empty() ? 0 : cumulative.back();
  }

  /// sum / count; NaN when empty.
  double mean() const noexcept;

  /// Estimates the q-quantile (0 <= q <= 1) as Prometheus' histogram_quantile
  /// does: find the bucket holding rank q x count and interpolate linearly
  /// within it, the first bucket starting at 0. A rank in the +Inf bucket
  /// gives the highest finite bound. NaN when empty; -Inf for q < 0, +Inf for
  /// q > 1. The error is at most the width of the bucket the answer lies in.
  double quantile(double q) const noexcept;

  /// The observations made after `earlier` (a snapshot of the same
  /// histogram): for quantiles over a time window. Throws
  /// std::invalid_argument when the bounds differ.
  histogram_snapshot since(const histogram_snapshot& earlier) const;
};

/// Distribution of observed values in fixed buckets. observe() is lock-free
/// and allocation-free; any thread.
class histogram {
public:
  /// `upper_bounds`: finite, strictly increasing; a trailing +Inf is allowed
  /// and dropped (the +Inf bucket always exists). Throws
  /// std::invalid_argument otherwise.
  explicit histogram(std::vector<double> upper_bounds);

  /// Records one value. NaN is ignored (it would poison _sum forever).
  void observe(double value) noexcept;

  /// The current counts and sum.
  histogram_snapshot snapshot() const;

  const std::vector<double>& upper_bounds() const noexcept {
    return bounds_;
  }

private:
  std::vector<double> bounds_;
  /// Non-cumulative count per bucket; bounds_.size() + 1 entries (+Inf last).
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0.0};
};

// -- bucket layouts ------------------------------------------------------------

/// `count` bounds start, start + width, ...
std::vector<double> linear_buckets(double start, double width, size_t count);

/// `count` bounds start, start x factor, ... (start > 0, factor > 1).
std::vector<double> exponential_buckets(double start, double factor, size_t count);

/// The layouts of Metronome's standard histograms. The latency ones follow
/// vLLM's (vllm/v1/metrics/loggers.py), so dashboards built for `vllm:`
/// metrics read ours; inter-token latency adds 1, 2.5 and 5 ms buckets below
/// vLLM's 10 ms, since a small model decodes faster than that.
namespace buckets {

/// metronome:time_to_first_token_seconds.
std::vector<double> time_to_first_token_seconds();
/// metronome:inter_token_latency_seconds.
std::vector<double> inter_token_latency_seconds();
/// metronome:e2e_request_latency_seconds, metronome:request_queue_time_seconds.
std::vector<double> request_latency_seconds();
/// Ratios in [0, 1] (metronome:batch_efficiency_ratio): 0.05 steps.
std::vector<double> ratio();
/// Counts such as batch size per step or tokens per request: 1, 2, 4, ..., 8192.
std::vector<double> powers_of_two();

} // namespace buckets

// -- families ------------------------------------------------------------------

namespace detail {

/// Orders label-value tuples, comparing std::string with std::string_view
/// without building either (so lookups do not allocate).
struct label_values_less {
  using is_transparent = void;

  template <class A, class B>
  bool operator()(const A& a, const B& b) const {
    auto lhs_begin = std::begin(a);
    auto rhs_begin = std::begin(b);
    for (; lhs_begin != std::end(a) && rhs_begin != std::end(b); ++lhs_begin, ++rhs_begin) {
      std::string_view x = *lhs_begin;
      std::string_view y = *rhs_begin;
      if (x != y)
        return x < y;
    }
    return lhs_begin == std::end(a) && rhs_begin != std::end(b);
  }
};

void render_samples(std::string& out, const std::string& name, const std::string& labels,
                    const counter& m);
void render_samples(std::string& out, const std::string& name, const std::string& labels,
                    const gauge& m);
void render_samples(std::string& out, const std::string& name, const std::string& labels,
                    const histogram& m);

/// `name="value"` pairs, escaped and comma-joined, without braces.
std::string render_labels(const label_set& constant, const std::vector<std::string>& names,
                          std::span<const std::string> values);

} // namespace detail

/// What every family has: name, help, type, labels. Owned by a registry.
class family_base {
public:
  family_base(std::string name, std::string help, metric_type type,
              std::vector<std::string> label_names, label_set constant_labels);

  virtual ~family_base() = default;

  const std::string& name() const noexcept {
    return name_;
  }

  const std::string& help() const noexcept {
    return help_;
  }

  metric_type type() const noexcept {
    return type_;
  }

  /// The names of the variable labels, in the order values are given.
  const std::vector<std::string>& label_names() const noexcept {
    return label_names_;
  }

  /// Labels every sample of this family carries, printed first.
  const label_set& constant_labels() const noexcept {
    return constant_labels_;
  }

  /// Appends HELP, TYPE and every child's samples. Called by the registry.
  virtual void render(std::string& out) const = 0;

protected:
  void check_arity(size_t n) const;

  std::string name_;
  std::string help_;
  metric_type type_;
  std::vector<std::string> label_names_;
  label_set constant_labels_;
};

/// Metrics of one name told apart by label values, e.g.
/// metronome:ladb_switches_total{to="fcfs"}. Children are created on first use
/// and live as long as the registry.
template <class Metric>
class family : public family_base {
public:
  using factory = std::unique_ptr<Metric> (*)(const std::vector<double>&);

  family(std::string name, std::string help, metric_type type,
         std::vector<std::string> label_names, label_set constant_labels,
         std::vector<double> bounds, factory make)
    : family_base(std::move(name), std::move(help), type, std::move(label_names),
                  std::move(constant_labels)),
      bounds_(std::move(bounds)),
      make_(make) {
    // nop
  }

  /// The child with these label values, one per label name in order. Takes a
  /// lock (and allocates the first time): look a child up once and keep the
  /// reference for per-token use. Throws std::invalid_argument on a wrong
  /// number of values. Any thread.
  Metric& with(std::span<const std::string_view> values) {
    check_arity(values.size());
    std::lock_guard<std::mutex> guard(mtx_);
    auto i = children_.find(values);
    if (i == children_.end())
      i = children_.emplace(std::vector<std::string>(values.begin(), values.end()), make_(bounds_))
            .first;
    return *i->second;
  }

  Metric& with(std::initializer_list<std::string_view> values) {
    return with(std::span<const std::string_view>(values.begin(), values.size()));
  }

  /// Histogram families: the bounds every child gets; empty otherwise.
  const std::vector<double>& bounds() const noexcept {
    return bounds_;
  }

  void render(std::string& out) const override;

private:
  std::vector<double> bounds_;
  factory make_;
  mutable std::mutex mtx_;
  std::map<std::vector<std::string>, std::unique_ptr<Metric>, detail::label_values_less>
    children_;
};

// -- registry ------------------------------------------------------------------

/// Owns every metric of a server by name and renders them for /metrics.
///
/// The add_* functions return the metric registered under `name`, creating it
/// on first call; calling again with the same definition (type, help, labels,
/// bounds) returns the same object, so an actor restarted by its supervisor
/// can re-register. A different definition under a taken name, or a name
/// whose samples would clash with another family's (a histogram `x` owns
/// `x_bucket`, `x_sum`, `x_count`), throws std::invalid_argument, as do
/// invalid metric or label names. Thread-safe; references stay valid for the
/// registry's lifetime.
class registry {
public:
  /// The Content-Type of render()'s output.
  static constexpr std::string_view content_type = "text/plain; version=0.0.4; charset=utf-8";

  counter& add_counter(const std::string& name, const std::string& help,
                       const label_set& constant_labels = {});

  gauge& add_gauge(const std::string& name, const std::string& help,
                   const label_set& constant_labels = {});

  histogram& add_histogram(const std::string& name, const std::string& help,
                           std::vector<double> upper_bounds,
                           const label_set& constant_labels = {});

  family<counter>& add_counter_family(const std::string& name, const std::string& help,
                                      std::vector<std::string> label_names,
                                      const label_set& constant_labels = {});

  family<gauge>& add_gauge_family(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names,
                                  const label_set& constant_labels = {});

  family<histogram>& add_histogram_family(const std::string& name, const std::string& help,
                                          std::vector<std::string> label_names,
                                          std::vector<double> upper_bounds,
                                          const label_set& constant_labels = {});

  /// The text exposition format 0.0.4: families sorted by name, each with a
  /// HELP line (unless the help is empty) and a TYPE line, children sorted by
  /// label values. Any thread; does not block observations.
  std::string render() const;

  /// Appends the same text to `out`.
  void render_to(std::string& out) const;

private:
  template <class Metric>
  family<Metric>& add_family(const std::string& name, const std::string& help, metric_type type,
                             std::vector<std::string> label_names, const label_set& constant,
                             std::vector<double> bounds);

  mutable std::mutex mtx_;
  std::map<std::string, std::unique_ptr<family_base>> families_;
  /// Every sample name and family name in use, for clash checks.
  std::set<std::string> taken_;
};

// -- text format helpers (public for tests and other exporters) -----------------

/// A sample value as the text format writes it: shortest round-trip decimal,
/// "+Inf", "-Inf" or "NaN".
std::string format_value(double value);

/// Escapes a label value: backslash, double quote and newline.
std::string escape_label_value(std::string_view value);

/// Escapes HELP text: backslash and newline.
std::string escape_help(std::string_view help);

/// Whether `name` matches [a-zA-Z_:][a-zA-Z0-9_:]*.
bool valid_metric_name(std::string_view name);

/// Whether `name` matches [a-zA-Z_][a-zA-Z0-9_]* and does not start with "__".
bool valid_label_name(std::string_view name);

// -- template definitions ------------------------------------------------------

template <class Metric>
void family<Metric>::render(std::string& out) const {
  if (!help_.empty()) {
    out += "# HELP ";
    out += name_;
    out += ' ';
    out += escape_help(help_);
    out += '\n';
  }
  out += "# TYPE ";
  out += name_;
  out += ' ';
  out += to_string(type_);
  out += '\n';
  std::lock_guard<std::mutex> guard(mtx_);
  for (const auto& [values, metric] : children_)
    detail::render_samples(out, name_, detail::render_labels(constant_labels_, label_names_, values),
                           *metric);
}

} // namespace metronome::prometheus
