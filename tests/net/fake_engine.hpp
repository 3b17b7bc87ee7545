#pragma once
// A stand-in for the engine in the net tests: a frontend actor that answers
// generate_request with deterministic events chosen by the prompt, so the
// edge can be tested without a model. Like the real engine, each request is
// served by its own actor that monitors the client's sink and counts a
// cancellation when the sink dies first.
//
// Scripts (the completion prompt, or the last chat message's content):
//   "echo <words...>"  one delta per word ("w1 ", "w2 ", ...), done "stop"
//   "count N [MS]"     N deltas "tI ", MS ms apart (default 0), done "length"
//   "hang"             one delta "x", then nothing until the sink dies
//   "hang-silent"      nothing at all until the sink dies
//   "error C"          generation_error with request_errc C before any delta
//   "late-error"       delta "partial", then generation_error engine_failure
//   "vanish"           delta "v", then the request actor dies without a final
//                      event (an engine bug the edge must survive)
//   "empty"            done "stop" without deltas
//   "params"           one delta: the parsed request as JSON (see .cpp)
//   anything else      echoes the text in one delta, done "stop"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "caf/all.hpp"

#include "actors/engine.hpp"
#include "actors/messages.hpp"

namespace metronome::test {

/// What the fake engine saw. Thread-safe.
struct fake_stats {
  std::atomic<int> requests{0};
  std::atomic<int> finished{0};
  /// Sinks that died before their request finished.
  std::atomic<int> cancelled{0};
  /// Fake request actors alive.
  std::atomic<int> live{0};
  std::mutex mtx;
  std::vector<generate_request> seen;

  generate_request last() {
    std::lock_guard<std::mutex> guard{mtx};
    return seen.empty() ? generate_request{} : seen.back();
  }
};

/// The batch size every first token reports.
inline constexpr int32_t fake_batch_size = 3;

/// Spawns the fake frontend.
frontend_actor spawn_fake_frontend(caf::actor_system& sys, std::shared_ptr<fake_stats> stats);

/// An engine whose frontend is the fake one; status ready, model "fake-model",
/// max_model_len 128, kv_cache_strategy "paged"; the real engine_metrics.
engine make_fake_engine(caf::actor_system& sys, std::shared_ptr<fake_stats> stats);

} // namespace metronome::test
