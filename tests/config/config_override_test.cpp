// Command-line overrides: --set key=value and the shorthand flags win over
// the file and pass the same checks.

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include <gtest/gtest.h>

#include "config/config_loader.hpp"
#include "config/config_schema.hpp"
#include "tests/config/config_test_util.hpp"

namespace metronome {
namespace {

using test::catch_config_error;

/// A scratch YAML file, removed at the end of the test.
class config_file_fixture : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path()
           / ("metronome_override_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }

  void TearDown() override {
    std::filesystem::remove_all(dir_);
  }

  std::filesystem::path write(const std::string& text) {
    auto path = dir_ / "metronome.yaml";
    std::ofstream out(path);
    out << text;
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(config_file_fixture, overrides_win_over_the_file) {
  auto path = write("server:\n  port: 7000\n  host: 0.0.0.0\nengine:\n  max_batch_size: 64\n");
  auto cfg = load_config(path, {{"engine.max_batch_size", "32", "--set"},
                                {"server.port", "9000", "--port"}});
  EXPECT_EQ(cfg.engine.max_batch_size, 32);
  EXPECT_EQ(cfg.server.port, 9000);
  EXPECT_EQ(cfg.server.host, "0.0.0.0"); // from the file, not overridden
  EXPECT_EQ(cfg.engine.page_size, 16);    // default, in neither
}

TEST_F(config_file_fixture, later_overrides_win_over_earlier_ones) {
  auto cfg = load_config(std::nullopt, {{"server.port", "1000", "--set"},
                                        {"server.port", "2000", "--port"}});
  EXPECT_EQ(cfg.server.port, 2000);
}

TEST_F(config_file_fixture, cross_field_rules_see_file_and_overrides_together) {
  // The file alone is invalid (min > max); the override repairs it.
  auto path = write("engine:\n  policy: ladb-literal\nbatching:\n  min_batch_size: 48\n");
  auto cfg = load_config(path, {{"batching.max_batch_size", "64", "--set"}});
  EXPECT_EQ(cfg.batching.min_batch_size, 48);

  auto e = catch_config_error(
    [&] { load_config(path, {{"batching.max_batch_size", "40", "--set"}}); });
  EXPECT_EQ(e.source(), path.string() + " with command-line overrides");
  EXPECT_EQ(e.key_path(), "batching.min_batch_size");
  EXPECT_EQ(e.problem(), "must not exceed batching.max_batch_size (40), got 48");

  e = catch_config_error([&] { load_config(path, {}); });
  EXPECT_EQ(e.source(), path.string());

  e = catch_config_error([] {
    load_config(std::nullopt,
                {{"engine.policy", "ladb-literal"}, {"batching.min_batch_size", "33"}});
  });
  EXPECT_STREQ(e.what(),
               "command line: batching.min_batch_size: must not exceed batching.max_batch_size "
               "(32), got 33");
}

TEST(config_override, errors_name_the_flag_and_the_key) {
  server_config cfg;
  auto e = catch_config_error([&] { apply_override(cfg, "engine.max_batch_size", "lots"); });
  EXPECT_STREQ(e.what(),
               "--set: engine.max_batch_size: expected an integer in [1, 4096], got \"lots\"");

  e = catch_config_error([&] { apply_override(cfg, "server.port", "99999", "--port"); });
  EXPECT_STREQ(e.what(),
               "--port: server.port: \"99999\" is out of range, expected an integer in "
               "[0, 65535]");

  e = catch_config_error([&] { apply_override(cfg, "engine.max_batch_sise", "4"); });
  EXPECT_STREQ(e.what(),
               "--set: engine.max_batch_sise: unknown key (did you mean max_batch_size?)");

  e = catch_config_error([&] { apply_override(cfg, "engin.max_batch_size", "4"); });
  EXPECT_EQ(e.problem(), "unknown key (did you mean engine.max_batch_size?)");

  e = catch_config_error([&] { apply_override(cfg, "supervisor.drift", "4"); });
  EXPECT_EQ(e.key_path(), "supervisor.drift");
  EXPECT_EQ(e.problem(),
            "is a section; set one of its keys (enabled, window_s, error_threshold, sustain_s, "
            "disable_s, min_samples)");

  // A refused value leaves the field as it was.
  EXPECT_EQ(cfg, server_config{});
}

TEST(config_override, set_syntax) {
  server_config cfg;
  apply_set(cfg, "engine.max_batch_size=32");
  EXPECT_EQ(cfg.engine.max_batch_size, 32);
  apply_set(cfg, "model.path=/models/a=b");
  EXPECT_EQ(cfg.model.path, "/models/a=b");
  apply_set(cfg, "model.served_model_name=");
  EXPECT_EQ(cfg.model.served_model_name, "");
  for (auto bad : {"engine.max_batch_size", "=32", ""}) {
    auto e = catch_config_error([&] { apply_set(cfg, bad); });
    EXPECT_EQ(e.problem().rfind("expected key.path=value", 0), 0u) << e.what();
  }
}

TEST(config_override, values_are_taken_literally) {
  // Override text is the value itself, never YAML: no comments, no nulls, no tags.
  server_config cfg;
  apply_override(cfg, "model.served_model_name", "llama #3");
  EXPECT_EQ(cfg.model.served_model_name, "llama #3");
  apply_override(cfg, "model.path", "~");
  EXPECT_EQ(cfg.model.path, "~");
  apply_override(cfg, "model.chat_template", "");
  EXPECT_EQ(cfg.model.chat_template, "");
  auto e = catch_config_error([&] { apply_override(cfg, "server.port", ""); });
  EXPECT_EQ(e.problem(), "expected an integer in [0, 65535], got \"\"");
}

TEST(config_override, shorthand_flags_map_to_keys) {
  EXPECT_EQ(flag_key_path("--port"), "server.port");
  EXPECT_EQ(flag_key_path("port"), "server.port");
  EXPECT_EQ(flag_key_path("--host"), "server.host");
  EXPECT_EQ(flag_key_path("--model"), "model.path");
  EXPECT_EQ(flag_key_path("--policy"), "engine.policy");
  EXPECT_EQ(flag_key_path("--nope"), std::nullopt);
  for (const auto& f : config_flags()) {
    EXPECT_TRUE(f.flag.starts_with("--")) << f.flag;
    EXPECT_NE(find_config_key(f.key_path), nullptr) << f.flag << " -> " << f.key_path;
    EXPECT_FALSE(f.help.empty()) << f.flag;
  }
  server_config cfg;
  apply_override(cfg, *flag_key_path("--port"), "9000", "--port");
  EXPECT_EQ(cfg.server.port, 9000);
}

// -- what the help says about each key --------------------------------------------------

TEST(config_help, each_kind_of_key_has_its_type_name) {
  for (const auto& key : config_keys()) {
    ASSERT_FALSE(key.metavar.empty()) << key.path;
    switch (key.kind) {
      case value_kind::integer: EXPECT_EQ(key.metavar, "INT") << key.path; break;
      case value_kind::real: EXPECT_EQ(key.metavar, "FLOAT") << key.path; break;
      case value_kind::boolean: EXPECT_EQ(key.metavar, "BOOL") << key.path; break;
      case value_kind::bytes: EXPECT_EQ(key.metavar, "SIZE") << key.path; break;
      case value_kind::list: EXPECT_TRUE(key.metavar.ends_with(",...")) << key.path; break;
      case value_kind::choice: {
        // {a,b,c}: each name is accepted, and nothing else is.
        ASSERT_TRUE(key.metavar.starts_with("{") && key.metavar.ends_with("}")) << key.metavar;
        std::string_view names(key.metavar);
        names = names.substr(1, names.size() - 2);
        while (!names.empty()) {
          auto name = names.substr(0, names.find(','));
          server_config cfg;
          EXPECT_EQ(key.set(cfg, name), "") << key.path << ": " << name;
          names.remove_prefix(std::min(names.size(), name.size() + 1));
        }
        server_config cfg;
        EXPECT_NE(key.set(cfg, "no-such-name"), "") << key.path;
        break;
      }
      case value_kind::text: break; // TEXT, PATH, HOST, ...: per key, below
    }
  }
  EXPECT_EQ(find_config_key("model.path")->metavar, "PATH");
  EXPECT_EQ(find_config_key("server.tls.cert_file")->metavar, "PATH");
  EXPECT_EQ(find_config_key("server.host")->metavar, "HOST");
  EXPECT_EQ(find_config_key("model.device")->metavar, "cpu|cuda:N");
  EXPECT_EQ(find_config_key("engine.policy")->metavar, "{fcfs,ladb,srpt,ladb-literal}");
  EXPECT_EQ(find_config_key("server.allowed_origins")->metavar, "ORIGIN,...");
}

TEST(config_help, defaults_read_back_as_the_defaults) {
  // Given on the command line, the default the help shows changes nothing.
  const server_config defaults;
  for (const auto& key : config_keys()) {
    server_config cfg;
    const auto text = default_text(key);
    EXPECT_EQ(key.set(cfg, text), "") << key.path << ": " << text;
    EXPECT_EQ(key.get(cfg), key.get(defaults)) << key.path << ": " << text;
  }
  EXPECT_EQ(default_text(*find_config_key("server.port")), "8080");
  EXPECT_EQ(default_text(*find_config_key("server.host")), "127.0.0.1");
  EXPECT_EQ(default_text(*find_config_key("engine.gpu_memory_fraction")), "0.9");
  EXPECT_EQ(default_text(*find_config_key("engine.policy")), "ladb");
  EXPECT_EQ(default_text(*find_config_key("model.path")), "");
  EXPECT_EQ(default_text(*find_config_key("server.api_keys")), "");
}

TEST(config_override, chat_template_is_a_name_or_a_file) {
  EXPECT_EQ(flag_key_path("--chat-template"), "model.chat_template");
  for (const char* value : {"llama3", "llama2", "mistral", "chatml", "", "/srv/templates/qwen.jinja",
                            "chat_template.jinja", "./tmpl"}) {
    auto cfg = load_config(std::nullopt, {{"model.chat_template", value, "--chat-template"}});
    EXPECT_EQ(cfg.model.chat_template, value);
    // Written back by --dump-config, it loads back the same.
    EXPECT_EQ(load_config_string(to_yaml(cfg), "dump").model.chat_template, value);
  }
  // A bare word that is no format name is a mistyped name, not a file.
  for (const char* value : {"llama4", "vicuna", "Llama3"}) {
    auto e = catch_config_error(
      [&] { load_config(std::nullopt, {{"model.chat_template", value, "--chat-template"}}); });
    EXPECT_NE(std::string(e.what()).find("--chat-template: model.chat_template: expected \"\", "
                                         "llama3, llama2, mistral, chatml, or the path of a "
                                         "Jinja template file"),
              std::string::npos)
      << e.what();
  }
  EXPECT_EQ(find_config_key("model.chat_template")->metavar,
            "{llama3,llama2,mistral,chatml}|PATH");
}

TEST(config_override, kv_cache_dtype_flag) {
  EXPECT_EQ(flag_key_path("--kv-cache-dtype"), "engine.kv_cache_dtype");
  auto cfg = load_config(std::nullopt, {{"engine.kv_cache_dtype", "fp8", "--kv-cache-dtype"}});
  EXPECT_EQ(cfg.engine.kv_cache_dtype, kv_cache_dtype_kind::fp8);
  auto e = catch_config_error(
    [] { load_config(std::nullopt, {{"engine.kv_cache_dtype", "fp4", "--kv-cache-dtype"}}); });
  EXPECT_STREQ(e.what(),
               "--kv-cache-dtype: engine.kv_cache_dtype: expected one of bf16, fp8, fp8_e5m2, got \"fp4\"");
}

} // namespace
} // namespace metronome
