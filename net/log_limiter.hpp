#pragma once
// A warning that may repeat many times a second (accept failures while out
// of file descriptors, connections refused over the limit) is written at
// most once per period, with the number held back since the last one, so
// the log stays readable and cheap under the very load it reports.

#include <chrono>
#include <cstdint>
#include <optional>

namespace metronome::net {

class log_limiter {
public:
  using clock = std::chrono::steady_clock;

  explicit log_limiter(clock::duration period = std::chrono::seconds(1)) : period_(period) {}

  /// Called each time the event happens. Returns the number of events held
  /// back since the last one let through when this one may be logged now,
  /// nullopt when it must be held back. The caller's thread or strand only.
  std::optional<uint64_t> allow(clock::time_point now = clock::now()) {
    if (last_ && now - *last_ < period_) {
      ++held_back_;
      return std::nullopt;
    }
    last_ = now;
    auto held = held_back_;
    held_back_ = 0;
    return held;
  }

private:
  clock::duration period_;
  std::optional<clock::time_point> last_;
  uint64_t held_back_ = 0;
};

} // namespace metronome::net
