#pragma once
// The choice of which waiting requests to admit next: the one decision the
// scheduler leaves to a policy object, so policies can be compared on the
// same traces (sim/) and swapped at run time by a supervisor. Plain C++, no
// actors; time is passed in.

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace metronome {

/// Engine time: nanoseconds since the engine (or the replay) started.
using sched_time = std::chrono::nanoseconds;

/// The admission policies: first come first served, the latency-aware ladb
/// and srpt (sched/ladb_policy.hpp, sched/srpt_policy.hpp), and the original
/// system's literal forms of both. The engine, the scheduler, the drift
/// supervisor and the replay hold this; names are parsed only at the
/// configuration and command-line edges.
enum class policy_kind : uint8_t { fcfs, ladb, srpt, ladb_literal, srpt_literal };

/// "fcfs", "ladb", "srpt", "ladb-literal", "srpt-literal".
std::string_view to_string(policy_kind p);

/// Parses a policy's name; nullopt for any other text.
std::optional<policy_kind> parse_policy_kind(std::string_view name);

/// The names parse_policy_kind knows, for messages.
std::string_view policy_names();

struct sched_request;

/// What the scheduler sees at the start of a scheduling pass.
struct step_load {
  /// The step's token budget (max_num_batched_tokens).
  int32_t token_budget = 0;
  /// Running requests whose prompt is computed (they decode one token).
  int32_t decoding = 0;
  /// Running requests still computing their prompt (or recomputing it).
  int32_t prefilling = 0;
  int32_t waiting = 0;
  /// Predicted milliseconds of this step's decodes alone (the scheduler's
  /// step_time_estimator; a step with no decodes still reads the weights).
  double decode_ms = 0;
  /// Predicted milliseconds that the prompt work ready now would add to the
  /// step, within the token budget.
  double prefill_ms = 0;
  /// How long the longest-waiting request has waited (0 if none waits).
  sched_time oldest_wait{0};
};

/// Orders admission. Called on the scheduler's thread only.
class admission_policy {
public:
  virtual ~admission_policy() = default;

  /// "fcfs", "ladb", "srpt".
  virtual std::string_view name() const = 0;

  /// A request was queued.
  virtual void on_arrival(sched_request& r, sched_time now) = 0;

  /// The waiting requests to try admitting this step, best first (at most
  /// `free_slots` will be admitted). Requests left out are held back.
  virtual std::vector<sched_request*> admission_order(std::span<sched_request* const> waiting,
                                                      int32_t free_slots, sched_time now) = 0;

  /// The most prompt tokens this step may compute, chunks of running
  /// prompts and of newly admitted requests together (>= 1). Called once
  /// per scheduling pass; decodes are never limited. Default: the whole
  /// token budget (vLLM's behaviour).
  virtual int32_t prefill_budget(const step_load& load, sched_time) {
    return load.token_budget;
  }

  /// The longest this step may be predicted to take, in milliseconds, once
  /// it carries prompt work next to decodes (stall-free steps: the prompt
  /// chunks are cut to fit); nullopt for no limit but the token budget.
  /// Called once per scheduling pass, after prefill_budget. Default: none.
  virtual std::optional<double> step_time_limit_ms(const step_load&, sched_time) {
    return std::nullopt;
  }

  /// A request produced a token (for policies that track progress).
  virtual void on_token(sched_request&, sched_time) {}

  /// A request finished (any reason) after `steps` decode steps.
  virtual void on_finish(const sched_request&, sched_time) {}

  /// When the policy wants a scheduling pass although nothing else
  /// happened (the end of a hold window); nullopt for never.
  virtual std::optional<sched_time> next_deadline(sched_time) const {
    return std::nullopt;
  }
};

/// First come, first served: the baseline every serving engine ships.
class fcfs_policy final : public admission_policy {
public:
  std::string_view name() const override {
    return "fcfs";
  }

  void on_arrival(sched_request&, sched_time) override {
    // nop
  }

  std::vector<sched_request*> admission_order(std::span<sched_request* const> waiting,
                                              int32_t free_slots, sched_time now) override;
};

/// Builds policy `p`; latency-aware ones with default settings and a
/// predictor of their own.
std::unique_ptr<admission_policy> make_admission_policy(policy_kind p);

} // namespace metronome
