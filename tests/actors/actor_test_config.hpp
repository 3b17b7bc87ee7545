#pragma once
// The CAF configuration of tests that run engine actors on real threads.

#include "caf/all.hpp"

#include "actors/messages.hpp"

namespace metronome::test {

struct actor_test_config : caf::actor_system_config {
  actor_test_config() {
    register_message_types(*this);
    set("scheduler.max-threads", 2);
  }
};

} // namespace metronome::test
