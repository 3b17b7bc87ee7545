// Every class of configuration error names the source and the key path, and
// says what is allowed.

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "config/config_loader.hpp"
#include "config/config_schema.hpp"
#include "tests/config/config_test_util.hpp"

namespace metronome {
namespace {

using test::catch_config_error;
using test::nested_yaml;

config_error load_error(const std::string& yaml) {
  return catch_config_error([&] { load_config_string(yaml, "metronome.yaml"); });
}

// -- the error type --------------------------------------------------------------------

TEST(config_error_type, composes_what_from_its_parts) {
  config_error e("metronome.yaml", "engine.page_size", "bad");
  EXPECT_STREQ(e.what(), "metronome.yaml: engine.page_size: bad");
  EXPECT_EQ(e.source(), "metronome.yaml");
  EXPECT_EQ(e.key_path(), "engine.page_size");
  EXPECT_EQ(e.problem(), "bad");
  const std::runtime_error& base = e;
  EXPECT_STREQ(base.what(), "metronome.yaml: engine.page_size: bad");
  EXPECT_STREQ(config_error("f.yaml", "", "broken").what(), "f.yaml: broken");
}

// -- unknown keys ----------------------------------------------------------------------

TEST(config_unknown_key, suggests_the_sibling_it_resembles) {
  auto e = load_error("engine:\n  max_batch_sise: 32\n");
  EXPECT_STREQ(e.what(),
               "metronome.yaml: engine.max_batch_sise: unknown key (did you mean "
               "max_batch_size?) (line 2)");
  EXPECT_EQ(e.key_path(), "engine.max_batch_sise");
}

TEST(config_unknown_key, suggests_a_key_with_letters_missing_or_added) {
  auto e = load_error("engine:\n  max_batch_siz: 32\n");
  EXPECT_NE(e.problem().find("did you mean max_batch_size?"), std::string::npos) << e.what();
  e = load_error("engine:\n  max_batch_sizzee: 32\n");
  EXPECT_NE(e.problem().find("did you mean max_batch_size?"), std::string::npos) << e.what();
}

TEST(config_unknown_key, a_key_of_thousands_of_characters_gets_no_suggestion) {
  // Found by the config_yaml fuzz target: each hint compared the key with
  // every known key through a table of both lengths.
  const std::string key = "max_batch_size" + std::string(20000, 'x');
  // An explicit key ("? "): YAML caps implicit keys at 1,024 characters.
  auto e = load_error("engine:\n  ? " + key + "\n  : 32\n");
  EXPECT_EQ(e.key_path(), "engine." + key);
  EXPECT_EQ(e.problem().find("did you mean"), std::string::npos) << e.problem().substr(0, 200);
  EXPECT_NE(e.problem().find("unknown key"), std::string::npos);
}

TEST(config_unknown_key, suggests_the_same_key_in_another_section) {
  auto e = load_error("engine:\n  min_batch_size: 2\n");
  EXPECT_EQ(e.key_path(), "engine.min_batch_size");
  EXPECT_NE(e.problem().find("did you mean batching.min_batch_size?"), std::string::npos)
    << e.what();
}

TEST(config_unknown_key, in_nested_sections_and_at_the_top) {
  auto e = load_error("supervisor:\n  drift:\n    windows_s: 5\n");
  EXPECT_EQ(e.key_path(), "supervisor.drift.windows_s");
  EXPECT_NE(e.problem().find("did you mean window_s?"), std::string::npos) << e.what();

  e = load_error("enigne:\n  max_batch_size: 4\n");
  EXPECT_EQ(e.key_path(), "enigne");
  EXPECT_NE(e.problem().find("did you mean engine?"), std::string::npos) << e.what();

  e = load_error("telemetry:\n  on: true\n");
  EXPECT_EQ(e.key_path(), "telemetry");
  EXPECT_NE(e.problem().find("known sections: server, model, engine, batching, predictor, "
                             "router, supervisor, logging"),
            std::string::npos)
    << e.what();

  e = load_error("logging:\n  verbosity_level_of_everything: 3\n");
  EXPECT_NE(e.problem().find("known keys here: level"), std::string::npos) << e.what();
}

TEST(config_unknown_key, duplicates_are_errors) {
  auto e = load_error("server:\n  port: 1\n  port: 2\n");
  EXPECT_EQ(e.key_path(), "server.port");
  EXPECT_EQ(e.problem(), "duplicate key (line 3)");
}

// -- wrong types -----------------------------------------------------------------------

TEST(config_wrong_type, scalars_of_each_kind) {
  struct bad {
    const char* path;
    const char* value;
    const char* problem;
  };
  for (const auto& b : std::initializer_list<bad>{
         {"server.port", "http", R"(expected an integer in [0, 65535], got "http")"},
         {"server.port", "80.5", R"(expected an integer in [0, 65535], got "80.5")"},
         {"server.port", "0x50", R"(expected an integer in [0, 65535], got "0x50")"},
         {"server.port", "080",
          R"("080" has a leading zero (octal to some YAML readers): write it without)"},
         {"server.port", "true", R"(expected an integer in [0, 65535], got "true")"},
         {"engine.gpu_memory_fraction", "most",
          R"(expected a number in (0, 1], got "most")"},
         {"engine.cuda_graphs", "1", R"(expected true or false, got "1")"},
         {"engine.policy", "lifo", R"(expected one of fcfs, ladb, srpt, ladb-literal, got "lifo")"},
         {"engine.kv_cache_dtype", "fp4", R"(expected one of bf16, fp8, fp8_e5m2, got "fp4")"},
         {"engine.kv_cache_dtype", "e4m3", R"(expected one of bf16, fp8, fp8_e5m2, got "e4m3")"},
         {"engine.kv_cache_dtype", "e5m2", R"(expected one of bf16, fp8, fp8_e5m2, got "e5m2")"},
         {"model.chat_template", "vicuna",
          R"(expected "", llama3, llama2, mistral, chatml, or the path of a Jinja template )"
          R"(file (with a / or a . in it), got "vicuna")"},
         {"model.device", "gpu",
          R"(expected cpu or cuda:N (N a GPU ordinal in [0, 63]), got "gpu")"},
         {"server.host", "\"two words\"",
          R"(expected an IPv4 or IPv6 address or a host name, got "two words")"},
         {"server.max_body_bytes", "1TB",
          R"(expected a byte count in [1KiB, 1GiB] (an integer, or with a unit: KiB, MiB, )"
          R"(GiB, KB, MB, GB), got "1TB")"},
       }) {
    auto e = load_error(nested_yaml(b.path, b.value));
    EXPECT_EQ(e.source(), "metronome.yaml");
    EXPECT_EQ(e.key_path(), b.path);
    EXPECT_EQ(e.problem(), std::string(b.problem) + " (line 2)") << e.what();
  }
}

TEST(config_wrong_type, mappings_lists_and_missing_values) {
  auto e = load_error("server:\n  port: [1, 2]\n");
  EXPECT_EQ(e.key_path(), "server.port");
  EXPECT_EQ(e.problem(), "expected an integer in [0, 65535], got a list (line 2)");

  e = load_error("model:\n  path: {a: 1}\n");
  EXPECT_EQ(e.key_path(), "model.path");
  EXPECT_EQ(e.problem(), "expected a string, got a mapping (line 2)");

  e = load_error("server:\n  port:\n");
  EXPECT_EQ(e.key_path(), "server.port");
  EXPECT_NE(e.problem().find("got no value"), std::string::npos) << e.what();

  e = load_error("engine:\n  policy:\n");
  EXPECT_EQ(e.problem(), "expected one of fcfs, ladb, srpt, ladb-literal, got no value (line 2)");
}

TEST(config_wrong_type, sections_must_be_mappings) {
  auto e = load_error("engine: 5\n");
  EXPECT_EQ(e.key_path(), "engine");
  EXPECT_NE(e.problem().find("expected a mapping of keys (max_batch_size, "), std::string::npos)
    << e.what();
  EXPECT_NE(e.problem().find("got a scalar"), std::string::npos) << e.what();

  e = load_error("supervisor:\n  drift: [1]\n");
  EXPECT_EQ(e.key_path(), "supervisor.drift");

  e = load_error("- server\n- model\n");
  EXPECT_EQ(e.key_path(), "");
  EXPECT_STREQ(e.what(),
               "metronome.yaml: expected a mapping of sections (server, model, engine, batching, "
               "predictor, router, supervisor, logging, workers) at the top level, got a list");
}

TEST(config_wrong_type, every_key_names_its_path) {
  // A mapping is the wrong type for every key, and a list for every key but
  // the list keys; the error must name the key.
  for (const auto& key : config_keys()) {
    for (auto value : {"[1, 2]", "{a: 1}"}) {
      if (key.kind == value_kind::list && value[0] == '[')
        continue;
      auto e = load_error(nested_yaml(key.path, value));
      EXPECT_EQ(e.key_path(), key.path) << e.what();
      EXPECT_NE(e.problem().find("expected " + key.allowed), std::string::npos) << e.what();
    }
  }
}

// -- out of range ----------------------------------------------------------------------

TEST(config_range, integers_numbers_and_bytes) {
  struct bad {
    const char* path;
    const char* value;
    const char* problem;
  };
  for (const auto& b : std::initializer_list<bad>{
         {"server.port", "70000", R"("70000" is out of range, expected an integer in [0, 65535])"},
         {"engine.max_batch_size", "0",
          R"("0" is out of range, expected an integer in [1, 4096])"},
         {"engine.max_batch_size", "99999999999999999999999",
          R"(expected an integer in [1, 4096], got "99999999999999999999999")"},
         {"engine.gpu_memory_fraction", "0",
          R"("0" is out of range, expected a number in (0, 1])"},
         {"engine.gpu_memory_fraction", "1.01",
          R"("1.01" is out of range, expected a number in (0, 1])"},
         {"engine.gpu_memory_fraction", "nan",
          R"("nan" is out of range, expected a number in (0, 1])"},
         {"server.request_timeout_s", "inf",
          R"("inf" is out of range, expected a number in (0, 604800])"},
         {"batching.variance_tolerance", "-0.1",
          R"("-0.1" is out of range, expected a number in [0, 1])"},
         {"engine.page_size", "24", R"("24" is not a power of two)"},
         {"engine.page_size", "2048",
          R"("2048" is out of range, expected an integer in [1, 1024] (a power of two))"},
         {"server.max_body_bytes", "100",
          R"("100" is out of range, expected a byte count in [1KiB, 1GiB] (an integer, or )"
          R"(with a unit: KiB, MiB, GiB, KB, MB, GB))"},
         {"model.device", "cuda:64",
          R"(expected cpu or cuda:N (N a GPU ordinal in [0, 63]), got "cuda:64")"},
         {"server.max_connections", "-1",
          R"("-1" is out of range, expected an integer in [0, 10000000] (0 = from RLIMIT_NOFILE))"},
         {"server.header_timeout_s", "0",
          R"("0" is out of range, expected a number in (0, 604800])"},
         {"server.idle_timeout_s", "-5",
          R"("-5" is out of range, expected a number in (0, 604800])"},
         {"server.write_timeout_s", "0", R"("0" is out of range, expected a number in (0, 604800])"},
         {"server.drain_timeout_s", "-1",
          R"("-1" is out of range, expected a number in [0, 604800])"},
       }) {
    auto e = load_error(nested_yaml(b.path, b.value));
    EXPECT_EQ(e.key_path(), b.path);
    EXPECT_EQ(e.problem(), std::string(b.problem) + " (line 2)") << e.what();
  }
}

TEST(config_range, kv_overflow_keys) {
  struct bad {
    const char* path;
    const char* value;
    const char* problem;
  };
  for (const auto& b : std::initializer_list<bad>{
         {"engine.kv_overflow.window_s", "0",
          R"("0" is out of range, expected a number in (0, 604800])"},
         {"engine.kv_overflow.cooldown_s", "-5",
          R"("-5" is out of range, expected a number in (0, 604800])"},
         {"engine.kv_overflow.max_rematerializations", "-1",
          R"("-1" is out of range, expected an integer in [0, 1000000])"},
       }) {
    auto e = load_error(nested_yaml(b.path, b.value));
    EXPECT_EQ(e.key_path(), b.path);
    EXPECT_EQ(e.problem(), std::string(b.problem) + " (line 3)") << e.what();
  }
}

TEST(config_range, boundaries_are_inclusive_where_documented) {
  EXPECT_NO_THROW(load_config_string(nested_yaml("engine.gpu_memory_fraction", "1"), "t"));
  EXPECT_NO_THROW(load_config_string(nested_yaml("batching.variance_tolerance", "0"), "t"));
  EXPECT_NO_THROW(load_config_string(nested_yaml("batching.variance_tolerance", "1"), "t"));
  EXPECT_NO_THROW(load_config_string(nested_yaml("server.port", "65535"), "t"));
  EXPECT_NO_THROW(load_config_string(nested_yaml("engine.page_size", "1"), "t"));
  EXPECT_NO_THROW(load_config_string(nested_yaml("engine.page_size", "1024"), "t"));
  // No drain: SIGTERM ends running requests with an error at once.
  EXPECT_NO_THROW(load_config_string(nested_yaml("server.drain_timeout_s", "0"), "t"));
  EXPECT_NO_THROW(load_config_string(nested_yaml("server.max_connections", "0"), "t"));
  // fp8_e5m2: no re-materialisation at all, every overflow starts a cool-down.
  EXPECT_NO_THROW(
    load_config_string(nested_yaml("engine.kv_overflow.max_rematerializations", "0"), "t"));
}

TEST(config_range, every_numeric_key_names_its_path) {
  for (const auto& key : config_keys()) {
    if (key.kind != value_kind::integer && key.kind != value_kind::real
        && key.kind != value_kind::bytes)
      continue;
    auto e = load_error(nested_yaml(key.path, "-1e300"));
    EXPECT_EQ(e.key_path(), key.path) << e.what();
    e = load_error(nested_yaml(key.path, key.kind == value_kind::real ? "1e300" : "99999999999999"));
    EXPECT_EQ(e.key_path(), key.path) << e.what();
    EXPECT_NE(e.problem().find(key.allowed), std::string::npos) << e.what();
  }
}

// -- cross-field rules -------------------------------------------------------------------

TEST(config_range, token_group_bounds_are_refused_by_name) {
  struct bad {
    const char* value;
    const char* problem;
  };
  for (const auto& b : std::initializer_list<bad>{
         {"\"128,32\"", "bounds must increase, got 32 after 128"},
         {"\"32,32\"", "bounds must increase, got 32 after 32"},
         {"\"0,32\"", "bound 0 is outside [1, 1048576]"},
         {"\"32,2000000\"", "bound 2000000 is outside [1, 1048576]"},
         {"\"32,,128\"", "expected token counts separated by commas (\"32,128\"), got \"\""},
         {"\"32;128\"", "expected token counts separated by commas (\"32,128\"), got \"32;128\""},
         {"\"1,2,3,4,5,6,7,8,9\"", "at most 8 bounds"},
         {"-5", "bound -5 is outside [1, 1048576]"},
       }) {
    auto e = load_error(nested_yaml("batching.token_groups", b.value));
    EXPECT_EQ(e.key_path(), "batching.token_groups") << e.what();
    EXPECT_EQ(e.problem(), std::string(b.problem) + " (line 2)") << b.value;
  }
  // From the command line too, naming the key and the source.
  server_config cfg;
  try {
    apply_override(cfg, "batching.token_groups", "128,32");
    ADD_FAILURE() << "accepted";
  } catch (const config_error& e) {
    EXPECT_EQ(e.key_path(), "batching.token_groups");
    EXPECT_NE(std::string(e.what()).find("bounds must increase"), std::string::npos) << e.what();
  }
  // Spaces are allowed and dropped; "" is off.
  EXPECT_EQ(load_config_string(nested_yaml("batching.token_groups", "\" 32, 128\""), "t")
              .batching.token_groups,
            "32,128");
  EXPECT_EQ(load_config_string(nested_yaml("batching.token_groups", "\"\""), "t")
              .batching.token_groups,
            "");
}

TEST(config_cross_field, each_rule_names_the_key_and_the_bound) {
  struct bad {
    const char* yaml;
    const char* key;
    const char* problem;
  };
  for (const auto& b : std::initializer_list<bad>{
         {"engine:\n  policy: ladb-literal\nbatching:\n  min_batch_size: 40\n",
          "batching.min_batch_size",
          "must not exceed batching.max_batch_size (32), got 40"},
         {"batching:\n  max_batch_size: 200\n", "batching.max_batch_size",
          "must not exceed engine.max_batch_size (128), the cap on running sequences, got 200"},
         {"engine:\n  policy: ladb-literal\nbatching:\n  min_hold_ms: 200\n",
          "batching.min_hold_ms",
          "must not exceed batching.max_hold_ms (120), got 200"},
         {"engine:\n  max_batch_size: 512\n  max_num_batched_tokens: 256\nbatching:\n"
          "  max_batch_size: 8\n",
          "engine.max_num_batched_tokens",
          "must be at least engine.max_batch_size (512) so every running sequence can decode in "
          "one step, got 256"},
         {"engine:\n  prefill_chunk_tokens: 4096\n", "engine.prefill_chunk_tokens",
          "must not exceed engine.max_num_batched_tokens (2048), got 4096"},
         {"engine:\n  kv_cache_tokens: 8\n", "engine.kv_cache_tokens",
          "must be 0 (auto) or at least one page (engine.page_size = 16), got 8"},
         {"engine:\n  kv_cache_tokens: 1024\nmodel:\n  max_model_len: 2048\n",
          "engine.kv_cache_tokens",
          "cannot hold one sequence of model.max_model_len (2048) tokens, got 1024"},
       }) {
    auto e = load_error(b.yaml);
    EXPECT_EQ(e.source(), "metronome.yaml");
    EXPECT_EQ(e.key_path(), b.key) << e.what();
    EXPECT_EQ(e.problem(), b.problem) << e.what();
  }
}

TEST(config_cross_field, fault_injection_needs_a_loopback_host_and_a_known_form) {
  auto e = load_error("server:\n  host: 0.0.0.0\nengine:\n  fault_injection: throw_after:3\n");
  EXPECT_EQ(e.key_path(), "engine.fault_injection") << e.what();
  EXPECT_NE(e.problem().find("needs server.host on loopback"), std::string::npos) << e.what();
  for (const char* host : {"127.0.0.1", "::1", "localhost"})
    EXPECT_NO_THROW(load_config_string(std::string("server:\n  host: \"") + host
                                         + "\"\nengine:\n  fault_injection: hang_after:0\n",
                                       "t"))
      << host;
  e = load_error("engine:\n  fault_injection: explode_after:3\n");
  EXPECT_EQ(e.key_path(), "engine.fault_injection") << e.what();
  EXPECT_NE(e.problem().find("throw_after:N"), std::string::npos) << e.what();
}

TEST(config_cross_field, tensor_parallel_keys_are_refused_by_name) {
  auto e = load_error("model:\n  device: cuda:0\n  tensor_parallel: 2\n"
                      "  tensor_parallel_devices: [cuda:0, cuda:1, cuda:2]\n");
  EXPECT_EQ(e.key_path(), "model.tensor_parallel_devices") << e.what();
  EXPECT_NE(e.problem().find("lists 3 devices"), std::string::npos) << e.what();
  e = load_error("model:\n  device: cuda:0\n  tensor_parallel: 2\n"
                 "  tensor_parallel_devices: [cuda:0, cpu]\n");
  EXPECT_EQ(e.key_path(), "model.tensor_parallel_devices") << e.what();
  e = load_error("model:\n  tensor_parallel_collective: mpi\n");
  EXPECT_EQ(e.key_path(), "model.tensor_parallel_collective") << e.what();
  e = load_error("model:\n  tensor_parallel: 9\n");
  EXPECT_EQ(e.key_path(), "model.tensor_parallel") << e.what();
  // Two ranks on one device over peer, and consecutive devices, are fine.
  auto cfg = load_config_string("model:\n  device: cuda:0\n  tensor_parallel: 2\n"
                                "  tensor_parallel_devices: [cuda:0, cuda:0]\n"
                                "  tensor_parallel_collective: peer\n",
                                "t");
  EXPECT_EQ(cfg.model.tensor_parallel, 2);
  EXPECT_EQ(cfg.model.tensor_parallel_devices.size(), 2u);
  EXPECT_EQ(cfg.model.tensor_parallel_collective, "peer");
}

TEST(config_cross_field, data_parallel_keys_are_refused_by_name) {
  auto e = load_error("model:\n  devices: [cuda:0, cuda:1]\n  data_parallel: 3\n");
  EXPECT_EQ(e.key_path(), "model.data_parallel") << e.what();
  EXPECT_NE(e.problem().find("model.devices lists 2 devices"), std::string::npos) << e.what();
  e = load_error("model:\n  device: cuda:1\n  devices: [cuda:0]\n");
  EXPECT_EQ(e.key_path(), "model.device") << e.what();
  e = load_error("model:\n  devices: [cpu, cuda:0]\n");
  EXPECT_EQ(e.key_path(), "model.devices") << e.what();
  EXPECT_NE(e.problem().find("all on the CPU or all on CUDA"), std::string::npos) << e.what();
  e = load_error("model:\n  devices: [gpu0]\n");
  EXPECT_EQ(e.key_path(), "model.devices") << e.what();
  e = load_error("model:\n  data_parallel: 0\n");
  EXPECT_EQ(e.key_path(), "model.data_parallel") << e.what();
  EXPECT_NE(e.problem().find("workers.listen is empty"), std::string::npos) << e.what();
  e = load_error("model:\n  data_parallel: 65\n");
  EXPECT_EQ(e.key_path(), "model.data_parallel") << e.what();
  // No replica here and workers to serve: a front end of workers only.
  auto only = load_config_string("model:\n  data_parallel: 0\nworkers:\n  listen: 127.0.0.1:0\n",
                                 "t");
  EXPECT_EQ(only.model.data_parallel, 0);
  // Agreeing keys, a device listed twice (two replicas sharing it), and
  // replicas on the one model.device are fine.
  auto cfg = load_config_string("model:\n  devices: [cuda:0, cuda:0]\n  data_parallel: 2\n", "t");
  EXPECT_EQ(cfg.model.devices.size(), 2u);
  cfg = load_config_string("model:\n  data_parallel: 4\n", "t");
  EXPECT_EQ(cfg.model.data_parallel, 4);
}

TEST(config_cross_field, worker_keys_are_checked) {
  auto e = load_error("workers:\n  heartbeat_ms: 500\n  timeout_ms: 500\n");
  EXPECT_EQ(e.key_path(), "workers.timeout_ms") << e.what();
  for (const char* bad : {"localhost", ":7400", "host:99999", "host:", "bad host:1", "h:7x"}) {
    e = load_error(std::string("workers:\n  listen: \"") + bad + "\"\n");
    EXPECT_EQ(e.key_path(), "workers.listen") << bad << ": " << e.what();
  }
  e = load_error("workers:\n  connect: \"127.0.0.1:0\"\n");
  EXPECT_EQ(e.key_path(), "workers.connect") << "a worker cannot connect to port 0";
  auto cfg = load_config_string("workers:\n  listen: \"[::1]:0\"\n  connect: \"gpu-a.lan:7400\"\n",
                                "t");
  EXPECT_EQ(cfg.workers.listen, "[::1]:0");
  EXPECT_EQ(cfg.workers.connect, "gpu-a.lan:7400");
}

TEST(config_cross_field, holds_when_both_sides_move_together) {
  auto cfg = load_config_string(
    "engine:\n  policy: ladb-literal\n"
    "batching:\n  min_batch_size: 40\n  max_batch_size: 64\n  min_hold_ms: 200\n"
    "  max_hold_ms: 300\n",
    "t.yaml");
  EXPECT_EQ(cfg.batching.min_batch_size, 40);
  EXPECT_EQ(cfg.batching.max_hold_ms, 300);
}

TEST(config_cross_field, keys_only_the_literal_policy_reads_are_refused_under_others) {
  // Accepted and ignored would be worse: the operator thinks they act.
  for (const char* key : {"min_batch_size: 2", "min_hold_ms: 10", "max_hold_ms: 100"})
    for (const char* policy : {"fcfs", "ladb", "srpt"}) {
      auto e = load_error(std::string("engine:\n  policy: ") + policy + "\nbatching:\n  " + key
                          + "\n");
      EXPECT_EQ(e.key_path(), "batching." + std::string(key).substr(0, std::string(key).find(':')));
      EXPECT_NE(e.problem().find("engine.policy: ladb-literal"), std::string::npos) << e.what();
      EXPECT_NE(e.problem().find(std::string("engine.policy ") + policy + " never"),
                std::string::npos)
        << e.what();
    }
  // The defaults written out (the seeds' file does) are accepted anywhere,
  // and a smaller max_batch_size needs no change to them under ladb.
  EXPECT_NO_THROW(load_config_string(
    "batching:\n  min_batch_size: 4\n  min_hold_ms: 50\n  max_hold_ms: 120\n"
    "  max_batch_size: 1\n",
    "t.yaml"));
  auto e = load_error("predictor:\n  model_path: /tmp/state.bin\n");
  EXPECT_EQ(e.key_path(), "predictor.model_path");
  EXPECT_NE(e.problem().find("not supported"), std::string::npos) << e.what();
  EXPECT_NO_THROW(load_config_string("predictor:\n  model_path: \"\"\n", "t.yaml"));
}

// -- files and syntax ------------------------------------------------------------------

TEST(config_file, syntax_errors_give_the_line) {
  auto e = load_error("server:\n  port: 8080\n  host: [unclosed\n");
  EXPECT_EQ(e.key_path(), "");
  EXPECT_EQ(e.problem().rfind("invalid YAML at line ", 0), 0u) << e.what();
  EXPECT_EQ(std::string(e.what()).rfind("metronome.yaml: invalid YAML", 0), 0u) << e.what();
}

TEST(config_file, one_document_only) {
  auto e = load_error("server:\n  port: 1\n---\nserver:\n  port: 2\n");
  EXPECT_EQ(e.problem(), "expected one YAML document, found 2");
}

TEST(config_file, missing_file_is_named) {
  auto e = catch_config_error([] { load_config_file("/nonexistent/metronome.yaml"); });
  EXPECT_STREQ(e.what(), "/nonexistent/metronome.yaml: cannot open: No such file or directory");
}

TEST(config_file, errors_name_the_file_as_given) {
  auto dir = std::filesystem::temp_directory_path() / "metronome_config_test";
  std::filesystem::create_directories(dir);
  auto path = dir / "bad.yaml";
  {
    std::ofstream out(path);
    out << "# a comment\nengine:\n  page_size: 3\n";
  }
  auto e = catch_config_error([&] { load_config_file(path); });
  EXPECT_EQ(e.source(), path.string());
  EXPECT_EQ(e.key_path(), "engine.page_size");
  EXPECT_EQ(e.problem(), "\"3\" is not a power of two (line 3)");
  std::filesystem::remove_all(dir);
}

} // namespace
} // namespace metronome

namespace metronome {
namespace {

// Found by tests/fuzz/config_yaml_fuzz.cpp: yaml-cpp 0.7 never returns on
// these (a ',' after a top-level anchor, tag or flow collection) and fills
// memory; `metronome serve --config` hung. They must be an error, at once.
TEST(config_invalid_yaml, texts_the_parser_loops_on_are_errors) {
  for (const std::string yaml : {"&a,b\n", "[a],b\n", "!t,b\n", "&a\n,b\n"}) {
    SCOPED_TRACE(yaml);
    auto done = std::make_shared<std::promise<std::string>>();
    auto result = done->get_future();
    std::thread([yaml, done] {
      try {
        load_config_string(yaml, "metronome.yaml");
        done->set_value("no error");
      } catch (const config_error& e) {
        done->set_value(e.what());
      }
    }).detach();
    if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      ADD_FAILURE() << "the YAML parser did not return within 20 s";
      std::_Exit(1); // the thread cannot be stopped
    }
    const auto what = result.get();
    EXPECT_NE(what.find("metronome.yaml"), std::string::npos) << what;
    EXPECT_NE(what.find("invalid YAML"), std::string::npos) << what;
  }
}

} // namespace
} // namespace metronome
