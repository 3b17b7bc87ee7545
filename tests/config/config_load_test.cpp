// Loading metronome.yaml: defaults, the example file, value syntax and the
// to_yaml round trip.

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "config/config_loader.hpp"
#include "config/config_scalar.hpp"
#include "config/config_schema.hpp"
#include "tests/config/config_test_util.hpp"
#include "tests/test_env.hpp"

namespace metronome {
namespace {

std::filesystem::path source_dir() {
  return test::env("SOURCE_DIR");
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// -- defaults ----------------------------------------------------------------------

TEST(config_defaults, are_valid) {
  EXPECT_NO_THROW(validate(server_config{}, "defaults"));
}

TEST(config_defaults, match_the_documented_values) {
  // The values the issue and the original system's ladb_config.yaml fix.
  server_config c;
  EXPECT_EQ(c.server.host, "127.0.0.1");
  EXPECT_EQ(c.server.port, 8080);
  EXPECT_EQ(c.server.max_body_bytes, 1 << 20);
  EXPECT_EQ(c.model.device, device_spec{});
  EXPECT_EQ(c.batching.min_hold_ms, 50);
  EXPECT_EQ(c.batching.max_hold_ms, 120);
  EXPECT_DOUBLE_EQ(c.predictor.max_steps_factor, 1.2);
  EXPECT_DOUBLE_EQ(c.predictor.cold_start_slope, 0.8);
  EXPECT_DOUBLE_EQ(c.predictor.cold_start_intercept, 5.0);
  EXPECT_EQ(c.router.srpt_promote_after_ms, 150);
  EXPECT_DOUBLE_EQ(c.supervisor.drift.window_s, 300.0);
  EXPECT_DOUBLE_EQ(c.supervisor.drift.error_threshold, 0.3);
  EXPECT_DOUBLE_EQ(c.supervisor.drift.sustain_s, 300.0);
  EXPECT_DOUBLE_EQ(c.supervisor.drift.disable_s, 300.0);
}

TEST(config_defaults, empty_documents_keep_them) {
  EXPECT_EQ(load_config_string("", "empty.yaml"), server_config{});
  EXPECT_EQ(load_config_string("# only a comment\n", "c.yaml"), server_config{});
  EXPECT_EQ(load_config_string("engine:\n", "c.yaml"), server_config{});
}

// -- the example file and the docs -----------------------------------------------------

TEST(config_example, loads_and_equals_the_defaults) {
  auto path = source_dir() / "config/metronome.example.yaml";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  auto cfg = load_config_file(path);
  EXPECT_EQ(cfg, server_config{}) << "the example file documents a default that differs from "
                                     "server_config{}; effective config:\n"
                                  << to_yaml(cfg);
}

TEST(config_example, sets_every_key_explicitly) {
  auto root = YAML::LoadFile((source_dir() / "config/metronome.example.yaml").string());
  for (const auto& key : config_keys()) {
    // reset(), not operator=: assigning yaml-cpp nodes overwrites the target.
    YAML::Node node;
    node.reset(root);
    std::string_view rest = key.path;
    bool found = true;
    while (found) {
      auto dot = rest.find('.');
      auto part = std::string(rest.substr(0, dot));
      if (!node.IsMap() || !node[part]) {
        found = false;
        break;
      }
      YAML::Node child = node[part];
      node.reset(child);
      if (dot == std::string_view::npos)
        break;
      rest.remove_prefix(dot + 1);
    }
    EXPECT_TRUE(found) << key.path << " is missing from metronome.example.yaml";
  }
}

TEST(config_docs, describe_every_key) {
  auto doc = slurp(source_dir() / "docs/configuration.md");
  ASSERT_FALSE(doc.empty());
  for (const auto& key : config_keys())
    EXPECT_NE(doc.find("`" + key.path + "`"), std::string::npos)
      << key.path << " is not documented in docs/configuration.md";
  for (const auto& flag : config_flags())
    EXPECT_NE(doc.find("`" + std::string(flag.flag) + "`"), std::string::npos) << flag.flag;
}

TEST(config_schema, keys_are_unique_and_documented) {
  std::set<std::string> seen;
  for (const auto& key : config_keys()) {
    EXPECT_TRUE(seen.insert(key.path).second) << key.path;
    EXPECT_FALSE(key.doc.empty()) << key.path;
    EXPECT_FALSE(key.allowed.empty()) << key.path;
    EXPECT_EQ(find_config_key(key.path), &key);
  }
  EXPECT_EQ(find_config_key("engine"), nullptr);
  EXPECT_TRUE(is_config_section("supervisor.drift"));
  EXPECT_FALSE(is_config_section("engine.max_batch_size"));
}

// -- value syntax ----------------------------------------------------------------------

TEST(config_values, nested_sections_and_every_kind) {
  auto cfg = load_config_string(R"(
server:
  host: 0.0.0.0
  port: 9000
  max_body_bytes: 2MiB
  max_ws_message_bytes: 1500KB
model:
  path: /models/llama
  device: cuda:3
  chat_template: chatml
engine:
  cuda_graphs: off
  gpu_memory_fraction: 1
  kv_cache_dtype: fp8
  policy: srpt
supervisor:
  drift:
    window_s: 2.5
  executor:
    max_restarts: 0
logging:
  level: debug
)",
                                "t.yaml");
  EXPECT_EQ(cfg.server.host, "0.0.0.0");
  EXPECT_EQ(cfg.server.port, 9000);
  EXPECT_EQ(cfg.server.max_body_bytes, 2 * 1024 * 1024);
  EXPECT_EQ(cfg.server.max_ws_message_bytes, 1'500'000);
  EXPECT_EQ(cfg.model.path, "/models/llama");
  EXPECT_EQ(cfg.model.device, (device_spec{device_kind::cuda, 3}));
  EXPECT_EQ(cfg.model.chat_template, "chatml");
  EXPECT_FALSE(cfg.engine.cuda_graphs);
  EXPECT_EQ(cfg.engine.gpu_memory_fraction, 1.0);
  EXPECT_EQ(cfg.engine.kv_cache_dtype, kv_cache_dtype_kind::fp8);
  EXPECT_EQ(cfg.engine.policy, scheduling_policy::srpt);
  EXPECT_EQ(cfg.supervisor.drift.window_s, 2.5);
  EXPECT_EQ(cfg.supervisor.executor.max_restarts, 0);
  EXPECT_EQ(cfg.logging.level, log_level::debug);
  // Untouched keys keep their defaults.
  EXPECT_EQ(cfg.engine.max_batch_size, server_config{}.engine.max_batch_size);
}

TEST(config_values, byte_counts) {
  auto bytes = [](std::string_view text) {
    server_config c;
    apply_override(c, "server.max_body_bytes", text);
    return c.server.max_body_bytes;
  };
  EXPECT_EQ(bytes("4096"), 4096);
  EXPECT_EQ(bytes("4KiB"), 4096);
  EXPECT_EQ(bytes("1 MiB"), 1 << 20);
  EXPECT_EQ(bytes("1GiB"), 1 << 30);
  EXPECT_EQ(bytes("2MB"), 2'000'000);
  EXPECT_EQ(bytes("1024B"), 1024);
}

TEST(config_values, booleans_and_empty_strings) {
  auto cfg = load_config_string("engine:\n  cuda_graphs: no\nmodel:\n  path:\n  chat_template:\n",
                                "t.yaml");
  EXPECT_FALSE(cfg.engine.cuda_graphs);
  EXPECT_EQ(cfg.model.path, "");
  EXPECT_EQ(cfg.model.chat_template, "");
  EXPECT_TRUE(load_config_string("engine:\n  cuda_graphs: True\n", "t.yaml").engine.cuda_graphs);
}

TEST(config_values, kv_cache_dtypes) {
  EXPECT_EQ(server_config{}.engine.kv_cache_dtype, kv_cache_dtype_kind::bf16);
  EXPECT_EQ(load_config_string("engine:\n  kv_cache_dtype: fp8\n", "t.yaml").engine.kv_cache_dtype,
            kv_cache_dtype_kind::fp8);
  EXPECT_EQ(load_config_string("engine:\n  kv_cache_dtype: bf16\n", "t.yaml").engine.kv_cache_dtype,
            kv_cache_dtype_kind::bf16);
  // Parsed like the others; spawn_engine refuses it at start (not served yet).
  EXPECT_EQ(
    load_config_string("engine:\n  kv_cache_dtype: fp8_e5m2\n", "t.yaml").engine.kv_cache_dtype,
    kv_cache_dtype_kind::fp8_e5m2);
  // Other names are refused with the key named: config_error_test.
}

TEST(config_values, model_quantize) {
  EXPECT_EQ(server_config{}.model.quantize, weight_quantization::none);
  EXPECT_EQ(load_config_string("model:\n  quantize: int4\n", "t.yaml").model.quantize,
            weight_quantization::int4);
  EXPECT_EQ(load_config_string("model:\n  quantize: none\n", "t.yaml").model.quantize,
            weight_quantization::none);
  server_config cfg;
  apply_override(cfg, *flag_key_path("--quantize"), "int4", "--quantize");
  EXPECT_EQ(cfg.model.quantize, weight_quantization::int4);
  try {
    load_config_string("model:\n  quantize: int8\n", "t.yaml");
    ADD_FAILURE() << "model.quantize int8 was accepted";
  } catch (const config_error& e) {
    EXPECT_STREQ(e.what(), "t.yaml: model.quantize: expected one of none, int4, got \"int8\" "
                           "(line 2)");
  }
  try {
    apply_override(cfg, "model.quantize", "gptq", "--quantize");
    ADD_FAILURE() << "--quantize gptq was accepted";
  } catch (const config_error& e) {
    EXPECT_STREQ(e.what(), "--quantize: model.quantize: expected one of none, int4, got \"gptq\"");
  }
}

TEST(config_values, devices) {
  EXPECT_EQ(device_spec::parse("cpu"), device_spec{});
  EXPECT_EQ(device_spec::parse("cuda:0"), (device_spec{device_kind::cuda, 0}));
  EXPECT_EQ(device_spec::parse("cuda:63"), (device_spec{device_kind::cuda, 63}));
  for (auto bad : {"", "gpu", "cuda", "cuda:", "cuda:-1", "cuda:64", "cuda:01", "cuda:1x",
                   "CPU", " cpu", "cuda: 1", "cuda:+1"})
    EXPECT_EQ(device_spec::parse(bad), std::nullopt) << bad;
  EXPECT_EQ((device_spec{device_kind::cuda, 7}).to_string(), "cuda:7");
}

TEST(config_values, hosts) {
  for (auto good : {"127.0.0.1", "0.0.0.0", "::", "::1", "fe80::1", "localhost",
                    "my-host.example.com", "a1.b2"})
    EXPECT_TRUE(valid_host(good)) << good;
  for (auto bad : {"", "two words", "-lead", "trail-", "a..b", "host_name", "[::1]", "a:b:c:d:x",
                   "http://x"})
    EXPECT_FALSE(valid_host(bad)) << bad;
  EXPECT_FALSE(valid_host(std::string(64, 'a')));
  EXPECT_TRUE(valid_host(std::string(63, 'a')));
}

TEST(config_values, access_lists) {
  // A YAML sequence, a flow sequence, a comma-separated scalar (the command
  // line's form) and an empty value.
  auto cfg = load_config_string(R"(
server:
  api_keys:
    - sk-first
    - "sk-second"
  allowed_origins: ["https://chat.example.com", "http://localhost:3000"]
  allowed_hosts: llm.example.com,.internal
  metrics_without_key: true
  tls:
    cert_file: /c.pem
    key_file: /k.pem
)",
                                "access.yaml");
  EXPECT_EQ(cfg.server.api_keys, (std::vector<std::string>{"sk-first", "sk-second"}));
  EXPECT_EQ(cfg.server.allowed_origins,
            (std::vector<std::string>{"https://chat.example.com", "http://localhost:3000"}));
  EXPECT_EQ(cfg.server.allowed_hosts, (std::vector<std::string>{"llm.example.com", ".internal"}));
  EXPECT_TRUE(cfg.server.metrics_without_key);
  EXPECT_EQ(cfg.server.tls.cert_file, "/c.pem");
  EXPECT_TRUE(load_config_string("server:\n  api_keys:\n", "e.yaml").server.api_keys.empty());
  apply_override(cfg, "server.api_keys", "");
  EXPECT_TRUE(cfg.server.api_keys.empty());
  apply_override(cfg, "server.api_keys", "a,b");
  EXPECT_EQ(cfg.server.api_keys, (std::vector<std::string>{"a", "b"}));

