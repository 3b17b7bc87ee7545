#include "sched/predictor.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "sched/scheduler.hpp"

namespace metronome {

// -- features and accuracy --------------------------------------------------------

request_features request_features::of(const sched_request& r) {
  request_features f;
  f.prompt_tokens = int32_t(r.prompt.size());
  f.max_tokens = r.max_output > 0 ? r.max_output : r.params.max_tokens;
  f.non_alnum_share = r.non_alnum_share;
  f.request_class = r.request_class;
  return f;
}

double relative_error(double predicted, int32_t actual) {
  const double a = std::max(actual, 1);
  return std::abs(predicted - a) / a;
}

namespace {

/// Ranks (1-based, ties get their mean rank).
std::vector<double> ranks(const std::vector<double>& xs) {
  std::vector<size_t> idx(xs.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return xs[a] < xs[b]; });
  std::vector<double> out(xs.size());
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && xs[idx[j + 1]] == xs[idx[i]])
      ++j;
    const double r = (double(i) + double(j)) / 2.0 + 1.0;
    for (size_t k = i; k <= j; ++k)
      out[idx[k]] = r;
    i = j + 1;
  }
  return out;
}

double pearson(const std::vector<double>& a, const std::vector<double>& b) {
  const double n = double(a.size());
  if (n < 2)
    return 0;
  const double ma = std::accumulate(a.begin(), a.end(), 0.0) / n;
  const double mb = std::accumulate(b.begin(), b.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0.0;
}

} // namespace

prediction_accuracy measure_accuracy(const std::vector<prediction_outcome>& outcomes) {
  prediction_accuracy acc;
  acc.samples = int64_t(outcomes.size());
  if (outcomes.empty())
    return acc;
  std::vector<double> p, a;
  p.reserve(outcomes.size());
  a.reserve(outcomes.size());
  for (const auto& o : outcomes) {
    acc.mae += std::abs(o.predicted - o.actual);
    acc.mean_relative_error += relative_error(o.predicted, o.actual);
    p.push_back(o.predicted);
    a.push_back(o.actual);
  }
  acc.mae /= double(outcomes.size());
  acc.mean_relative_error /= double(outcomes.size());
  acc.spearman = pearson(ranks(p), ranks(a));
  return acc;
}

// -- predictor --------------------------------------------------------------------

predictor::predictor(predictor_options options) : options_(options) {
  decay_ = options_.half_life > 0 ? std::exp2(-1.0 / options_.half_life) : 1.0;
}

int predictor::class_index(const std::string& name) const {
  if (name.empty())
    return -1;
  if (auto i = classes_.find(name); i != classes_.end())
    return i->second;
  // The first classes seen get their own slot; later ones share by hash.
  const int index = int(classes_.size()) < num_classes
                      ? int(classes_.size())
                      : int(std::hash<std::string>{}(name) % num_classes);
  classes_.emplace(name, index);
  return index;
}

predictor::vec predictor::encode(const request_features& f) const {
  vec x{};
  const double lp = std::log1p(double(std::max(f.prompt_tokens, 0))) / 10.0;
  x[0] = 1.0;
  x[1] = lp;
  x[2] = lp * lp;
  x[3] = std::log1p(double(std::max(f.max_tokens, 0))) / 10.0;
  x[4] = f.non_alnum_share;
  if (int c = class_index(f.request_class); c >= 0)
    x[5 + c] = 1.0;
  return x;
}

double predictor::cold_start(const request_features& f) const {
  return options_.cold_start_slope * f.prompt_tokens + options_.cold_start_intercept;
}

double predictor::learned_prediction(const request_features& f) const {
  const auto x = encode(f);
  double y = 0;
  for (int i = 0; i < dims; ++i)
    y += coef_[i] * x[i];
  return std::expm1(std::clamp(y, 0.0, 20.0));
}

double predictor::predict(const request_features& f) const {
  double p = fitted_ ? learned_prediction(f) : cold_start(f);
  const double cap = f.max_tokens > 0 ? double(f.max_tokens) : 1e9;
  return std::clamp(p, 1.0, std::max(1.0, cap));
}

