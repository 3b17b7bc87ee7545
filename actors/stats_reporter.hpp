#pragma once
// The engine's stats line (docs/operations.md): every logging.stats_interval_s
// (10 s) while the engine has work, one info line with the interval's
// throughput (tokens computed and output tokens per second), the requests
// running and waiting, the KV cache's usage and the prefix cache's hit rate
// over the interval. Its figures come from engine_metrics and engine_status,
// the sources of /metrics, so the log and the metrics agree.
//
// "Has work": a request is running or waiting at the end of the interval, or
// some token was computed during it (a burst that ended inside the interval
// is still reported). An idle engine writes nothing.
//
// The arithmetic is stats_reporter, a plain class fed with samples and
// times; the actor (spawn_stats_reporter) samples on its actor clock, so
// CAF's test coordinator drives it without waiting.

#include <chrono>
#include <memory>
#include <optional>

#include "caf/all.hpp"

#include "actors/engine_metrics.hpp"
#include "actors/interfaces.hpp"
#include "metrics/log_event.hpp"

namespace metronome {

struct engine_status;

class stats_reporter {
public:
  using clock_time = std::chrono::nanoseconds;

  /// The stats line for the interval that ends with `s` taken at `now`, or
  /// nullopt when the engine had no work in it. The first sample only sets
  /// the baseline. Single-threaded (one owner).
  std::optional<log_event> sample(const engine_stats_sample& s, clock_time now);

private:
  std::optional<engine_stats_sample> last_;
  clock_time last_time_{0};
};

/// Spawns the actor that samples `metrics` and `status` every `interval`
/// (on its actor clock) and logs each stats_reporter line at info. It ends
/// with `scheduler` (the engine's), or by an exit message. Any thread.
stats_reporter_actor spawn_stats_reporter(caf::actor_system& sys, caf::actor_addr scheduler,
                                          std::shared_ptr<engine_metrics> metrics,
                                          std::shared_ptr<engine_status> status,
                                          std::chrono::milliseconds interval);

} // namespace metronome
