// The quality measurement of `metronome eval-quality` (model/quality_eval.hpp)
// on tiny random models: the baseline measured against itself gives KL 0
// and agreement 1, every precision differs from it, the baseline's
// perplexity is what separate prefills give, the batch changes nothing,
// held-out windows are cut as the reference script cuts them, and bad input
// is refused by name.

#include <cmath>
#include <fstream>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/cpu_engine.hpp"
#include "model/model_error.hpp"
#include "model/quality_eval.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

namespace fs = std::filesystem;
using test::contains;

std::vector<quality_variant> all_variants() {
  std::vector<quality_variant> out;
  for (const auto& name : quality_variant_names())
    out.push_back(*quality_variant_named(name));
  return out;
}

/// Windows of random ids (BOS-less: any ids do), of the given lengths.
std::vector<quality_window> random_windows(const std::vector<size_t>& lengths, int32_t vocab,
                                           uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<quality_window> out;
  for (size_t n : lengths) {
    quality_window w;
    w.source = "random";
    for (size_t i = 0; i < n; ++i)
      w.ids.push_back(int32_t(rng() % uint32_t(vocab)));
    out.push_back(std::move(w));
  }
  return out;
}

/// -sum log p(ids[k] | ids[:k]) over k >= 1, each prefix prefilled by a
/// fresh fp32 engine: the baseline's NLL by another path than the tool's
/// decoding.
double nll_by_prefills(const fs::path& dir, const std::vector<int32_t>& ids) {
  auto model = model_folder::open(dir);
  const int64_t vocab = model->config.vocab_size;
  double nll = 0;
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (size_t k = 1; k < ids.size(); ++k) {
    cpu_engine engine(model, 4, 16);
    std::vector<int32_t> pages = {0, 1, 2, 3};
    forward_input in{std::span<const int32_t>(ids).first(k), 0, pages};
    engine.forward(std::span(&in, 1), logits);
    double mx = logits[0], sum = 0;
    for (float v : logits)
      mx = std::max(mx, double(v));
    for (float v : logits)
      sum += std::exp(double(v) - mx);
    nll -= double(logits[size_t(ids[k])]) - mx - std::log(sum);
  }
  return nll;
}

// The issue's check of the measurement and of each precision, on the preset
// whose projections all take int4 group 128.
TEST(quality_eval, the_baseline_against_itself_is_exact_and_every_precision_differs) {
  const auto dir = test::tiny_model("tiny-llama3-g128");
  const int32_t vocab = model_folder::open(dir)->config.vocab_size;
  const auto windows = random_windows({24, 9, 17}, vocab, 5);
  const auto variants = all_variants();
  quality_options o;
  o.batch = 2; // two groups, the second of one window
  int64_t last_done = 0, calls = 0;
  o.progress = [&](int64_t done, int64_t total) {
    EXPECT_GT(done, last_done);
    EXPECT_EQ(total, 23 + 8 + 16);
    last_done = done;
    ++calls;
  };
  const auto rep = evaluate_quality(dir, variants, windows, o);
  EXPECT_EQ(last_done, 47);
  EXPECT_EQ(calls, 23 + 16); // one call a step of each group
  EXPECT_EQ(rep.windows, 3);
  EXPECT_EQ(rep.max_window, 24);
  const auto& base = rep.baseline;
  EXPECT_EQ(base.positions, 47);
  EXPECT_EQ(base.kv, "fp32");
  EXPECT_EQ(base.weights, "bf16");
  EXPECT_EQ(base.kl, 0.0);
  EXPECT_EQ(base.agree, base.positions);
  EXPECT_EQ(base.overflow.total(), 0);
  // The baseline's perplexity is what prefilling each prefix gives.
  double nll = 0;
  for (const auto& w : windows)
    nll += nll_by_prefills(dir, w.ids);
  EXPECT_NEAR(base.nll, nll, 1e-9 * nll);
  EXPECT_GT(base.perplexity(), 1000.0); // random weights, a 128k vocabulary

  ASSERT_EQ(rep.variants.size(), variants.size());
  // "baseline" as a variant: a second engine in lockstep, the same numbers.
  const auto& same = rep.variants[0];
  EXPECT_EQ(same.name, "baseline");
  EXPECT_EQ(same.kl, 0.0);
  EXPECT_EQ(same.kl_max, 0.0);
  EXPECT_EQ(same.agreement(), 1.0);
  EXPECT_EQ(same.nll, base.nll);
  EXPECT_EQ(same.correct, base.correct);
  for (size_t i = 1; i < rep.variants.size(); ++i) {
    const auto& v = rep.variants[i];
    SCOPED_TRACE(v.name);
    EXPECT_EQ(v.positions, base.positions);
    EXPECT_GT(v.kl, 0.0);
    EXPECT_GE(v.kl_max, v.kl_p99);
    EXPECT_GE(v.kl_max, v.mean_kl());
    EXPECT_NE(v.nll, base.nll);
    EXPECT_LE(v.agree, v.positions);
    EXPECT_EQ(v.overflow.total(), 0);
    EXPECT_EQ(v.windows_overflowed, 0);
  }
  EXPECT_EQ(rep.variants[1].weights, "int4 (RTN at load: awq, 4 bits, group 128; bf16 embeddings, "
                                     "norms and LM head)");
  EXPECT_TRUE(contains(rep.variants[2].weights, "RTN at load: gptq, 4 bits, group 128"))
    << rep.variants[2].weights;
  EXPECT_EQ(rep.variants[3].kv, "fp8");
  EXPECT_EQ(rep.variants[4].kv, "fp8_e5m2");

  // The batch changes nothing, to the last bit.
  o.batch = 1;
  o.progress = nullptr;
  const auto one = evaluate_quality(dir, variants, windows, o);
  for (size_t i = 0; i < rep.variants.size(); ++i) {
    EXPECT_EQ(one.variants[i].nll, rep.variants[i].nll) << i;
    EXPECT_EQ(one.variants[i].kl, rep.variants[i].kl) << i;
    EXPECT_EQ(one.variants[i].kl_p99, rep.variants[i].kl_p99) << i;
    EXPECT_EQ(one.variants[i].agree, rep.variants[i].agree) << i;
  }
}

