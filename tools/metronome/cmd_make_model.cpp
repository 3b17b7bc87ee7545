// metronome make-model: write a random-initialised Hugging Face model folder.

#include <cstdio>
#include <filesystem>
#include <memory>
#include <system_error>

#include "model/make_model.hpp"
#include "model/model_error.hpp"
#include "model/rtn_quantize.hpp"
#include "tools/metronome/command.hpp"

namespace metronome::cli {

namespace {

struct make_model_args {
  std::string preset;
  std::string config_file;
  std::string out;
  std::string tokenizer;
  uint64_t seed = 0;
  std::string dtype_name = "bf16";
  uint64_t max_shard_mb = 5000;
  std::string quantize;
  int32_t group_size = 128;
  bool force = false;
};

/// Refuses an output path that holds anything, unless `force`: a mistyped
/// --out must not overwrite a real model's files.
void check_output(const std::string& out, bool force) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(out, ec);
  if (!fs::exists(status))
    return;
  if (!fs::is_directory(status))
    throw command_error("make-model: --out " + out + " exists and is not a folder");
  if (fs::directory_iterator(out, ec) == fs::directory_iterator() && !ec)
    return; // empty
  if (!force)
    throw command_error("make-model: the output folder " + out
                        + " is not empty; pass --force to write into it anyway "
                          "(files of the same names are replaced)");
}

void run(const make_model_args& a) {
  check_output(a.out, a.force);
  make_model_options o;
  if (!a.config_file.empty()) {
    o.config = model_config::load(a.config_file);
  } else {
    auto cfg = preset_config(a.preset);
    if (!cfg) {
      std::string names;
      for (const auto& n : model_presets())
        names += (names.empty() ? "" : ", ") + n;
      throw command_error("unknown preset '" + a.preset + "' (presets: " + names + ")");
    }
    o.config = *cfg;
  }
  o.out_dir = a.out;
  if (!a.tokenizer.empty())
    o.tokenizer_dir = a.tokenizer;
  o.seed = a.seed;
  if (a.dtype_name == "bf16")
    o.weight_type = dtype::bf16;
  else if (a.dtype_name == "f16")
    o.weight_type = dtype::f16;
  else if (a.dtype_name == "f32")
    o.weight_type = dtype::f32;
  else
    throw command_error("--dtype: expected bf16, f16 or f32, got '" + a.dtype_name + "'");
  o.max_shard_bytes = a.max_shard_mb * 1000000ull;
  if (a.quantize == "awq")
    o.quantize = rtn_config(quant_method::awq, a.group_size);
  else if (a.quantize == "gptq")
    o.quantize = rtn_config(quant_method::gptq, a.group_size);
  else if (!a.quantize.empty())
    throw command_error("--quantize: expected awq or gptq, got '" + a.quantize + "'");
  if (a.group_size != 32 && a.group_size != 64 && a.group_size != 128 && a.group_size != -1)
    throw command_error("--group-size: expected 32, 64, 128 or -1 (per channel), got "
                        + std::to_string(a.group_size));
  make_model(o);
  std::printf("wrote %s (%s, seed %llu%s)\n", a.out.c_str(),
              a.config_file.empty() ? a.preset.c_str() : a.config_file.c_str(),
              static_cast<unsigned long long>(a.seed),
              o.quantize ? (", int4 " + o.quantize->describe()).c_str() : "");
}

void setup(CLI::App& app) {
  auto args = std::make_shared<make_model_args>();
  auto* cmd = app.add_subcommand("make-model", "Write a random-initialised model folder "
                                               "(Hugging Face layout) for tests and benchmarks");
  std::string presets;
  for (const auto& name : model_presets())
    presets += (presets.empty() ? "{" : ",") + name;
  auto* preset = cmd->add_option("--preset", args->preset, "Model shape")
                   ->type_name(presets + "}");
  cmd->add_option("--config", args->config_file, "A config.json to use instead of a preset")
    ->type_name("PATH")
    ->excludes(preset)
    ->check(CLI::ExistingFile.description(""));
  cmd->add_option("--out", args->out, "Output folder")->type_name("PATH")->required();
  cmd->add_option("--tokenizer", args->tokenizer,
                  "Folder whose tokenizer files are copied into the model")
    ->type_name("PATH")
    ->check(CLI::ExistingDirectory.description(""));
  cmd->add_option("--seed", args->seed, "Random seed (same seed, same bytes)");
  cmd->add_option("--dtype", args->dtype_name, "Weight type")->type_name("{bf16,f16,f32}");
  cmd->add_option("--max-shard-mb", args->max_shard_mb,
                  "Split weights into shards of at most this many MB (0: one file)");
  cmd->add_option("--quantize", args->quantize,
                  "Write the q/k/v/o/gate/up/down projections as int4 in this checkpoint "
                  "layout (round to nearest from the same random weights; embeddings, norms "
                  "and LM head stay --dtype)")
    ->type_name("{awq,gptq}");
  cmd->add_option("--group-size", args->group_size,
                  "With --quantize: input rows per group of scales (-1: per channel)")
    ->type_name("{32,64,128,-1}");
  cmd->add_flag("--force", args->force,
                "Write into an output folder that is not empty (refused otherwise)");
  cmd->callback([args, cmd, preset] {
    if (args->preset.empty() && args->config_file.empty())
      throw command_error("make-model: give --preset NAME or --config FILE");
    run(*args);
  });
}

const int registered = register_command(40, &setup);

} // namespace

} // namespace metronome::cli
