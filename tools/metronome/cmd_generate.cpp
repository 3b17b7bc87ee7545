// metronome generate: one prompt through the engine, printed as it is made.

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gpu/cuda_runner.hpp"
#include "model/model_runner.hpp"
#include "model/model_weights.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "tools/metronome/command.hpp"
#include "tools/metronome/default_model.hpp"

namespace metronome::cli {

namespace {

struct generate_args {
  std::string model;
  std::string prompt_ids;
  std::optional<std::string> prompt;
  std::string device = "cpu";
  std::string kv_cache_dtype = "bf16";
  std::string quantize = "none";
  int32_t max_tokens = 32;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  std::optional<uint64_t> seed;
  bool ignore_eos = false;
  bool json = false;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    long value = 0;
    try {
      value = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < item.size() && std::isspace(static_cast<unsigned char>(item[used])))
      ++used;
    if (used != item.size() || item.empty())
      throw command_error("--prompt-ids: '" + item + "' is not an integer");
    ids.push_back(static_cast<int32_t>(value));
  }
  if (ids.empty())
    throw command_error("--prompt-ids: no ids given");
  return ids;
}

void run(const generate_args& a) {
  if (a.device != "cpu") {
    const int ordinal = parse_cuda_device(a.device);
    if (ordinal < 0)
      throw command_error("--device: expected cpu or cuda:N, got '" + a.device + "'");
  }
  if (a.prompt.has_value() == !a.prompt_ids.empty())
    throw command_error("give exactly one of --prompt and --prompt-ids");
  const auto kv_dtype = parse_kv_cache_dtype(a.kv_cache_dtype);
  if (!kv_dtype)
    throw command_error("--kv-cache-dtype: expected bf16, fp8 or fp8_e5m2, got '"
                        + a.kv_cache_dtype + "'");
  if (*kv_dtype == kv_cache_dtype_kind::fp8 && a.device == "cpu")
    throw command_error("--kv-cache-dtype fp8 needs --device cuda:N (the CPU engine keeps its "
                        "KV cache in fp32)");
  if (*kv_dtype == kv_cache_dtype_kind::fp8_e5m2 && a.device == "cpu")
    throw command_error("--kv-cache-dtype fp8_e5m2: the CPU engine emulates it for `metronome "
                        "eval-quality` only (its KV cache is fp32)");
  const std::filesystem::path model_dir = a.model.empty() ? default_model_dir()
                                                          : std::filesystem::path(a.model);
  const auto quantize = parse_weight_quantization(a.quantize);
  if (!quantize)
    throw command_error("--quantize: expected none or int4, got '" + a.quantize + "'");
  auto model = model_folder::open(model_dir, {*quantize});
  const auto& cfg = model->config;
  if (a.device != "cpu") {
    if (const std::string p = cuda_device_problem(parse_cuda_device(a.device)); !p.empty())
      throw command_error("--device " + a.device + ": " + p);
  }
  // The model folder's tokenizer: required for --prompt, used for printing
  // text whenever the folder has one.
  std::shared_ptr<const tokenizer> tok;
  if (a.prompt || std::filesystem::exists(model->dir / "tokenizer.json"))
    tok = tokenizer::load(model->dir);
  std::vector<int32_t> prompt;
  if (a.prompt) {
    prompt = tok->encode(*a.prompt);
    if (prompt.empty())
      throw command_error("--prompt: the text encodes to no tokens");
  } else {
    prompt = parse_ids(a.prompt_ids);
  }
  for (auto id : prompt)
    if (id < 0 || id >= cfg.vocab_size)
      throw command_error(std::string(a.prompt ? "--prompt" : "--prompt-ids") + ": id "
                          + std::to_string(id) + " outside the model's vocabulary (0.."
                          + std::to_string(cfg.vocab_size - 1) + ")");
  sampling_params params;
  params.temperature = a.temperature;
  params.top_p = a.top_p;
  params.top_k = a.top_k;
  params.min_p = a.min_p;
  params.seed = a.seed;
  params.max_tokens = a.max_tokens;
  params.ignore_eos = a.ignore_eos;
  if (auto problem = params.validate(); !problem.empty())
    throw command_error(problem);

  // One sequence, with a KV cache of just the pages it needs.
  engine_limits limits;
  limits.max_batch_size = 1;
  const int32_t page_size = limits.page_size;
  const int32_t total = int32_t(prompt.size()) + a.max_tokens;
  const int32_t pages = (total + page_size - 1) / page_size;
  limits.kv_cache_tokens = int64_t(pages) * page_size;
  limits.max_model_len = total;
  std::unique_ptr<model_runner> runner;
  if (a.device == "cpu") {
    runner = make_cpu_runner(model, limits);
  } else {
    cuda_runner_options g;
    g.device = parse_cuda_device(a.device);
    g.limits = limits;
    g.max_seqs = 1;
    g.kv_cache_dtype = *kv_dtype;
    runner = make_cuda_runner(model, g);
    if (runner->num_pages() < pages)
      throw command_error("--device " + a.device + ": the KV cache holds "
                          + std::to_string(runner->num_pages()) + " pages, "
                          + std::to_string(pages) + " needed");
  }

  step_plan plan;
  plan.added.push_back({1, prompt, params, params.seed.value_or(fresh_seed())});
  scheduled_chunk first{1, int32_t(prompt.size()), {}};
  for (int32_t p = 0; p < pages; ++p)
    first.new_pages.push_back(p);
  plan.chunks.push_back(first);

  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  double ttft = 0;
  std::vector<int32_t> out;
  std::string text;
  std::optional<incremental_decoder> stream;
  if (tok)
    stream.emplace(tok);
  std::string finish = "length";
  for (uint64_t step = 0; int32_t(out.size()) < a.max_tokens; ++step) {
    plan.step = step;
    auto result = runner->execute(plan);
    if (step == 0)
      ttft = std::chrono::duration<double>(clock::now() - start).count();
    const int32_t token = result.tokens.at(0).token;
    bool stop = std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token)
                != params.stop_token_ids.end();
    if (!a.ignore_eos)
      stop = stop
             || std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), token)
                  != cfg.eos_token_ids.end();
    if (stop) {
      finish = "stop";
      break;
    }
    out.push_back(token);
    if (stream) {
      const auto piece = stream->push(token);
      text += piece;
      if (!a.json && !piece.empty()) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }
    } else if (!a.json) {
      std::printf("%s%d", out.size() == 1 ? "" : " ", token);
      std::fflush(stdout);
    }
    plan = step_plan{};
    plan.chunks.push_back({1, 1, {}});
  }
  if (stream) {
    const auto rest = stream->finish();
    text += rest;
    if (!a.json)
      std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  const double total_s = std::chrono::duration<double>(clock::now() - start).count();
  const double decode_s = total_s - ttft;
  const double tps = out.size() > 1 && decode_s > 0 ? double(out.size() - 1) / decode_s : 0.0;
  if (a.json) {
    nlohmann::json j = {{"model", model_dir.string()},
                        {"device", runner->device()},
                        {"weights", model->weights_description()},
                        {"prompt_tokens", prompt.size()},
                        {"ids", out},
                        {"finish_reason", finish},
                        {"ttft_ms", ttft * 1e3},
                        {"total_ms", total_s * 1e3},
                        {"tokens_per_s", tps}};
    if (tok)
      j["text"] = text;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
    std::fprintf(stderr, "[%zu tokens, finish %s, TTFT %.1f ms, %.1f tokens/s%s]\n", out.size(),
                 finish.c_str(), ttft * 1e3, tps,
                 model->weights.quantized
                   ? ("; weights " + model->weights_description()).c_str()
                   : "");
  }
}

