// The `metronome` command line, run as a user would: make a model, generate
// from it, and get one clear message and a non-zero exit for each mistake.

#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpu/cuda_runner.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::run_command;
using test::shell_quote;

std::string bin() {
  return shell_quote(test::env("BIN"));
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(cli, make_model_then_generate_reproduces_the_reference_greedy_ids) {
  auto dir = test::scratch_dir("cli-gen") / "tiny-qwen2";
  auto r = run_command(bin() + " make-model --preset tiny-qwen2 --seed 7 --out " + shell_quote(dir.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto golden = json::parse(std::ifstream(test::env("SOURCE_DIR") + "/tools/golden/tiny-qwen2.json"));
  const auto& run = golden["runs"][1];
  std::string ids;
  for (auto id : run["prompt"])
    ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
  r = run_command(bin() + " generate --model " + shell_quote(dir.string()) + " --prompt-ids " + ids
                  + " -n 17 --temperature 0 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto out = json::parse(r.output);
  EXPECT_EQ(out["ids"], run["greedy_ids"]);
  EXPECT_EQ(out["finish_reason"], "length");
  EXPECT_EQ(out["prompt_tokens"], run["prompt"].size());
  EXPECT_GT(out["ttft_ms"].get<double>(), 0.0);
}

TEST(cli, seeded_sampling_repeats_and_unseeded_varies) {
  auto dir = test::tiny_model("tiny-llama3");
  auto gen = [&](const std::string& extra) {
    auto r = run_command(bin() + " generate --model " + shell_quote(dir.string())
                         + " --prompt-ids 128000,5,6 -n 24 --ignore-eos --json " + extra);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return json::parse(r.output)["ids"];
  };
  EXPECT_EQ(gen("--seed 11"), gen("--seed 11"));
  EXPECT_NE(gen("--seed 11"), gen("--seed 12"));
  EXPECT_NE(gen(""), gen(""));
}

TEST(cli, make_model_is_byte_identical_for_a_seed) {
  auto a = test::scratch_dir("cli-det-a"), b = test::scratch_dir("cli-det-b");
  for (const auto& d : {a, b})
    ASSERT_EQ(run_command(bin() + " make-model --preset tiny-mistral --seed 3 --out " + shell_quote(d.string())).exit_code, 0);
  auto sum = [](const fs::path& p) {
    return run_command("sha256sum " + shell_quote((p / "model.safetensors").string())).output.substr(0, 64);
  };
  EXPECT_EQ(sum(a), sum(b));
  ASSERT_EQ(run_command(bin() + " make-model --preset tiny-mistral --seed 4 --force --out " + shell_quote(b.string())).exit_code, 0);
  EXPECT_NE(sum(a), sum(b));
}

TEST(cli, make_model_refuses_a_folder_that_is_not_empty_unless_forced) {
  auto dir = test::scratch_dir("cli-force"); // exists, empty: written
  const auto make = [&](const std::string& extra) {
    return run_command(bin() + " make-model --preset tiny-mistral --seed 1 --max-shard-mb 0 "
                       + extra + " --out " + shell_quote(dir.string()));
  };
  ASSERT_EQ(make("").exit_code, 0);
  const auto before = fs::last_write_time(dir / "model.safetensors");
  auto again = make("");
  EXPECT_NE(again.exit_code, 0);
  EXPECT_TRUE(contains(again.output, "the output folder " + dir.string() + " is not empty"))
    << again.output;
  EXPECT_TRUE(contains(again.output, "--force")) << again.output;
  EXPECT_EQ(fs::last_write_time(dir / "model.safetensors"), before); // untouched
  auto forced = make("--force");
  EXPECT_EQ(forced.exit_code, 0) << forced.output;
  // A file where the folder should be.
  auto file = test::scratch_dir("cli-force-file") / "model";
  std::ofstream(file) << "x";
  auto r = run_command(bin() + " make-model --preset tiny-mistral --out " + shell_quote(file.string()));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "exists and is not a folder")) << r.output;
}

TEST(cli, serve_refuses_a_max_model_len_beyond_the_models_context) {
  // With a tokenizer, so that the serve gets as far as the engine's checks.
  auto model = test::scratch_dir("cli-context") / "tiny-llama3";
  auto made = run_command(bin() + " make-model --preset tiny-llama3 --tokenizer "
                          + shell_quote(test::env("TESTDATA") + "/tokenizers/llama3") + " --out "
                          + shell_quote(model.string()));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const int context = json::parse(std::ifstream(model / "config.json"))["max_position_embeddings"];
  const int asked = context * 2;
  // `timeout`: a server that started anyway fails the test instead of hanging it.
  auto r = run_command("timeout 60 " + bin() + " serve --port 0 --model " + shell_quote(model.string())
                       + " --max-model-len " + std::to_string(asked));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.exit_code, 124) << "the server started: " << r.output;
  EXPECT_TRUE(contains(r.output, "model.max_model_len (--max-model-len) is " + std::to_string(asked)
                                   + " but the model's context is " + std::to_string(context)
                                   + " tokens"))
    << r.output;
  // The same key from --set.
  r = run_command("timeout 60 " + bin() + " serve --port 0 --model " + shell_quote(model.string())
                  + " --set model.max_model_len=" + std::to_string(context + 1));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "but the model's context is " + std::to_string(context))) << r.output;
}

