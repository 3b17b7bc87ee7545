#pragma once
// The remaining-steps predictor of the latency-aware policies: how many
// decode steps (output tokens) a request will run, estimated from what a live
// server knows when the request arrives. Plain C++, no actors; time is passed
// in. One owner: the scheduler actor's thread, or the replay loop.
//
// Design note. It starts with the original system's rule (prompt_tokens x
// 0.8 + 5, capped by max_tokens) and, once `warmup_steps` requests have
// finished, switches to a model learned online from finished requests: ridge
// regression of log(1 + steps) on log prompt length (and its square), log
// max_tokens, the share of non-alphanumeric characters and a one-hot request
// class, with exponential forgetting so it follows slow drift. Regressing the
// logarithm predicts the geometric mean, close to the median of the skewed
// length distributions real traces have, which is what minimises the mean
// absolute error. The model is refitted every `update_interval`. The true
// output length is never a feature: it only arrives as feedback when a
// request finishes. Each refit measures the model's own mean relative error
// on the recent history: the drift supervisor compares fresh errors with that
// baseline. recalibrate() forgets everything but the recent history, for
// when the supervisor says the world changed.

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "sched/admission_policy.hpp"

namespace metronome {

/// What the predictor may look at: known when the request arrives.
struct request_features {
  int32_t prompt_tokens = 0;
  /// The request's cap on output tokens (max_tokens, capped by the context).
  int32_t max_tokens = 0;
  /// Share of non-alphanumeric, non-space characters in the prompt text.
  float non_alnum_share = 0;
  /// Class or route of the request ("" if none).
  std::string request_class;

  /// The features of a queued request.
  static request_features of(const sched_request& r);
};

/// Settings (config sections `predictor`; see config/server_config.hpp).
struct predictor_options {
  /// Cold start: steps = prompt_tokens x slope + intercept.
  double cold_start_slope = 0.8;
  double cold_start_intercept = 5.0;
  /// Finished requests observed before the learned model replaces the rule.
  int32_t warmup_steps = 100;
  /// How often the learned model is refitted.
  sched_time update_interval = std::chrono::seconds(1);
  /// max_decode_steps = prediction x this.
  double max_steps_factor = 1.2;
  /// Recent observations kept for recalibration and the error baseline.
  int32_t history = 4096;
  /// Observations after which an old one weighs half in the fit.
  double half_life = 4000;
  /// Ridge penalty of the fit (on standardised features).
  double ridge = 1.0;
};

/// A prediction compared with the truth, for accuracy figures and drift.
struct prediction_outcome {
  double predicted = 0;
  int32_t actual = 0;
  /// The predictor's own expected mean relative error when it predicted
  /// (its calibration baseline); negative while it ran the cold-start rule.
  double expected_error = -1;
  /// When the request finished.
  sched_time finished{0};
};

/// Accuracy over a set of outcomes.
struct prediction_accuracy {
  int64_t samples = 0;
  /// Mean |predicted - actual|, in steps.
  double mae = 0;
  /// Mean |predicted - actual| / actual.
  double mean_relative_error = 0;
  /// Spearman rank correlation of predicted and actual (ties averaged).
  double spearman = 0;
};

/// Computes accuracy figures of `outcomes`.
prediction_accuracy measure_accuracy(const std::vector<prediction_outcome>& outcomes);

/// The mean relative error of one prediction: |predicted - actual| / actual
/// (actual counted as at least 1).
double relative_error(double predicted, int32_t actual);

class predictor {
public:
  explicit predictor(predictor_options options = {});

  // -- predicting ----------------------------------------------------------------

  /// Predicted decode steps of a request, in [1, max_tokens].
  double predict(const request_features& f) const;

  /// True once the learned model replaced the cold-start rule.
  bool learned() const {
    return fitted_;
  }

  /// The mean relative error the current model had on its recent history at
  /// the last refit; negative while the cold-start rule is in use.
  double expected_error() const {
    return fitted_ ? expected_error_ : -1.0;
  }

  const predictor_options& options() const {
    return options_;
  }

  // -- feedback ------------------------------------------------------------------

  /// A request finished after `actual_steps` decode steps. `predicted` is
  /// what was predicted for it (nullopt when no prediction was made, e.g. it
  /// ran under fcfs); `expected_error` the baseline at that time. Refits when
  /// update_interval has passed.
  void observe(const request_features& f, int32_t actual_steps, std::optional<double> predicted,
               double expected_error, sched_time now);

  /// Forgets all learning except the observations of the last `window` and
  /// refits from those alone (at least warmup_steps of them, else reverts to
  /// the cold-start rule). Called when the drift supervisor orders it.
  void recalibrate(sched_time now, sched_time window);

  /// Outcomes (with a prediction) since the last call, oldest first: the
  /// drift supervisor's input.
  std::vector<prediction_outcome> drain_outcomes();

  // -- figures -------------------------------------------------------------------

  int64_t observations() const {
    return observations_;
  }
  int64_t refits() const {
    return refits_;
  }
  int64_t recalibrations() const {
    return recalibrations_;
  }

  /// Accuracy over the recent outcomes (at most `history` of them).
  prediction_accuracy recent_accuracy() const;

private:
  static constexpr int num_classes = 8;
  static constexpr int dims = 5 + num_classes;
  using vec = std::array<double, dims>;

  struct observation {
    request_features features;
    int32_t actual = 0;
    sched_time finished{0};
  };

  vec encode(const request_features& f) const;
  int class_index(const std::string& name) const;
  void accumulate(const vec& x, double y, double weight);
  void refit(sched_time now);
  double cold_start(const request_features& f) const;
  double learned_prediction(const request_features& f) const;

  predictor_options options_;
  // Sufficient statistics of the weighted least squares, decayed per
  // observation.
  std::array<double, dims * dims> xtx_{};
  vec xty_{};
  double decay_ = 1.0;
  vec coef_{};
  bool fitted_ = false;
  double expected_error_ = 0;
  sched_time last_fit_{0};
  int64_t observations_ = 0;
  int64_t learned_from_ = 0;
  int64_t refits_ = 0;
  int64_t recalibrations_ = 0;
  mutable std::unordered_map<std::string, int> classes_;
  std::deque<observation> history_;
  std::deque<prediction_outcome> recent_;
  std::vector<prediction_outcome> undrained_;
};

} // namespace metronome
