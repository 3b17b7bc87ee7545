#pragma once
// The step trace: one CSV line per engine step, what the scheduler planned
// (the step's shape, its predicted time) beside what the engine measured
// (wall time on the step clock, device time). `serve` writes it live
// (logging.step_trace) and `replay` writes the same columns for its
// simulated steps, so the two can be set side by side step by step, and
// tools/fit_cost_model.py --trace fits the cost model to a live run.
//
// Columns: t_s (seconds since the trace opened, at the step's end), step,
// decode_seqs, decode_kv_tokens, prefill_seqs, prefill_tokens,
// prefill_attention_pairs, predicted_ms, prior_ms, wall_ms, device_ms.

#include <cstdint>
#include <filesystem>
#include <fstream>

#include "sched/scheduler.hpp"

namespace metronome {

class step_trace {
public:
  /// Creates (truncates) `path` and writes the header. Throws
  /// std::runtime_error naming the path when it cannot be written.
  explicit step_trace(const std::filesystem::path& path);
  ~step_trace();

  step_trace(const step_trace&) = delete;
  step_trace& operator=(const step_trace&) = delete;

  /// Appends one step that ended `t_s` seconds after the trace opened.
  /// Buffered: lines reach the file every few hundred steps and at
  /// destruction. One thread (the scheduler's, or the replay loop).
  void write(double t_s, const step_record& r);

  int64_t lines() const {
    return lines_;
  }

private:
  std::ofstream out_;
  int64_t lines_ = 0;
};

} // namespace metronome