TEST(cli, mistakes_give_one_clear_message_and_a_failing_exit_code) {
  auto model = test::tiny_model("tiny-llama3");
  struct mistake {
    std::string args;
    std::string message;
  };
  auto broken = test::scratch_dir("cli-broken");
  fs::copy_file(model / "config.json", broken / "config.json");
  {
    std::ifstream in(model / "model.safetensors", std::ios::binary);
    std::string head(fs::file_size(model / "model.safetensors") / 2, '\0');
    in.read(head.data(), long(head.size()));
    std::ofstream(broken / "model.safetensors", std::ios::binary) << head;
  }
  // A CUDA device this machine lacks (any, without a GPU).
  const std::string missing_gpu = "cuda:" + std::to_string(cuda_device_count());
  // A folder that does not exist yet, whatever else the machine holds.
  const std::string fresh_out = shell_quote((test::scratch_dir("cli-make-out") / "new").string());
  std::vector<mistake> cases = {
    {"generate --model /nonexistent --prompt-ids 1", "/nonexistent: not a directory"},
    {"generate --model " + shell_quote(broken.string()) + " --prompt-ids 1",
     "model.safetensors: model.embed_tokens.weight: truncated file"},
    {"generate --model " + shell_quote(model.string()) + " --prompt-ids 1,x", "--prompt-ids: 'x' is not an integer"},
    {"generate --model " + shell_quote(model.string()) + " --prompt-ids 999999999", "id 999999999 outside the model's vocabulary"},
    {"generate --model " + shell_quote(model.string()) + " --prompt-ids 1 --temperature 5", "temperature: must lie in [0, 2]"},
    {"generate --model " + shell_quote(model.string()) + " --prompt-ids 1 --kv-cache-dtype fp4", "--kv-cache-dtype: expected bf16, fp8 or fp8_e5m2, got 'fp4'"},
    {"generate --model " + shell_quote(model.string()) + " --prompt-ids 1 --kv-cache-dtype fp8", "--kv-cache-dtype fp8 needs --device cuda:N"},
    {"generate --model " + shell_quote(model.string()) + " --prompt-ids 1 --kv-cache-dtype fp8_e5m2", "--kv-cache-dtype fp8_e5m2: the CPU engine emulates it for `metronome eval-quality` only"},
    // fp8_e5m2 runs on CUDA: only the device itself is refused here.
    {"generate --model " + shell_quote(model.string()) + " --prompt-ids 1 --kv-cache-dtype fp8_e5m2 --device " + missing_gpu,
     "--device " + missing_gpu + ": " + cuda_device_problem(cuda_device_count())},
    {"generate --model " + shell_quote(model.string()) + " --prompt-ids 1 --device " + missing_gpu,
     "--device " + missing_gpu + ": " + cuda_device_problem(cuda_device_count())},
    {"make-model --preset nope --out " + fresh_out, "unknown preset 'nope' (presets: tiny-llama3"},
    {"make-model --out " + fresh_out, "give --preset NAME or --config FILE"},
  };
  for (const auto& c : cases) {
    auto r = run_command(bin() + " " + c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_TRUE(contains(r.output, c.message)) << c.args << "\n" << r.output;
    EXPECT_FALSE(contains(r.output, "terminate called")) << c.args;
  }
}

} // namespace
} // namespace metronome
