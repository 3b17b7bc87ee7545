// metronome worker: a replica of the model in its own process (or on
// another host) that attaches to a front end (`metronome serve
// --worker-listen HOST:PORT`) through CAF's middleman (docs/scale-out.md).
//
// It runs the same engine as serve (its own scheduler, executor and KV
// cache, supervised as serve's are) without the network edge, and offers
// its scheduler to the front end: the front end's router places requests
// on it, its scheduler streams their tokens back to the front end's
// request actors. It joins once its model is loaded, and again whenever it
// loses the front end (its connection closed, or no heartbeat came for
// twice workers.timeout_ms): a front end that restarts gets its workers
// back. A refusal (another release, another model, a shorter context, no
// free slot) is final: it exits 2 with the front end's reason.
//
// Signals: SIGTERM or SIGINT stops it (exit 0). The front end sees its
// connection close: requests it held re-run elsewhere when none of their
// tokens had arrived, else fail. A lost device exits 75, as serve does.

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <signal.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "caf/io/middleman.hpp"

#include "actors/engine.hpp"
#include "actors/worker_agent.hpp"
#include "config/config_error.hpp"
#include "config/config_loader.hpp"
#include "config/config_scalar.hpp"
#include "config/config_schema.hpp"
#include "metrics/log_event.hpp"
#include "tools/metronome/command.hpp"
#include "tools/metronome/default_model.hpp"
#include "tools/metronome/engine_config.hpp"

namespace metronome::cli {

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr int device_lost_exit_code = 75;
constexpr int refused_exit_code = 2;

std::atomic<bool> device_lost{false};

struct worker_args {
  std::string config_file;
  std::vector<std::string> sets;
  std::shared_ptr<std::vector<config_override>> flags =
    std::make_shared<std::vector<config_override>>();
};

/// HOSTNAME:PID.
std::string default_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0)
    std::snprintf(host, sizeof(host), "worker");
  return std::string(host) + ":" + std::to_string(::getpid());
}

/// Waits up to `d` for SIGINT or SIGTERM; its number, or 0.
int wait_signal(const sigset_t& signals, std::chrono::milliseconds d) {
  const timespec t{time_t(d.count() / 1000), long(d.count() % 1000) * 1'000'000};
  const int sig = sigtimedwait(&signals, nullptr, &t);
  return sig > 0 ? sig : 0;
}

int64_t clock_ns(caf::actor_system& sys) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           sys.clock().now().time_since_epoch())
    .count();
}

/// How a stay with the front end ended.
enum class detached { signal, lost, refused };

/// Connects to the front end (retrying until it answers or a signal
/// comes), joins, and stays attached until the connection is lost, the
/// heartbeats stop, or a signal comes.
detached attach_once(caf::actor_system& sys, const engine& eng, const worker_agent_actor& agent,
                     const std::shared_ptr<std::atomic<int64_t>>& last_ping,
                     const host_port& front, const workers_section& w, const std::string& name,
                     const sigset_t& signals, int& sig) {
  const auto where = front.host + ":" + std::to_string(front.port);
  auto backoff = 250ms;
  std::optional<worker_registry_actor> registry;
  bool warned = false;
  while (!registry) {
    auto r = sys.middleman().remote_actor<worker_registry_actor>(front.host, front.port);
    if (r) {
      registry = *r;
      break;
    }
    if (r.error() == caf::sec::incompatible_application_ids) {
      // CAF's handshake compares middleman.app-identifiers, which carry
      // wire_version: the front end is another release.
      spdlog::critical("the front end at {} speaks another wire version than this worker's "
                       "(metronome-wire-{}): run the same Metronome release on both",
                       where, wire_version);
      return detached::refused;
    }
    if (!warned)
      spdlog::warn("cannot reach the front end at {} ({}); retrying every {} s at most", where,
                   sys.render(r.error()), 5);
    warned = true;
    if ((sig = wait_signal(signals, backoff)) != 0)
      return detached::signal;
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, 5s);
  }
  caf::scoped_actor self{sys};
  const auto& st = *eng.status;
  {
    worker_join j;
    j.version = wire_version;
    j.name = name;
    j.model_fingerprint = st.model_fingerprint;
    j.model_name = st.model_name;
    j.max_model_len = st.max_model_len;
    j.device = st.device;
    j.kv_pages = st.kv_total_pages;
    j.page_size = st.page_size;
    // With several replicas here, the front end's router hands its
    // admissions to this process's router, which places them on ours (it
    // takes admit_msg and cancel_atom, all a front end sends).
    j.scheduler = eng.router ? caf::actor_cast<caf::actor>(eng.router)
                             : caf::actor_cast<caf::actor>(eng.scheduler);
    j.agent = caf::actor_cast<caf::actor>(agent);
    j.now_ns = clock_ns(sys);
    std::optional<detached> outcome;
    self->request(*registry, std::chrono::milliseconds(w.timeout_ms), std::move(j))
      .receive(
        [&](worker_welcome& welcome) {
          last_ping->store(clock_ns(sys));
          spdlog::info("attached to the front end at {} as replica {}", where, welcome.replica);
          std::printf("Metronome worker %s attached to %s as replica %d\n", name.c_str(),
                      where.c_str(), int(welcome.replica));
          std::fflush(stdout);
        },
        [&](caf::error& e) {
          if (e.category() == caf::atom("worker")) {
            spdlog::critical("the front end at {} refused this worker: {}", where,
                             sys.render(e));
            outcome = detached::refused;
          } else {
            spdlog::warn("joining the front end at {} failed ({}); trying again", where,
                         sys.render(e));
            outcome = detached::lost;
          }
        });
    if (outcome)
      return *outcome;
    self->monitor(*registry);
    const auto silence = std::chrono::milliseconds(w.timeout_ms) * 2;
    for (;;) {
      bool down = false;
      self->receive([&](caf::down_msg& dm) {
        down = true;
        spdlog::warn("lost the front end at {} ({}); reconnecting", where, sys.render(dm.reason));
      },
                    caf::after(std::chrono::milliseconds(200)) >> [] {});
      if (down)
        return detached::lost;
      if ((sig = wait_signal(signals, 0ms)) != 0) {
        self->demonitor(registry->address());
        return detached::signal;
      }
      if (clock_ns(sys) - last_ping->load() > silence.count() * 1'000'000) {
        // Dropped by the front end (it found us silent), or it hangs:
        // connect again (a closed connection is made anew) and re-join.
        spdlog::warn("the front end at {} sent no heartbeat for {} ms; joining again", where,
                     silence.count());
        self->demonitor(registry->address());
        return detached::lost;
      }
    }
  }
}

