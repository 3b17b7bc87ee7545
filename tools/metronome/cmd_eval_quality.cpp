// metronome eval-quality: what each precision (int4 weights, fp8 and
// fp8_e5m2 KV caches) costs a model on held-out text, measured with the CPU
// reference engine against the model as stored (model/quality_eval.hpp;
// docs/quantization.md, "Quality, measured").

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/parallel.hpp"
#include "model/quality_eval.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "tools/metronome/command.hpp"
#include "tools/metronome/default_model.hpp"

namespace metronome::cli {

namespace {

struct eval_quality_args {
  std::string model;
  std::string held_out;
  int32_t window = 1024;
  int32_t max_windows = 0;
  std::string variants = "int4-awq,int4-gptq,kv-fp8,kv-fp8_e5m2";
  int32_t batch = 16;
  bool json = false;
  std::string json_out;
};

std::vector<quality_variant> parse_variants(const std::string& list) {
  std::vector<quality_variant> out;
  std::string item;
  std::istringstream in(list);
  while (std::getline(in, item, ',')) {
    auto v = quality_variant_named(item);
    if (!v) {
      std::string known;
      for (const auto& n : quality_variant_names())
        known += (known.empty() ? "" : ", ") + n;
      throw command_error("--variants: unknown variant '" + item + "' (known: " + known + ")");
    }
    out.push_back(*v);
  }
  if (out.empty())
    throw command_error("--variants: name at least one variant");
  return out;
}

nlohmann::json to_json(const quality_result& r) {
  return {{"name", r.name},
          {"weights", r.weights},
          {"kv_cache", r.kv},
          {"positions", r.positions},
          {"perplexity", r.perplexity()},
          {"mean_kl", r.mean_kl()},
          {"kl_p99", r.kl_p99},
          {"kl_max", r.kl_max},
          {"top1_agreement", r.agreement()},
          {"top1_accuracy", r.accuracy()},
          {"kv_saturated", r.overflow.saturated},
          {"kv_non_finite", r.overflow.non_finite},
          {"windows_overflowed", r.windows_overflowed}};
}

void print_table(const quality_report& rep, const std::string& model) {
  std::printf("model %s: %lld windows of up to %d tokens, %lld positions, %d threads, %.0f s\n\n",
              model.c_str(), static_cast<long long>(rep.windows), rep.max_window,
              static_cast<long long>(rep.baseline.positions), parallel_threads(), rep.seconds);
  std::printf("| variant | weights | KV cache | perplexity | mean KL (nats) | p99 KL | max KL "
              "| top-1 same as baseline | top-1 = next token | KV values saturated / not "
              "finite |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  auto g = [](double v) { // KL values span decades: 3 significant digits
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", v);
    return std::string(buf);
  };
  auto row = [&g](const quality_result& r, bool is_baseline) {
    const std::string kl = is_baseline ? "-" : g(r.mean_kl());
    const std::string p99 = is_baseline ? "-" : g(r.kl_p99);
    const std::string max = is_baseline ? "-" : g(r.kl_max);
    const std::string overflow = r.kv == "fp8_e5m2" ? std::to_string(r.overflow.saturated) + " / "
                                                        + std::to_string(r.overflow.non_finite)
                                                    : "-";
    std::printf("| %s | %s | %s | %.3f | %s | %s | %s | %.2f%% | %.2f%% | %s |\n",
                r.name.c_str(), r.weights.c_str(), r.kv.c_str(), r.perplexity(), kl.c_str(),
                p99.c_str(), max.c_str(), 100 * r.agreement(), 100 * r.accuracy(),
                overflow.c_str());
  };
  row(rep.baseline, true);
  for (const auto& v : rep.variants)
    row(v, false);
}

void run(const eval_quality_args& a) {
  if (a.window < 2)
    throw command_error("--window: at least 2 tokens, got " + std::to_string(a.window));
  if (a.max_windows < 0)
    throw command_error("--max-windows: 0 (all) or more, got " + std::to_string(a.max_windows));
  if (a.batch < 1)
    throw command_error("--batch: at least 1, got " + std::to_string(a.batch));
  const auto variants = parse_variants(a.variants);
  const std::filesystem::path model_dir = a.model.empty() ? default_model_dir()
                                                          : std::filesystem::path(a.model);
  auto tok = tokenizer::load(model_dir);
  auto windows = held_out_windows(a.held_out, *tok, a.window);
  if (a.max_windows > 0 && windows.size() > size_t(a.max_windows))
    windows.resize(size_t(a.max_windows));
  if (windows.empty())
    throw command_error("--held-out " + a.held_out + ": no test paragraphs to score");
  quality_options o;
  o.batch = a.batch;
  auto last = std::chrono::steady_clock::now();
  o.progress = [&last](int64_t done, int64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last < std::chrono::seconds(15) && done < total)
      return;
    last = now;
    std::fprintf(stderr, "eval-quality: %lld / %lld positions\n", static_cast<long long>(done),
                 static_cast<long long>(total));
  };
  // Refuse an unwritable --json-out now, not after the run.
  std::ofstream json_out;
  if (!a.json_out.empty()) {
    json_out.open(a.json_out);
    if (!json_out)
      throw command_error("--json-out: cannot write '" + a.json_out + "'");
  }
  const auto rep = evaluate_quality(model_dir, variants, windows, o);
  nlohmann::json j = {{"model", model_dir.string()},
                      {"held_out", a.held_out},
                      {"window", a.window},
                      {"windows", rep.windows},
                      {"max_window", rep.max_window},
                      {"threads", parallel_threads()},
                      {"seconds", rep.seconds},
                      {"baseline", to_json(rep.baseline)},
                      {"variants", nlohmann::json::array()}};
  for (const auto& v : rep.variants)
    j["variants"].push_back(to_json(v));
  if (a.json)
    std::printf("%s\n", j.dump(2).c_str());
  else
    print_table(rep, model_dir.string());
  if (json_out.is_open())
    json_out << j.dump(2) << "\n";
}

void setup(CLI::App& app) {
  auto a = std::make_shared<eval_quality_args>();
  auto* cmd = app.add_subcommand(
    "eval-quality",
    "Held-out perplexity, KL to the stored model and top-1 agreement of int4 weights and fp8 "
    "KV caches, on the CPU engine");
  cmd->add_option("--model", a->model, "Model folder (default: the default model)")
    ->type_name("DIR");
  cmd->add_option("--held-out", a->held_out,
                  "held_out.json with the test paragraphs (tools/default_model_held_out.py)")
    ->type_name("FILE")
    ->required();
  cmd->add_option("--window", a->window, "Tokens a window, BOS included (teacher-forced)");
  cmd->add_option("--max-windows", a->max_windows, "Score only the first N windows (0 = all)");
  cmd->add_option("--variants", a->variants,
                  "Comma-separated: baseline, int4-awq, int4-gptq, kv-fp8, kv-fp8_e5m2");
  cmd->add_option("--batch", a->batch, "Windows decoded together");
  cmd->add_flag("--json", a->json, "Print the report as JSON instead of a table");
  cmd->add_option("--json-out", a->json_out, "Also write the report as JSON to FILE")
    ->type_name("FILE");
  cmd->callback([a] { run(*a); });
}

const int registered = register_command(45, &setup);

} // namespace

} // namespace metronome::cli
