#include "sched/admission_policy.hpp"

#include "sched/ladb_policy.hpp"
#include "sched/scheduler.hpp"

namespace metronome {

std::vector<sched_request*> fcfs_policy::admission_order(std::span<sched_request* const> waiting,
                                                         int32_t, sched_time) {
  // The waiting list is in arrival order, preempted requests first.
  return {waiting.begin(), waiting.end()};
}

std::unique_ptr<admission_policy> make_admission_policy(std::string_view name) {
  if (name == "fcfs")
    return std::make_unique<fcfs_policy>();
  // Latency-aware policies (sched/ladb_policy.hpp), with default settings
  // and a predictor of their own.
  static const policy_context defaults;
  return make_admission_policy(name, defaults);
}

} // namespace metronome
