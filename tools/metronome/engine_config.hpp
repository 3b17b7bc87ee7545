#pragma once
// What `metronome serve` and `metronome worker` share: the actor system's
// configuration and the engine's options, both from one server_config.

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "caf/all.hpp"

#include "actors/engine.hpp"
#include "config/config_loader.hpp"
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

/// The configuration of serve and worker: defaults, then `config_file` (if
/// not empty), then `flags` and `sets` (key.path=value) in that order.
/// Throws command_error (exit 2) naming the file, key or --set at fault.
/// Main thread.
server_config load_command_config(const std::string& config_file,
                                  std::vector<config_override> flags,
                                  const std::vector<std::string>& sets);

/// Adds the shorthand flags of config_flags() to `cmd` (those `skip` does
/// not reject), each appending its override to `*flags`; type and default
/// come from the key's schema entry. Main thread, while commands are set up.
void add_config_flags(CLI::App* cmd, std::shared_ptr<std::vector<config_override>> flags,
                      const std::function<bool(std::string_view key)>& skip = {});

/// The engine's options from the configuration (model folder `model_dir`).
/// on_device_lost is left to the caller. Main thread.
engine_options engine_options_from(const server_config& c, const std::filesystem::path& model_dir);

} // namespace metronome::cli
