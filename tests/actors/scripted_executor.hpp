#pragma once
// A stand-in executor for the deterministic actor tests: it takes the
// scheduler's step plans and answers one only when the test sends it
// `tick_atom` (with the token every chunk of that step samples), so the test
// decides when each engine step ends. Plain CAF; no threads of its own.

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "caf/all.hpp"

#include "actors/messages.hpp"

namespace metronome::test {

struct scripted_executor_state {
  /// Plans received and not yet answered, oldest first.
  std::deque<std::pair<caf::response_promise, step_plan>> pending;
  /// Every plan received.
  std::vector<step_plan> seen;
  /// The reasons of crash_atom messages received.
  std::vector<std::string> crashes;
};

inline caf::behavior scripted_executor(caf::stateful_actor<scripted_executor_state>* self) {
  return {
    [=](step_plan& plan) -> caf::result<step_output> {
      auto rp = self->make_response_promise();
      self->state.seen.push_back(plan);
      self->state.pending.emplace_back(rp, std::move(plan));
      return caf::delegated<step_output>{};
    },
    [=](tick_atom, int32_t token) {
      if (self->state.pending.empty())
        return;
      auto [rp, plan] = std::move(self->state.pending.front());
      self->state.pending.pop_front();
      step_output out;
      out.step = plan.step;
      out.num_seqs = int32_t(plan.chunks.size());
      for (const auto& c : plan.chunks)
        out.tokens.push_back({c.id, token, 0}); // every chunk samples here
      rp.deliver(std::move(out));
    },
    [=](crash_atom, std::string& why) { self->state.crashes.push_back(why); },
  };
}

} // namespace metronome::test
