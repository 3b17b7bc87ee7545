// metronome serve: the server. Configuration comes from defaults, then a
// YAML file (--config), then flags (--port, --model, ... and --set k=v), in
// that order. API keys also come from server.api_keys_file and the
// METRONOME_API_KEY environment variable (which keeps them out of `ps`).
//
// Signals: the first SIGTERM or SIGINT drains the server (http_server::
// drain(): no new connections or requests, running ones get
// server.drain_timeout_s to finish) and exits 0; a second one during the
// drain exits at once with 128 + the signal's number (143 for SIGTERM, 130
// for SIGINT), as a shell reports a process killed by it.
//
// A lost device (a sticky CUDA error, a step the device never ends: no
// executor restart can help) drains the server the same way and exits with
// device_lost_exit_code (75), so that its service manager starts a new
// process (docs/reliability.md, "Executor faults").

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <signal.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "actors/engine.hpp"
#include "config/config_error.hpp"
#include "config/config_loader.hpp"
#include "config/config_schema.hpp"
#include "metrics/log_event.hpp"
#include "net/access_control.hpp"
#include "net/http_server.hpp"
#include "sim/settings.hpp"
#include "tools/metronome/command.hpp"
#include "tools/metronome/default_model.hpp"
#include "tools/metronome/engine_config.hpp"

namespace metronome::cli {

namespace {

namespace fs = std::filesystem;

/// The exit status after a lost device: EX_TEMPFAIL, "try again".
constexpr int device_lost_exit_code = 75;

/// Set (from the engine supervisor's thread) when the device is lost.
std::atomic<bool> device_lost{false};

struct serve_args {
  std::string config_file;
  std::vector<std::string> sets;
  std::shared_ptr<std::vector<config_override>> flags =
    std::make_shared<std::vector<config_override>>();
  bool dump_config = false;
};

/// The environment variable holding one more API key.
constexpr const char* api_key_env = "METRONOME_API_KEY";

/// Throws std::runtime_error when the key file cannot be read.
net::server_options server_options_from(const server_config& c) {
  auto o = net::server_options_from(c.server);
  o.served_model_name = c.model.served_model_name;
  o.log_prompts = c.logging.log_prompts;
  if (!c.server.api_keys_file.empty())
    for (auto& key : net::read_api_keys_file(c.server.api_keys_file))
      o.api_keys.push_back(std::move(key));
  if (const char* key = std::getenv(api_key_env); key && *key)
    o.api_keys.emplace_back(key);
  return o;
}

/// The configuration as --dump-config prints it: API keys are secrets.
server_config redacted(server_config c) {
  for (auto& key : c.server.api_keys)
    key = "REDACTED";
  return c;
}

void run(serve_args& a) {
  server_config cfg = load_command_config(a.config_file, *a.flags, a.sets);
  if (a.dump_config) {
    std::printf("%s", to_yaml(redacted(cfg), true).c_str());
    return;
  }
  configure_logging(cfg.logging.format == log_format_kind::json ? log_format::json
                                                                : log_format::text,
                    spdlog::level::from_str(std::string(to_string(cfg.logging.level))));
  fs::path model_dir = cfg.model.path;
  if (model_dir.empty())
    model_dir = default_model_dir();

  // Signals are taken by sigwait below: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  actor_config acfg(cfg.workers.listen.empty() ? nullptr : &cfg.workers);
  caf::actor_system sys{acfg};
  auto options = engine_options_from(cfg, model_dir);
  options.on_device_lost = [](const std::string& reason) {
    spdlog::critical("device lost ({}): draining, then exiting with {} for the service manager "
                     "to start a new process",
                     reason, device_lost_exit_code);
    device_lost.store(true);
    ::kill(::getpid(), SIGTERM); // wakes the sigwait in run(): the drain
  };
  engine eng = spawn_engine(sys, std::move(options));
  std::optional<net::http_server> server;
  uint16_t port = 0;
  try {
    server.emplace(sys, eng, server_options_from(cfg));
    port = server->start();
  } catch (const std::exception& e) {
    eng.shutdown();
    throw command_error(e.what());
  }
  std::printf("Metronome %s serving %s (%s) on %s://%s:%u  (OpenAI API /v1, WebSocket /v1/ws, "
              "/health, /metrics)\n",
              METRONOME_VERSION, eng.status->model_name.c_str(), eng.status->device.c_str(),
              cfg.server.tls.cert_file.empty() ? "http" : "https", cfg.server.host.c_str(),
              unsigned(port));
  // What the model is, as its folder's metronome.json says (nothing when it
  // says nothing).
  if (!eng.status->model_description.empty())
    std::printf("  %s: %s\n", eng.status->model_name.c_str(),
                eng.status->model_description.c_str());
  // 4-bit weights, stored so or quantized at load (model.quantize), are said.
  if (eng.status->weights.starts_with("int4"))
    std::printf("  weights: %s\n", eng.status->weights.c_str());
  if (eng.workers)
    std::printf("  workers attach at %s (metronome worker --connect)\n",
                (cfg.workers.listen.substr(0, cfg.workers.listen.rfind(':') + 1)
                 + std::to_string(eng.worker_port))
                  .c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&signals, &sig);
  if (!device_lost.load())
    spdlog::info("signal {} ({}): draining; a second signal exits at once", sig, strsignal(sig));
  // A second signal must act while the drain blocks this thread.
  std::atomic<bool> drained{false};
  std::thread second_signal([&] {
    const timespec poll{0, 100'000'000};
    while (!drained.load()) {
      int again = sigtimedwait(&signals, nullptr, &poll);
      if (again > 0) {
        spdlog::warn("signal {} ({}) while draining: exiting now", again, strsignal(again));
        spdlog::default_logger()->flush();
        std::_Exit(128 + again);
      }
    }
  });
  struct stop_watching {
    std::atomic<bool>& drained;
    std::thread& watcher;
    ~stop_watching() {
      drained.store(true);
      watcher.join();
    }
  } guard{drained, second_signal};
  server->drain();
  eng.shutdown();
  if (device_lost.load()) {
    // Not through the destructors: the lost device's runner is kept, and
    // nothing may wait on it.
    spdlog::critical("exiting with {}: the device was lost", device_lost_exit_code);
    spdlog::default_logger()->flush();
    std::fflush(stdout);
    std::_Exit(device_lost_exit_code);
  }
}

void setup(CLI::App& app) {
  auto a = std::make_shared<serve_args>();
  auto* cmd = app.add_subcommand("serve", "Serve a model over HTTP (OpenAI API) and WebSocket");
  cmd->add_option("--config", a->config_file, "YAML configuration file")
    ->type_name("PATH")
    ->check(CLI::ExistingFile.description(""));
  cmd->add_option("--set", a->sets, "Override any key: --set engine.max_batch_size=32")
    ->type_name("KEY=VALUE");
  cmd->add_flag("--dump-config", a->dump_config, "Print the effective configuration and exit");
  // Each flag's type and default come from its key's schema entry, so the
  // help says what the parser accepts.
  add_config_flags(cmd, a->flags);
  cmd->callback([a] { run(*a); });
}

const int registered = register_command(10, &setup);

} // namespace

} // namespace metronome::cli
