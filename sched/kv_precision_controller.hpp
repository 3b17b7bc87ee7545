#pragma once
// The overflow supervision of the fp8_e5m2 KV cache, as plain C++ (time
// injected): what to do when a sequence's keys or values overflowed the
// format. The kv_precision_supervisor actor (actors/kv_precision_supervisor.hpp)
// runs it for the live server; the scheduler (sched/scheduler.hpp) carries
// out its decisions.
//
// Design note. FP8 -> full-precision degradation is a supervision strategy,
// not a branch in the step: the runner only counts what overflowed, the
// scheduler only parks an overflowing sequence (its tokens held back) and
// reports it, and this controller decides. While the re-materialisations
// of the last `window` are fewer than max_rematerializations (the seeds' 3
// a minute), an overflowing sequence is re-materialised: its held tokens
// are dropped and it is preempted by recompute and re-admitted in full
// precision, so its KV is recomputed into full-precision pages and its
// output is what a full-precision run would have made from the tokens
// before the overflow. The overflow past the budget is kept (the sequence
// goes on with its saturated values, as E5M2 stores them) and starts a
// cool-down: every admission for `cooldown` gets full precision, then the
// configured element type again. An overflow during a cool-down (a
// sequence admitted before it) is kept and changes nothing. The window
// slides: a re-materialisation stops counting `window` after it was made.

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string_view>

#include "sched/admission_policy.hpp" // sched_time

namespace metronome {

/// Settings (config section `engine.kv_overflow`).
struct kv_overflow_options {
  /// Re-materialisations allowed within `window`; the next overflow starts
  /// a cool-down instead. 0: every overflow starts one.
  int32_t max_rematerializations = 3;
  /// The sliding window over which re-materialisations are counted.
  sched_time window = std::chrono::seconds(60);
  /// How long admissions get full precision after the budget is spent.
  sched_time cooldown = std::chrono::seconds(300);
};

/// What became of a sequence's KV precision, as a client sees it
/// (X-KV-Cache-Strategy's kv_overflow, docs/protocol.md): none (the
/// configured element type, nothing overflowed), saturated (it overflowed
/// past the budget and went on with saturated values), rematerialized (it
/// overflowed and was recomputed in full precision), cooldown (admitted in
/// full precision during a cool-down).
enum class kv_fallback : uint8_t { none, saturated, rematerialized, cooldown };

/// "", "saturated", "rematerialized", "cooldown".
constexpr std::string_view to_string(kv_fallback f) {
  switch (f) {
    case kv_fallback::none: return "";
    case kv_fallback::saturated: return "saturated";
    case kv_fallback::rematerialized: return "rematerialized";
    case kv_fallback::cooldown: return "cooldown";
  }
  return "?";
}

/// What to do with one overflowing sequence.
enum class kv_overflow_action : uint8_t {
  /// Drop its tokens since the overflow, recompute it in full precision.
  rematerialize,
  /// Release its held tokens and let it go on with saturated values.
  keep,
};

/// on_overflow's decision, with the figures it was made on.
struct kv_overflow_decision {
  kv_overflow_action action = kv_overflow_action::keep;
  /// This overflow started a cool-down (admissions in full precision until
  /// cooldown_until).
  bool cooldown_started = false;
  std::optional<sched_time> cooldown_until;
  /// A cool-down past its end ended before this decision (its timer had not
  /// fired yet): the caller reports that transition first.
  bool cooldown_ended = false;
  /// Re-materialisations in the window, this one included.
  int32_t in_window = 0;
};

/// The overflow supervision's logic. One owner (the supervisor actor; a
/// test), one thread.
class kv_precision_controller {
public:
  explicit kv_precision_controller(kv_overflow_options options);

  /// Sequence `seq` overflowed (reported at `now`): re-materialise it or
  /// keep it, and whether a cool-down starts. Call each sequence once per
  /// admission in the configured element type (the scheduler reports only
  /// its first overflow there).
  kv_overflow_decision on_overflow(uint64_t seq, sched_time now);

  /// Re-evaluates at `now` (a timer at next_check()): true when a cool-down
  /// ended (admissions return to the configured element type).
  bool on_tick(sched_time now);

  /// When the state changes without an overflow: the end of the cool-down;
  /// nullopt while none runs.
  std::optional<sched_time> next_check() const {
    return cooldown_until_;
  }

  bool cooling_down() const {
    return cooldown_until_.has_value();
  }

  /// Re-materialisations within the window ending at `now`.
  int32_t in_window(sched_time now);

  const kv_overflow_options& options() const {
    return options_;
  }

private:
  void prune(sched_time now);

  kv_overflow_options options_;
  /// When each re-materialisation in the window was made, oldest first.
  std::deque<sched_time> rematerializations_;
  std::optional<sched_time> cooldown_until_;
};

} // namespace metronome
