#include "sched/admission_policy.hpp"

#include "sched/ladb_policy.hpp"
#include "sched/scheduler.hpp"

namespace metronome {

std::vector<sched_request*> fcfs_policy::admission_order(std::span<sched_request* const> waiting,
                                                         int32_t, sched_time) {
  // The waiting list is in arrival order, preempted requests first.
  return {waiting.begin(), waiting.end()};
}

std::string_view to_string(policy_kind p) {
  switch (p) {
    case policy_kind::fcfs: return "fcfs";
    case policy_kind::ladb: return "ladb";
    case policy_kind::srpt: return "srpt";
    case policy_kind::ladb_literal: return "ladb-literal";
    case policy_kind::srpt_literal: return "srpt-literal";
  }
  return "?";
}

std::optional<policy_kind> parse_policy_kind(std::string_view name) {
  for (auto p : {policy_kind::fcfs, policy_kind::ladb, policy_kind::srpt,
                 policy_kind::ladb_literal, policy_kind::srpt_literal})
    if (name == to_string(p))
      return p;
  return std::nullopt;
}

std::string_view policy_names() {
  return "fcfs, ladb, srpt, ladb-literal, srpt-literal";
}

std::unique_ptr<admission_policy> make_admission_policy(policy_kind p) {
  if (p == policy_kind::fcfs)
    return std::make_unique<fcfs_policy>();
  // Latency-aware policies (sched/ladb_policy.hpp), with default settings
  // and a predictor of their own.
  static const policy_context defaults;
  return make_admission_policy(p, defaults);
}

} // namespace metronome
