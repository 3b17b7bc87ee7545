#pragma once
// Token-aware grouping: a running or preempted request's group is the band
// of output tokens it has generated so far (with bounds 32 and 128: 0-32,
// 33-128, 129+). Plain C++, no actors; it reads only the request's output.
//
// Design note (docs/scheduling.md, "The seeds' other mechanisms"). The
// original system grouped requests by generated tokens to batch them
// statically. Under iteration-level batching a group means something else:
// it is what a request has shown of its length, a measurement where a
// prediction (the predictor's rank correlation with the truth is about 0.01
// on the Azure trace) is noise. The scheduler (sched/scheduler.hpp) uses it,
// when bounds are set, in the three places where requests compete:
//  - admission: the policy's order is stably sorted by group, so requests
//    that generated little (new arrivals are group 0) go before preempted
//    ones that have shown themselves long (skip-join MLFQ, as FastServe);
//  - preemption when KV pages run out: the running request of the highest
//    group goes first (the most recently admitted among equals), instead of
//    the most recently admitted;
//  - decodes when the step's token budget cannot serve every running
//    request: lower groups decode first (prompt chunks keep their place).
// With no bounds (the default) every request is group 0 and the scheduler
// behaves as without groups.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace metronome {

/// Decisions the grouping changed, each counted once
/// (metronome:scheduling_events_total{kind="group_admission"|
/// "group_preemption"|"group_decode"}). Scheduler thread only.
struct token_group_stats {
  /// Requests admitted ahead of a request of a higher group that the
  /// admission policy had put before them.
  int64_t admissions = 0;
  /// Preemptions whose victim differs from the one the scheduler picks
  /// without groups (the most recently admitted).
  int64_t preemptions = 0;
  /// Decodes left out of a step for lack of budget while a decode of a
  /// lower group admitted after them ran in it.
  int64_t decodes = 0;
};

/// The bands of generated tokens. Cheap to copy.
class token_groups {
public:
  /// The largest bound accepted (tokens generated).
  static constexpr int32_t max_bound = 1 << 20;
  /// The most bounds (groups = bounds + 1).
  static constexpr size_t max_bounds = 8;

  /// No grouping: every request is group 0.
  token_groups() = default;

  /// Groups with these upper bounds (inclusive) of all groups but the last.
  /// Throws std::invalid_argument unless the bounds strictly increase
  /// within [1, max_bound] and there are at most max_bounds of them.
  explicit token_groups(std::vector<int32_t> bounds);

  /// Whether grouping is on (any bound).
  bool enabled() const {
    return !bounds_.empty();
  }

  /// The group of a request that generated `generated` tokens: the number
  /// of bounds below it (0 for 0..bounds[0], 1 up to bounds[1], ...).
  int32_t group_of(int32_t generated) const;

  /// Groups (bounds + 1; 1 when off).
  int32_t count() const {
    return int32_t(bounds_.size()) + 1;
  }

  const std::vector<int32_t>& bounds() const {
    return bounds_;
  }

  /// "32,128"; "" when off (the configuration's spelling).
  std::string to_string() const;

  /// Why `bounds` is not a valid set of bounds, or "" if it is.
  static std::string problem(std::span<const int32_t> bounds);

  bool operator==(const token_groups&) const = default;

private:
  std::vector<int32_t> bounds_;
};

} // namespace metronome
