#include "tools/metronome/engine_config.hpp"

#include <algorithm>
#include <thread>

#include "caf/io/middleman.hpp"

#include "config/config_error.hpp"
#include "config/config_schema.hpp"
#include "model/fault_injection.hpp"
#include "tools/metronome/command.hpp"
#include "model/tokenizer/chat_template.hpp"
#include "sim/settings.hpp"

namespace metronome::cli {

actor_config::actor_config(const workers_section* workers) {
  register_message_types(*this);
  // Actors do little work each; the executor and io threads have their own.
  set("scheduler.max-threads", std::max(2u, std::thread::hardware_concurrency() / 2));
  if (workers == nullptr)
    return;
  load<caf::io::middleman>();
  // Off by default in CAF: without them a stopped peer is never noticed.
  set("middleman.heartbeat-interval",
      caf::timespan(std::chrono::milliseconds(workers->heartbeat_ms)));
  set("middleman.connection-timeout",
      caf::timespan(std::chrono::milliseconds(workers->timeout_ms)));
}

engine_options engine_options_from(const server_config& c, const std::filesystem::path& model_dir) {
  engine_options o;
  o.model_dir = model_dir;
  o.device = c.model.device.to_string();
  // Data parallel: the replicas' devices (validate() has made the two keys
  // agree); none for one replica.
  o.devices = c.model.devices;
  if (o.devices.empty() && c.model.data_parallel > 1)
    o.devices.assign(size_t(c.model.data_parallel), o.device);
  o.workers_only = c.model.data_parallel == 0;
  o.tensor_parallel = c.model.tensor_parallel;
  o.tensor_parallel_devices = c.model.tensor_parallel_devices;
  o.tensor_parallel_collective = c.model.tensor_parallel_collective;
  o.served_model_name = c.model.served_model_name;
  if (is_chat_template_name(c.model.chat_template))
    o.chat_template = c.model.chat_template;
  else if (!c.model.chat_template.empty())
    o.chat_template_file = c.model.chat_template;
  auto s = sim::settings_from_config(c); // engine limits, batching, predictor, router, drift
  o.limits = s.scheduler.limits;
  o.policy = sim::policy_from_config(c.engine.policy);
  o.request_timeout = std::chrono::milliseconds(int64_t(c.server.request_timeout_s * 1000));
  o.stats_interval = std::chrono::milliseconds(int64_t(c.logging.stats_interval_s * 1000));
  o.step_trace = c.logging.step_trace;
  o.restarts.max_restarts = c.supervisor.executor.max_restarts;
  o.restarts.restart_window
    = std::chrono::seconds(int64_t(c.supervisor.executor.restart_window_s));
  o.gpu_memory_fraction = c.engine.gpu_memory_fraction;
  o.cuda_graphs = c.engine.cuda_graphs;
  o.prefix_caching = s.scheduler.prefix_caching;
  o.kv = s.scheduler.kv;
  o.kv_bucket_min_tokens = s.scheduler.kv_bucket_min_tokens;
  o.kv_buckets_per_size = s.scheduler.kv_buckets_per_size;
  o.groups = s.scheduler.groups;
  o.kv_cache_dtype = c.engine.kv_cache_dtype;
  o.kv_overflow.max_rematerializations = c.engine.kv_overflow.max_rematerializations;
  o.kv_overflow.window = std::chrono::duration_cast<sched_time>(
    std::chrono::duration<double>(c.engine.kv_overflow.window_s));
  o.kv_overflow.cooldown = std::chrono::duration_cast<sched_time>(
    std::chrono::duration<double>(c.engine.kv_overflow.cooldown_s));
  o.quantize = c.model.quantize;
  o.faults = fault_injection::parse(c.engine.fault_injection).value_or(fault_injection{});
  o.predictor = s.predictor;
  o.ladb = s.ladb;
  o.srpt = s.srpt;
  o.drift = s.drift;
  o.workers.listen = c.workers.listen;
  o.workers.max_workers = c.workers.max_workers;
  o.workers.heartbeat = std::chrono::milliseconds(c.workers.heartbeat_ms);
  o.workers.timeout = std::chrono::milliseconds(c.workers.timeout_ms);
  return o;
}

server_config load_command_config(const std::string& config_file,
                                  std::vector<config_override> flags,
                                  const std::vector<std::string>& sets) {
  for (const auto& s : sets) {
    auto eq = s.find('=');
    if (eq == std::string::npos)
      throw command_error("--set: expected key.path=value, got '" + s + "'", 2);
    flags.push_back({s.substr(0, eq), s.substr(eq + 1), "--set"});
  }
  try {
    return load_config(config_file.empty() ? std::nullopt
                                           : std::optional<std::filesystem::path>(config_file),
                       flags);
  } catch (const config_error& e) {
    throw command_error(e.what(), 2);
  }
}

void add_config_flags(CLI::App* cmd, std::shared_ptr<std::vector<config_override>> flags,
                      const std::function<bool(std::string_view key)>& skip) {
  for (const auto& f : config_flags()) {
    if (skip && skip(f.key_path))
      continue;
    const config_key* schema = find_config_key(f.key_path);
    auto key = std::string(f.key_path);
    auto flag = std::string(f.flag);
    auto* opt = cmd->add_option_function<std::string>(
      flag, [flags, key, flag](const std::string& v) { flags->push_back({key, v, flag}); },
      std::string(f.help) + " (" + key + ")");
    if (schema != nullptr)
      opt->type_name(schema->metavar)->default_str(default_text(*schema));
  }
}

} // namespace metronome::cli