  // Bad items name the file and the key.
  auto refused = [](const std::string& yaml, const std::string& key, const std::string& what) {
    auto e = test::catch_config_error([&] { load_config_string(yaml, "bad.yaml"); });
    EXPECT_EQ(e.source(), "bad.yaml") << yaml;
    EXPECT_EQ(e.key_path(), key) << yaml;
    EXPECT_NE(e.problem().find(what), std::string::npos) << e.what();
  };
  refused("server:\n  api_keys: [\"has space\"]\n", "server.api_keys", "\"has space\"");
  refused("server:\n  api_keys: [\"\"]\n", "server.api_keys", "API keys");
  refused("server:\n  api_keys:\n    - {a: 1}\n", "server.api_keys", "a mapping in the list");
  refused("server:\n  allowed_origins: [\"https://x.com/path\"]\n", "server.allowed_origins",
          "https://x.com/path");
  refused("server:\n  allowed_origins: [\"ftp://x.com\"]\n", "server.allowed_origins",
          "origins");
  refused("server:\n  allowed_hosts: [\"a b\"]\n", "server.allowed_hosts", "host names");
  refused("server:\n  tls:\n    cert_file: /c.pem\n", "server.tls.key_file", "both");
  refused("server:\n  tls:\n    key_fil: /k.pem\n", "server.tls.key_fil", "key_file");
  for (auto good : {"*", "http://localhost", "https://a.example.com:8443", "http://[::1]:80",
                    "http://127.0.0.1:8080"})
    EXPECT_NO_THROW(load_config_string(
      "server:\n  allowed_origins: [\"" + std::string(good) + "\"]\n", "o.yaml"))
      << good;
}

TEST(config_values, strict_scalars) {
  EXPECT_EQ(parse_integer("0"), 0);
  EXPECT_EQ(parse_integer("-7"), -7);
  EXPECT_EQ(parse_integer("+7"), 7);
  // Leading zeros: octal to YAML 1.1 readers, so refused, not read as decimal.
  for (auto bad : {"", "+", "0x10", "1e3", "1.0", " 1", "1 ", "1_000", "010", "080", "-07", "00"})
    EXPECT_EQ(parse_integer(bad), std::nullopt) << bad;
  EXPECT_EQ(parse_real("1e-3"), 0.001);
  EXPECT_EQ(parse_real(".5"), 0.5);
  for (auto bad : {"", "1,5", "0.5s", "--1"})
    EXPECT_EQ(parse_real(bad), std::nullopt) << bad;
  EXPECT_EQ(print_real(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(print_real(1e6), "1000000");
  EXPECT_EQ(print_real(1e-7), "1e-07");
  EXPECT_EQ(print_bytes(1025), "1025");
  EXPECT_EQ(print_bytes(3 << 20), "3MiB");
  EXPECT_EQ(parse_bytes("9223372036854775807GiB"), std::nullopt); // overflow
  EXPECT_EQ(yaml_quote("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\x01\"");
}

// -- to_yaml round trip ----------------------------------------------------------------

/// A valid value other than the default for every key, as command-line text.
const std::vector<std::pair<std::string, std::string>>& changed_values() {
  static const std::vector<std::pair<std::string, std::string>> values = {
    {"server.host", "::1"},
    {"server.port", "0"},
    {"server.max_body_bytes", "1025"},
    {"server.max_queued_requests", "7"},
    {"server.retry_after_s", "30"},
    {"server.request_timeout_s", "0.30000000000000004"},
    {"server.max_ws_message_bytes", "3MiB"},
    {"server.io_threads", "5"},
    {"server.max_concurrent_streams_per_connection", "3"},
    {"server.max_connections", "20000"},
    {"server.idle_timeout_s", "5.5"},
    {"server.header_timeout_s", "0.25"},
    {"server.write_timeout_s", "604800"},
    {"server.drain_timeout_s", "0"},
    {"server.api_keys", "sk-one,sk-\"two\"#"},
    {"server.api_keys_file", "/etc/metronome/keys"},
    {"server.metrics_without_key", "true"},
    {"server.chat_page", "false"},
    {"server.allowed_origins", "https://chat.example.com,http://[::1]:8080"},
    {"server.allowed_hosts", ".example.com,llm.internal,*"},
    {"server.tls.cert_file", "/etc/metronome/cert.pem"},
    {"server.tls.key_file", "/etc/metronome/key.pem"},
    {"model.path", "/models/\xc3\xbc/Llama 3 # not a comment"},
    {"model.device", "cuda:12"},
    {"model.devices", "cuda:12,cuda:12,cuda:3"},
    {"model.data_parallel", "3"},
    {"model.tensor_parallel", "2"},
    {"model.tensor_parallel_devices", "cuda:12,cuda:3"},
    {"model.tensor_parallel_collective", "peer"},
    {"model.served_model_name", "a \"quoted\": name\\ with\ttab and \x01 control"},
    {"model.chat_template", "mistral"},
    {"model.max_model_len", "4096"},
    {"model.quantize", "int4"},
    {"engine.max_batch_size", "256"},
    {"engine.max_num_batched_tokens", "8192"},
    {"engine.page_size", "32"},
    {"engine.kv_cache_tokens", "65536"},
    {"engine.gpu_memory_fraction", "0.55"},
    {"engine.cuda_graphs", "false"},
    {"engine.prefix_caching", "false"},
    {"engine.kv_strategy", "bucketed"},
    {"engine.kv_bucket_min_tokens", "2048"},
    {"engine.kv_buckets_per_size", "8"},
    {"engine.kv_cache_dtype", "fp8"},
    {"engine.kv_overflow.max_rematerializations", "0"},
    {"engine.kv_overflow.window_s", "0.5"},
    {"engine.kv_overflow.cooldown_s", "604800"},
    {"engine.policy", "ladb-literal"},
    {"engine.step_timeout_ms", "1234"},
    {"engine.prefill_chunk_tokens", "1000"},
    {"engine.fault_injection", "hang_after:12"},
    {"batching.max_batch_size", "64"},
    {"batching.min_batch_size", "2"},
    {"batching.target_latency_ms", "250"},
    {"batching.step_time_factor", "1.5"},
    {"batching.long_step_share", "0"},
    {"batching.variance_tolerance", "1e-3"},
    {"batching.min_hold_ms", "0"},
    {"batching.max_hold_ms", "60000"},
    {"batching.token_groups", "32,128"},
    {"predictor.model_path", "null"},
    {"predictor.warmup_steps", "0"},
    {"predictor.update_interval_ms", "5"},
    {"predictor.max_steps_factor", "1"},
    {"predictor.cold_start_slope", "0"},
    {"predictor.cold_start_intercept", "1000000"},
    {"router.queue_strategy", "fcfs"},
    {"router.timeout_ms", "1"},
    {"router.fallback_policy", "wait"},
    {"router.srpt_promote_after_ms", "0"},
    {"supervisor.drift.enabled", "false"},
    {"supervisor.drift.window_s", "1.5"},
    {"supervisor.drift.error_threshold", "10"},
    {"supervisor.drift.sustain_s", "0"},
    {"supervisor.drift.disable_s", "0.001"},
    {"supervisor.drift.min_samples", "1"},
    {"supervisor.executor.max_restarts", "1000"},
    {"supervisor.executor.restart_window_s", "604800"},
    {"logging.level", "trace"},
    {"logging.format", "json"},
    {"logging.stats_interval_s", "2.5"},
    {"logging.log_prompts", "true"},
    {"logging.step_trace", "/tmp/steps.csv"},
    {"workers.listen", "127.0.0.1:7400"},
    {"workers.connect", "[::1]:7401"},
    {"workers.name", "gpu-a"},
    {"workers.max_workers", "4"},
    {"workers.heartbeat_ms", "250"},
    {"workers.timeout_ms", "5000"},
  };
  return values;
}

TEST(config_round_trip, defaults) {
  for (bool docs : {false, true})
    EXPECT_EQ(load_config_string(to_yaml(server_config{}, docs), "dump.yaml"), server_config{});
}

TEST(config_round_trip, every_key_changed) {
  server_config cfg;
  std::set<std::string> covered;
  for (const auto& [path, value] : changed_values()) {
    const auto* key = find_config_key(path);
    ASSERT_NE(key, nullptr) << path;
    auto before = key->get(cfg);
    apply_override(cfg, path, value);
    EXPECT_NE(key->get(cfg), before) << path << " was not changed by " << value;
    covered.insert(path);
  }
  for (const auto& key : config_keys())
    EXPECT_TRUE(covered.count(key.path)) << key.path << " has no changed value in this test";
  EXPECT_EQ(cfg.predictor.model_path, "null"); // override text is not YAML
  EXPECT_THROW(validate(cfg, "test"), config_error) << "saved predictor state is refused";
  cfg.predictor.model_path.clear();
  ASSERT_NO_THROW(validate(cfg, "test"));
  EXPECT_EQ(cfg.model.served_model_name, "a \"quoted\": name\\ with\ttab and \x01 control");
  for (bool docs : {false, true}) {
    auto text = to_yaml(cfg, docs);
    server_config back;
    ASSERT_NO_THROW(back = load_config_string(text, "dump.yaml")) << text;
    EXPECT_EQ(back, cfg) << text;
    EXPECT_EQ(to_yaml(back, docs), text);
  }
}

TEST(config_round_trip, prints_readable_values) {
  server_config cfg;
  apply_override(cfg, "server.max_ws_message_bytes", "3145728");
  apply_override(cfg, "engine.gpu_memory_fraction", "0.1");
  auto text = to_yaml(cfg);
  EXPECT_NE(text.find("  max_ws_message_bytes: 3MiB\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  gpu_memory_fraction: 0.1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("supervisor:\n  drift:\n    enabled: true\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  executor:\n    max_restarts: 5\n"), std::string::npos) << text;
}

TEST(config_seeds, the_original_sections_alone_select_the_latency_aware_policy) {
  // The three sections of the original system's ladb_config.yaml, with its
  // values: they load as they are and the engine runs ladb.
  auto cfg = load_config_string(R"(batching:
  max_batch_size: 32
  min_batch_size: 4
  target_latency_ms: 500
  variance_tolerance: 0.2
  min_hold_ms: 50
  max_hold_ms: 120
predictor:
  model_path: ""
  warmup_steps: 100
  update_interval_ms: 1000
  max_steps_factor: 1.2
router:
  queue_strategy: priority_by_remaining_steps
  timeout_ms: 250
  fallback_policy: immediate_dispatch
)",
                                "ladb_config.yaml");
  EXPECT_EQ(cfg.engine.policy, scheduling_policy::ladb);
  EXPECT_EQ(cfg.batching.target_latency_ms, 500);
}

} // namespace
} // namespace metronome