void run(worker_args& a) {
  server_config cfg = load_command_config(a.config_file, *a.flags, a.sets);
  if (cfg.workers.connect.empty())
    throw command_error("worker: give the front end's address with --connect HOST:PORT "
                        "(workers.connect; the front end's workers.listen)",
                        2);
  if (!cfg.workers.listen.empty())
    throw command_error("worker: workers.listen is the front end's key (serve "
                        "--worker-listen); a worker connects with --connect",
                        2);
  const auto front = *parse_host_port(cfg.workers.connect); // the schema checked it
  configure_logging(cfg.logging.format == log_format_kind::json ? log_format::json
                                                                : log_format::text,
                    spdlog::level::from_str(std::string(to_string(cfg.logging.level))));
  fs::path model_dir = cfg.model.path;
  if (model_dir.empty())
    model_dir = default_model_dir();
  const std::string name = cfg.workers.name.empty() ? default_name() : cfg.workers.name;

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  actor_config acfg(&cfg.workers);
  caf::actor_system sys{acfg};
  auto options = engine_options_from(cfg, model_dir);
  options.stats_interval = std::chrono::milliseconds(0);
  options.on_device_lost = [](const std::string& reason) {
    spdlog::critical("device lost ({}): exiting with {}", reason, device_lost_exit_code);
    device_lost.store(true);
    ::kill(::getpid(), SIGTERM);
  };
  engine eng = spawn_engine(sys, std::move(options));
  struct stop_engine {
    const engine& e;
    ~stop_engine() {
      e.shutdown();
    }
  } stop{eng};
  int sig = 0;
  while (!eng.status->ready && !eng.status->degraded)
    if ((sig = wait_signal(signals, 50ms)) != 0)
      return;
  if (eng.status->degraded)
    throw command_error("the worker's engine could not start: " + eng.status->reason());
  std::printf("Metronome %s worker %s ready: %s (%s), joining %s\n", METRONOME_VERSION,
              name.c_str(), eng.status->model_name.c_str(), eng.status->device.c_str(),
              cfg.workers.connect.c_str());
  std::fflush(stdout);
  auto last_ping = std::make_shared<std::atomic<int64_t>>(0);
  auto agent = spawn_worker_agent(sys, eng.status, last_ping);
  for (;;) {
    auto how = attach_once(sys, eng, agent, last_ping, front, cfg.workers, name, signals, sig);
    if (how == detached::signal)
      break;
    if (how == detached::refused) {
      caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
      spdlog::default_logger()->flush();
      throw command_error("the front end at " + cfg.workers.connect + " refused this worker "
                            "(the reason is logged above)",
                          refused_exit_code);
    }
  }
  if (device_lost.load()) {
    spdlog::default_logger()->flush();
    std::fflush(stdout);
    std::_Exit(device_lost_exit_code);
  }
  spdlog::info("signal {} ({}): stopping", sig, strsignal(sig));
  caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
}

void setup(CLI::App& app) {
  auto a = std::make_shared<worker_args>();
  auto* cmd = app.add_subcommand(
    "worker", "Run a replica of the model that attaches to a front end (serve --worker-listen)");
  cmd->add_option("--config", a->config_file, "YAML configuration file")
    ->type_name("PATH")
    ->check(CLI::ExistingFile.description(""));
  cmd->add_option("--set", a->sets, "Override any key: --set engine.max_batch_size=32")
    ->type_name("KEY=VALUE");
  cmd->add_option_function<std::string>(
       "--connect", [a](const std::string& v) { a->flags->push_back({"workers.connect", v, "--connect"}); },
       "The front end's workers.listen address, HOST:PORT (workers.connect)")
    ->type_name("ADDRESS");
  cmd->add_option_function<std::string>(
       "--name", [a](const std::string& v) { a->flags->push_back({"workers.name", v, "--name"}); },
       "Name in the front end's logs and /metrics (workers.name; unset: HOSTNAME:PID)")
    ->type_name("NAME");
  // The front end's keys are not a worker's.
  add_config_flags(cmd, a->flags, [](std::string_view key) {
    return key.starts_with("server.") || key == "workers.listen";
  });
  cmd->callback([a] { run(*a); });
}

const int registered = register_command(15, &setup);

} // namespace

} // namespace metronome::cli
