// metronome: serve, generate, tokenize, make-model, replay, ...
// Each subcommand lives in its own cmd_*.cpp and registers itself.

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <vector>

#include <spdlog/spdlog.h>

#include "metrics/log_event.hpp"
#include "model/model_error.hpp"
#include "tools/metronome/command.hpp"
#include "tools/metronome/help_formatter.hpp"

namespace metronome::cli {

namespace {

std::vector<std::pair<int, setup_fn>>& registry() {
  static std::vector<std::pair<int, setup_fn>> commands;
  return commands;
}

} // namespace

int register_command(int order, setup_fn setup) {
  registry().emplace_back(order, setup);
  return 0;
}

} // namespace metronome::cli

int main(int argc, char** argv) {
  using namespace metronome;
  CLI::App app{"Metronome: LLM serving with predictable latency", "metronome"};
  app.set_version_flag("--version", std::string(METRONOME_VERSION));
  app.require_subcommand(1);
  // Inherited by the subcommands (set before they are added): every option
  // shows its type and its default (the bound variable's value, captured
  // when the option is added).
  app.formatter(std::make_shared<cli::help_formatter>());
  app.option_defaults()->always_capture_default();
  auto& commands = cli::registry();
  std::sort(commands.begin(), commands.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [_, setup] : commands)
    setup(app);
  // Logs go to stderr, leaving stdout to each command's output; `serve`
  // sets its configured level and format (logging.*).
  configure_logging(log_format::text, spdlog::level::info);
  // CLI11 would take a misspelt subcommand for a stray argument and say
  // only that a subcommand is required.
  if (argc > 1) {
    if (auto problem = cli::unknown_subcommand(app, argv[1]); !problem.empty()) {
      std::fprintf(stderr, "error: %s\nRun with --help for more information.\n",
                   problem.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const cli::command_error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.code();
  } catch (const model_error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