void setup(CLI::App& app) {
  auto a = std::make_shared<generate_args>();
  auto* cmd = app.add_subcommand("generate", "Generate a continuation of one prompt");
  cmd->add_option("--model", a->model,
                  "Hugging Face model folder (unset: the default model, metronome-tiny)")
    ->type_name("PATH");
  cmd->add_option("--prompt", a->prompt,
                  "Prompt text, encoded with the model folder's tokenizer");
  cmd->add_option("--prompt-ids", a->prompt_ids, "Prompt as comma-separated token ids")
    ->type_name("ID,...");
  cmd->add_option("-n,--max-tokens", a->max_tokens, "Most tokens to generate (1 to 1048576)")
    ->check(CLI::Range(1, 1 << 20).description(""));
  cmd->add_option("--temperature", a->temperature, "Sampling temperature; 0 = greedy");
  cmd->add_option("--top-p", a->top_p, "Nucleus sampling mass");
  cmd->add_option("--top-k", a->top_k, "Keep the k most likely tokens (0 = all)");
  cmd->add_option("--min-p", a->min_p, "Drop tokens below min-p times the best");
  cmd->add_option("--seed", a->seed, "Random seed (same seed, same output)");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at the model's EOS tokens");
  cmd->add_option("--device", a->device, "Where the model runs")->type_name("cpu|cuda:N");
  cmd->add_option("--kv-cache-dtype", a->kv_cache_dtype,
                  "KV cache elements on cuda (fp8: e4m3, a scale a row)")
    ->type_name("{bf16,fp8}");
  cmd->add_option("--quantize", a->quantize,
                  "int4: quantize a float model's projections at load (round to nearest, AWQ "
                  "layout, group 128; embeddings and LM head stay float)")
    ->type_name("{none,int4}");
  cmd->add_flag("--json", a->json, "Print ids, TTFT and tokens/s as JSON");
  cmd->callback([a] { run(*a); });
}

const int registered = register_command(20, &setup);

} // namespace

} // namespace metronome::cli