TEST(quality_eval, refuses_windows_it_cannot_score) {
  const auto dir = test::tiny_model("tiny-llama3");
  const auto model = model_folder::open(dir);
  const auto variants = all_variants();
  auto message = [&](std::vector<quality_window> w, int32_t batch = 4) {
    try {
      quality_options o;
      o.batch = batch;
      evaluate_quality(dir, std::span(variants).first(1), w, o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("<accepted>");
  };
  EXPECT_EQ(message({}), "evaluate_quality: no windows to score");
  EXPECT_EQ(message({{"corpus.txt", {1, 2}}, {"corpus.txt", {3}}}),
            "evaluate_quality: window 1 (corpus.txt) has 1 ids (at least 2)");
  EXPECT_EQ(message({{"x", {1, model->config.vocab_size}}}),
            "evaluate_quality: window 0 (x): id 128256 outside the vocabulary (0..128255)");
  EXPECT_EQ(message({{"x", std::vector<int32_t>(4097, 1)}}),
            "evaluate_quality: window 0 (x) has 4097 ids, more than the model's context of 4096");
  EXPECT_EQ(message({{"x", {1, 2}}}, 0), "evaluate_quality: batch 0 (at least 1)");
  // int4 on a model whose projections do not fit group 128: the loader's
  // model_error, naming the tensor.
  const auto int4 = *quality_variant_named("int4-awq");
  EXPECT_TRUE(contains(test::error_of([&] {
                         std::vector<quality_window> w = {{"x", {1, 2}}};
                         evaluate_quality(dir, std::span(&int4, 1), w);
                       }),
                       "multiple of the group size 128"));
  EXPECT_FALSE(quality_variant_named("fp4"));
  EXPECT_FALSE(quality_variant_named("kv-e5m2"));
}

/// Writes `text` to a scratch file (in a folder of its own) and returns its path.
fs::path write_file(const std::string& name, const std::string& text) {
  const auto path = test::scratch_dir("quality-eval-" + name) / name;
  std::ofstream(path) << text;
  return path;
}

// Per corpus in the file's order (not sorted), paragraphs encoded without
// special tokens and each followed by EOS, cut into BOS + window - 1 ids.
TEST(quality_eval, held_out_windows_are_cut_as_the_reference_script_cuts_them) {
  const auto dir = test::served_model("tiny-llama3", "llama3");
  const auto tok = tokenizer::load(dir);
  const auto path = write_file("held_out.json", R"({
    "validation": {"zz": ["not read"]},
    "test": {"zz": ["Call me Ishmael.", "Some years ago, never mind how long."],
             "aa": ["In the beginning."]}})");
  const auto windows = held_out_windows(path, *tok, 6);
  const int32_t bos = *tok->bos_id(), eos = *tok->eos_id();
  std::vector<int32_t> zz, aa;
  for (const char* p : {"Call me Ishmael.", "Some years ago, never mind how long."}) {
    for (auto id : tok->encode(p, {.add_special_tokens = false}))
      zz.push_back(id);
    zz.push_back(eos);
  }
  for (auto id : tok->encode("In the beginning.", {.add_special_tokens = false}))
    aa.push_back(id);
  aa.push_back(eos);
  std::vector<int32_t> got_zz, got_aa;
  size_t zz_windows = 0;
  for (const auto& w : windows) {
    ASSERT_FALSE(w.ids.empty());
    EXPECT_EQ(w.ids[0], bos);
    EXPECT_LE(w.ids.size(), 6u);
    auto& into = w.source == "zz" ? got_zz : got_aa;
    into.insert(into.end(), w.ids.begin() + 1, w.ids.end());
    zz_windows += w.source == "zz";
  }
  EXPECT_EQ(got_zz, zz);
  EXPECT_EQ(got_aa, aa);
  EXPECT_EQ(zz_windows, (zz.size() + 4) / 5);
  EXPECT_EQ(windows.front().source, "zz"); // the file's order
  EXPECT_EQ(windows.back().source, "aa");
  for (size_t i = 0; i + 1 < zz_windows; ++i)
    EXPECT_EQ(windows[i].ids.size(), 6u); // only a corpus's last window is short

  const auto no_test = write_file("a.json", R"({"validation": {}})");
  EXPECT_EQ(test::error_of([&] { held_out_windows(no_test, *tok, 6); }),
            no_test.string()
              + ": test: missing, or not an object of corpus name -> list of paragraphs (the "
                "held_out.json of tools/default_model_held_out.py)");
  EXPECT_TRUE(contains(
    test::error_of([&] { held_out_windows(write_file("b.json", R"({"test": {"c": ["x", 3]}})"), *tok, 6); }),
    "b.json: test.c[1]: not a string"));
  EXPECT_TRUE(contains(
    test::error_of([&] { held_out_windows(write_file("c.json", R"({"test": {"c": "x"}})"), *tok, 6); }),
    "c.json: test.c: not a list of paragraphs"));
  EXPECT_TRUE(contains(test::error_of([&] { held_out_windows(write_file("d.json", "{"), *tok, 6); }),
                       "d.json: malformed JSON"));
  EXPECT_TRUE(contains(test::error_of([&] { held_out_windows("/nonexistent/held.json", *tok, 6); }),
                       "/nonexistent/held.json: cannot read"));
  EXPECT_THROW(held_out_windows(path, *tok, 1), std::invalid_argument);
}

// The command as a user runs it, on a tiny random model for a few tokens.
TEST(quality_eval, the_command_reports_zero_kl_for_the_baseline_and_a_cost_for_each_precision) {
  const auto dir = test::served_model("tiny-llama3-g128", "llama3");
  const auto held = write_file("cli_held_out.json", R"({"test": {"t.txt": [
    "It was the best of times, it was the worst of times.",
    "It was the age of wisdom, it was the age of foolishness."]}})");
  const std::string bin = test::shell_quote(test::env("BIN"));
  const std::string common = bin + " eval-quality --model " + test::shell_quote(dir.string())
                             + " --held-out " + test::shell_quote(held.string());
  auto r = test::run_command(common + " --window 8 --max-windows 2 --variants "
                                      "baseline,int4-awq,kv-fp8_e5m2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // stdout's JSON object, without stderr's progress line (run_command merges them).
  const size_t open = r.output.find("{\n"), close = r.output.rfind("\n}");
  ASSERT_NE(open, std::string::npos) << r.output;
  ASSERT_NE(close, std::string::npos) << r.output;
  EXPECT_TRUE(contains(r.output, "eval-quality: 14 / 14 positions")) << r.output;
  const auto j = nlohmann::json::parse(r.output.substr(open, close + 2 - open));
  EXPECT_EQ(j["windows"], 2);
  EXPECT_EQ(j["baseline"]["positions"], 14);
  ASSERT_EQ(j["variants"].size(), 3u);
  EXPECT_EQ(j["variants"][0]["name"], "baseline");
  EXPECT_EQ(j["variants"][0]["mean_kl"].get<double>(), 0.0);
  EXPECT_EQ(j["variants"][0]["top1_agreement"].get<double>(), 1.0);
  EXPECT_EQ(j["variants"][0]["perplexity"], j["baseline"]["perplexity"]);
  for (int i : {1, 2}) {
    EXPECT_GT(j["variants"][i]["mean_kl"].get<double>(), 0.0) << j["variants"][i]["name"];
    EXPECT_NE(j["variants"][i]["perplexity"], j["baseline"]["perplexity"]);
  }
  EXPECT_EQ(j["variants"][2]["kv_saturated"], 0);
  // The table form names every variant.
  r = test::run_command(common + " --window 8 --max-windows 1 --variants kv-fp8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "| baseline | bf16 | fp32 |")) << r.output;
  EXPECT_TRUE(contains(r.output, "| kv-fp8 | bf16 | fp8 |")) << r.output;
  // Mistakes, each with one message.
  r = test::run_command(common + " --variants kv-fp8,fp4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--variants: unknown variant 'fp4' (known: baseline, int4-awq, "
                                 "int4-gptq, kv-fp8, kv-fp8_e5m2)"))
    << r.output;
  r = test::run_command(common + " --window 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--window: at least 2 tokens, got 1")) << r.output;
}

} // namespace
} // namespace metronome
