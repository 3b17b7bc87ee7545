#pragma once
// A worker's agent: the one actor of a `metronome worker` process that its
// front end watches (docs/scale-out.md). It answers the front end's
// heartbeat with the engine's health and load, and notes when the last
// heartbeat came, so that the worker can tell that its front end has
// stopped asking (it dropped the worker, or hangs) and join again.

#include <atomic>
#include <cstdint>
#include <memory>

#include "actors/interfaces.hpp"

namespace metronome {

struct engine_status;

/// Spawns the agent of the engine whose facts are `status` (not null). It
/// stores the engine clock of each heartbeat it answers in `last_ping_ns`
/// (not null; read by the worker's main thread). Any thread.
worker_agent_actor spawn_worker_agent(caf::actor_system& sys,
                                      std::shared_ptr<const engine_status> status,
                                      std::shared_ptr<std::atomic<int64_t>> last_ping_ns);

} // namespace metronome