void predictor::accumulate(const vec& x, double y, double weight) {
  for (int i = 0; i < dims; ++i) {
    if (x[i] == 0)
      continue;
    for (int j = 0; j < dims; ++j)
      xtx_[i * dims + j] += weight * x[i] * x[j];
    xty_[i] += weight * x[i] * y;
  }
}

void predictor::observe(const request_features& f, int32_t actual_steps,
                        std::optional<double> predicted, double expected_error, sched_time now) {
  ++observations_;
  ++learned_from_;
  // Decay the old statistics, then add this one with weight 1.
  for (auto& v : xtx_)
    v *= decay_;
  for (auto& v : xty_)
    v *= decay_;
  accumulate(encode(f), std::log1p(double(std::max(actual_steps, 0))), 1.0);
  history_.push_back({f, actual_steps, now});
  while (int32_t(history_.size()) > options_.history)
    history_.pop_front();
  if (predicted) {
    prediction_outcome o{*predicted, actual_steps, expected_error, now};
    recent_.push_back(o);
    while (int32_t(recent_.size()) > options_.history)
      recent_.pop_front();
    undrained_.push_back(o);
    // Nobody drains (no supervisor): keep the backlog bounded.
    if (int32_t(undrained_.size()) > 4 * options_.history)
      undrained_.erase(undrained_.begin(), undrained_.begin() + options_.history);
  }
  if (learned_from_ >= options_.warmup_steps
      && (!fitted_ || now - last_fit_ >= options_.update_interval))
    refit(now);
}

void predictor::refit(sched_time now) {
  // Solve (X'WX + ridge I) c = X'Wy by Gaussian elimination with pivoting;
  // the intercept is not penalised.
  std::array<double, dims*(dims + 1)> m{};
  for (int i = 0; i < dims; ++i) {
    for (int j = 0; j < dims; ++j)
      m[i * (dims + 1) + j] = xtx_[i * dims + j];
    m[i * (dims + 1) + dims] = xty_[i];
    if (i > 0)
      m[i * (dims + 1) + i] += options_.ridge;
  }
  m[0] += 1e-9;
  for (int col = 0; col < dims; ++col) {
    int pivot = col;
    for (int r = col + 1; r < dims; ++r)
      if (std::abs(m[r * (dims + 1) + col]) > std::abs(m[pivot * (dims + 1) + col]))
        pivot = r;
    if (std::abs(m[pivot * (dims + 1) + col]) < 1e-12)
      return; // singular (no data yet): keep the old model
    if (pivot != col)
      for (int k = 0; k <= dims; ++k)
        std::swap(m[col * (dims + 1) + k], m[pivot * (dims + 1) + k]);
    for (int r = 0; r < dims; ++r) {
      if (r == col)
        continue;
      const double factor = m[r * (dims + 1) + col] / m[col * (dims + 1) + col];
      if (factor == 0)
        continue;
      for (int k = col; k <= dims; ++k)
        m[r * (dims + 1) + k] -= factor * m[col * (dims + 1) + k];
    }
  }
  for (int i = 0; i < dims; ++i)
    coef_[i] = m[i * (dims + 1) + dims] / m[i * (dims + 1) + i];
  fitted_ = true;
  last_fit_ = now;
  ++refits_;
  // The baseline for drift: this model's error on the recent history.
  double sum = 0;
  for (const auto& h : history_)
    sum += relative_error(predict(h.features), h.actual);
  expected_error_ = history_.empty() ? 0.0 : sum / double(history_.size());
}

void predictor::recalibrate(sched_time now, sched_time window) {
  ++recalibrations_;
  xtx_.fill(0);
  xty_.fill(0);
  while (!history_.empty() && history_.front().finished < now - window)
    history_.pop_front();
  for (const auto& h : history_)
    accumulate(encode(h.features), std::log1p(double(std::max(h.actual, 0))), 1.0);
  learned_from_ = int64_t(history_.size());
  recent_.clear();
  undrained_.clear();
  fitted_ = false;
  if (learned_from_ >= options_.warmup_steps)
    refit(now);
}

std::vector<prediction_outcome> predictor::drain_outcomes() {
  std::vector<prediction_outcome> out;
  out.swap(undrained_);
  return out;
}

prediction_accuracy predictor::recent_accuracy() const {
  return measure_accuracy({recent_.begin(), recent_.end()});
}

} // namespace metronome
