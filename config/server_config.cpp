#include "config/server_config.hpp"

#include <algorithm>
#include <charconv>

#include "config/config_error.hpp"

namespace metronome {

// -- value types -----------------------------------------------------------------

std::optional<device_spec> device_spec::parse(std::string_view text) {
  if (text == "cpu")
    return device_spec{};
  constexpr std::string_view prefix = "cuda:";
  if (!text.starts_with(prefix))
    return std::nullopt;
  auto digits = text.substr(prefix.size());
  // Decimal digits only: no sign, no spaces, no leading zeros beyond "0".
  if (digits.empty() || digits.size() > 2 || (digits.size() > 1 && digits[0] == '0'))
    return std::nullopt;
  for (char c : digits)
    if (c < '0' || c > '9')
      return std::nullopt;
  int32_t index = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (ec != std::errc{} || end != digits.data() + digits.size() || index > 63)
    return std::nullopt;
  return device_spec{device_kind::cuda, index};
}

std::string device_spec::to_string() const {
  if (kind == device_kind::cpu)
    return "cpu";
  return "cuda:" + std::to_string(index);
}

bool is_chat_template_name(std::string_view name) {
  return std::find(chat_template_names.begin(), chat_template_names.end(), name)
         != chat_template_names.end();
}

std::string_view to_string(scheduling_policy x) {
  switch (x) {
    case scheduling_policy::fcfs: return "fcfs";
    case scheduling_policy::ladb: return "ladb";
    case scheduling_policy::srpt: return "srpt";
    case scheduling_policy::ladb_literal: return "ladb-literal";
  }
  return "?";
}

std::string_view to_string(kv_strategy_kind x) {
  switch (x) {
    case kv_strategy_kind::paged: return "paged";
    case kv_strategy_kind::bucketed: return "bucketed";
  }
  return "?";
}

std::string_view to_string(queue_strategy_kind x) {
  switch (x) {
    case queue_strategy_kind::priority_by_remaining_steps: return "priority_by_remaining_steps";
    case queue_strategy_kind::fcfs: return "fcfs";
  }
  return "?";
}

std::string_view to_string(fallback_policy_kind x) {
  switch (x) {
    case fallback_policy_kind::immediate_dispatch: return "immediate_dispatch";
    case fallback_policy_kind::wait: return "wait";
  }
  return "?";
}

std::string_view to_string(log_level x) {
  switch (x) {
    case log_level::trace: return "trace";
    case log_level::debug: return "debug";
    case log_level::info: return "info";
    case log_level::warn: return "warn";
    case log_level::error: return "error";
  }
  return "?";
}

std::string_view to_string(log_format_kind x) {
  switch (x) {
    case log_format_kind::text: return "text";
    case log_format_kind::json: return "json";
  }
  return "?";
}

std::optional<scheduling_policy> parse_scheduling_policy(std::string_view text) {
  for (auto x : {scheduling_policy::fcfs, scheduling_policy::ladb, scheduling_policy::srpt,
                 scheduling_policy::ladb_literal})
    if (to_string(x) == text)
      return x;
  return std::nullopt;
}

// -- cross-field validation ----------------------------------------------------------

namespace {

[[noreturn]] void fail(const std::string& source, std::string key, std::string problem) {
  throw config_error(source, std::move(key), std::move(problem));
}

std::string num(int64_t x) {
  return std::to_string(x);
}

} // namespace

void validate(const server_config& cfg, const std::string& source) {
  const auto& m = cfg.model;
  if (!m.devices.empty()) {
    if (m.data_parallel != 1 && m.data_parallel != int32_t(m.devices.size()))
      fail(source, "model.data_parallel",
           "is " + num(m.data_parallel) + " but model.devices lists " + num(int64_t(m.devices.size()))
             + " devices, one replica each: set one of the two, or make them agree");
    if (m.device != device_spec{} && m.devices.front() != m.device.to_string())
      fail(source, "model.device",
           "is " + m.device.to_string() + " but model.devices starts with " + m.devices.front()
             + ": set only model.devices, or make model.device its first entry");
    const bool cpu = m.devices.front() == "cpu";
    for (const auto& d : m.devices)
      if ((d == "cpu") != cpu)
        fail(source, "model.devices",
             "replicas run all on the CPU or all on CUDA devices, got both " + m.devices.front()
               + " and " + d);
  }
  // (With data parallel, on the CPU or with 4-bit weights, tensor
  // parallelism is refused where the engine starts: spawn_engine.)
  if (!m.tensor_parallel_devices.empty()
      && int32_t(m.tensor_parallel_devices.size()) != m.tensor_parallel)
    fail(source, "model.tensor_parallel_devices",
         "lists " + num(int64_t(m.tensor_parallel_devices.size()))
           + " devices but model.tensor_parallel is " + num(m.tensor_parallel)
           + ": one device per rank");
  const auto& w = cfg.workers;
  if (m.data_parallel == 0 && w.listen.empty())
    fail(source, "model.data_parallel",
         "is 0 (no replica in this process) but workers.listen is empty: nothing would serve; "
         "set workers.listen (--worker-listen) for workers to attach, or 1 or more replicas");
  if (m.data_parallel == 0 && !m.devices.empty())
    fail(source, "model.data_parallel",
         "is 0 (no replica in this process) but model.devices lists devices");
  if (w.timeout_ms <= w.heartbeat_ms)
    fail(source, "workers.timeout_ms",
         "is " + num(w.timeout_ms) + " but workers.heartbeat_ms is " + num(w.heartbeat_ms)
           + ": a worker must get at least one heartbeat within the timeout");
  const auto& e = cfg.engine;
  // Every running sequence decodes one token per step, so a budget smaller
  // than the batch cap could never run a full batch (vLLM checks the same).
  if (e.max_num_batched_tokens < e.max_batch_size)
    fail(source, "engine.max_num_batched_tokens",
         "must be at least engine.max_batch_size (" + num(e.max_batch_size)
           + ") so every running sequence can decode in one step, got "
           + num(e.max_num_batched_tokens));
  if (e.prefill_chunk_tokens > e.max_num_batched_tokens)
    fail(source, "engine.prefill_chunk_tokens",
         "must not exceed engine.max_num_batched_tokens (" + num(e.max_num_batched_tokens)
           + "), got " + num(e.prefill_chunk_tokens));
  if (e.kv_cache_tokens != 0 && e.kv_cache_tokens < e.page_size)
    fail(source, "engine.kv_cache_tokens",
         "must be 0 (auto) or at least one page (engine.page_size = " + num(e.page_size)
           + "), got " + num(e.kv_cache_tokens));
  if (e.kv_cache_tokens != 0 && cfg.model.max_model_len != 0
      && e.kv_cache_tokens < cfg.model.max_model_len)
    fail(source, "engine.kv_cache_tokens",
         "cannot hold one sequence of model.max_model_len (" + num(cfg.model.max_model_len)
           + ") tokens, got " + num(e.kv_cache_tokens));
  const auto& b = cfg.batching;
  if (b.max_batch_size > e.max_batch_size)
    fail(source, "batching.max_batch_size",
         "must not exceed engine.max_batch_size (" + num(e.max_batch_size)
           + "), the cap on running sequences, got " + num(b.max_batch_size));
  if (e.policy == scheduling_policy::ladb_literal) {
    if (b.min_batch_size > b.max_batch_size)
      fail(source, "batching.min_batch_size",
           "must not exceed batching.max_batch_size (" + num(b.max_batch_size) + "), got "
             + num(b.min_batch_size));
    if (b.min_hold_ms > b.max_hold_ms)
      fail(source, "batching.min_hold_ms",
           "must not exceed batching.max_hold_ms (" + num(b.max_hold_ms) + "), got "
             + num(b.min_hold_ms));
  } else {
    // Keys that only the cohort-holding LADB reads: set under another policy
    // they would be accepted and ignored, so they are refused instead (and
    // their bounds, which nothing reads, are not checked).
    const batching_section d;
    auto literal_only = [&](const char* key, bool changed) {
      if (changed)
        fail(source, key,
             std::string("only the cohort-holding LADB (engine.policy: ladb-literal) holds "
                         "requests; engine.policy ")
               + std::string(to_string(e.policy))
               + " never does (docs/scheduling.md): remove the key or select ladb-literal");
    };
    literal_only("batching.min_batch_size", b.min_batch_size != d.min_batch_size);
    literal_only("batching.min_hold_ms", b.min_hold_ms != d.min_hold_ms);
    literal_only("batching.max_hold_ms", b.max_hold_ms != d.max_hold_ms);
  }
  const auto& tls = cfg.server.tls;
  if (tls.cert_file.empty() != tls.key_file.empty())
    fail(source, tls.cert_file.empty() ? "server.tls.cert_file" : "server.tls.key_file",
         "TLS needs both server.tls.cert_file and server.tls.key_file (or neither, for plain "
         "HTTP)");
  // A test setting must not reach a server others can use: fault injection
  // runs only on a loopback address.
  if (e.fault_injection != "none") {
    const auto& h = cfg.server.host;
    if (!(h.starts_with("127.") || h == "::1" || h == "localhost"))
      fail(source, "engine.fault_injection",
           "makes steps fail on purpose (tests and drills only) and needs server.host on "
           "loopback (127.0.0.1, ::1 or localhost), got server.host " + h);
  }
  if (!cfg.predictor.model_path.empty())
    fail(source, "predictor.model_path",
         "saved predictor state is not supported: the predictor starts from the cold-start rule "
         "(predictor.cold_start_*) and learns from completed requests; leave it empty");
}

} // namespace metronome
