#pragma once
// What `metronome serve` and `metronome worker` share: the actor system's
// configuration and the engine's options, both from one server_config.

#include <filesystem>

#include "caf/all.hpp"

#include "actors/engine.hpp"
#include "config/server_config.hpp"

namespace metronome::cli {

/// The actor system of serve and worker: Metronome's message types, a few
/// scheduler threads, and with `workers` (not null) CAF's middleman, its
/// connection heartbeat every workers->heartbeat_ms and a peer silent for
/// workers->timeout_ms dropped (docs/scale-out.md). Main thread, before
/// the actor system is made.
struct actor_config : caf::actor_system_config {
  explicit actor_config(const workers_section* workers = nullptr);
};

/// The engine's options from the configuration (model folder `model_dir`).
/// on_device_lost is left to the caller. Main thread.
engine_options engine_options_from(const server_config& c, const std::filesystem::path& model_dir);

} // namespace metronome::cli
