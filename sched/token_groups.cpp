#include "sched/token_groups.hpp"

#include <algorithm>
#include <stdexcept>

namespace metronome {

token_groups::token_groups(std::vector<int32_t> bounds) : bounds_(std::move(bounds)) {
  if (auto p = problem(bounds_); !p.empty())
    throw std::invalid_argument("token_groups: " + p);
}

int32_t token_groups::group_of(int32_t generated) const {
  // Bounds are inclusive upper ends: 32 is group 0, 33 group 1.
  return int32_t(std::lower_bound(bounds_.begin(), bounds_.end(), generated) - bounds_.begin());
}

std::string token_groups::to_string() const {
  std::string out;
  for (auto b : bounds_)
    out += (out.empty() ? "" : ",") + std::to_string(b);
  return out;
}

std::string token_groups::problem(std::span<const int32_t> bounds) {
  if (bounds.size() > max_bounds)
    return "at most " + std::to_string(max_bounds) + " bounds, got "
           + std::to_string(bounds.size());
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (bounds[i] < 1 || bounds[i] > max_bound)
      return "bound " + std::to_string(bounds[i]) + " is outside [1, " + std::to_string(max_bound)
             + "]";
    if (i > 0 && bounds[i] <= bounds[i - 1])
      return "bounds must increase, got " + std::to_string(bounds[i]) + " after "
             + std::to_string(bounds[i - 1]);
  }
  return {};
}

} // namespace metronome
