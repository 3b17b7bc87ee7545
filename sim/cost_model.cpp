#include "sim/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace metronome::sim {

cost_model cost_model::from_json(const nlohmann::json& doc, const std::string& source) {
  auto fail = [&](const std::string& field, const std::string& problem) {
    return std::runtime_error(source + ": " + field + ": " + problem);
  };
  if (!doc.is_object())
    throw fail("", "expected a JSON object");
  cost_model m;
  if (auto i = doc.find("name"); i != doc.end() && i->is_string())
    m.name = i->get<std::string>();
  if (auto i = doc.find("provisional"); i != doc.end()) {
    if (!i->is_boolean())
      throw fail("provisional", "expected true or false");
    m.provisional = i->get<bool>();
  }
  if (auto i = doc.find("note"); i != doc.end() && i->is_string())
    m.note = i->get<std::string>();
  auto step = doc.find("step_ms");
  if (step == doc.end() || !step->is_object())
    throw fail("step_ms", "missing (an object with base, per_decode_seq, per_kv_token, "
                          "per_prefill_token, per_prefill_attention_pair, per_mixed_kv_token, "
                          "per_prompt_step)");
  auto coef = [&](const char* key, double& out, bool required) {
    auto i = step->find(key);
    if (i == step->end()) {
      if (required)
        throw fail(std::string("step_ms.") + key, "missing");
      out = 0;
      return;
    }
    if (!i->is_number() || !std::isfinite(i->get<double>()) || i->get<double>() < 0)
      throw fail(std::string("step_ms.") + key, "expected a finite number >= 0, got " + i->dump());
    out = i->get<double>();
  };
  coef("base", m.step.base_ms, true);
  coef("per_decode_seq", m.step.per_decode_seq_ms, false);
  coef("per_kv_token", m.step.per_kv_token_ms, false);
  coef("per_prefill_token", m.step.per_prefill_token_ms, true);
  coef("per_prefill_attention_pair", m.step.per_prefill_attention_pair_ms, false);
  coef("per_mixed_kv_token", m.step.per_mixed_kv_token_ms, false);
  coef("per_prompt_step", m.step.per_prompt_step_ms, false);
  if (m.step.base_ms <= 0)
    throw fail("step_ms.base", "must be > 0 (a step that takes no time never ends)");
  auto count = [&](const char* key, auto& out) {
    auto i = doc.find(key);
    if (i == doc.end())
      return;
    if (!i->is_number_integer() || i->get<int64_t>() <= 0)
      throw fail(key, "expected a positive integer, got " + i->dump());
    out = static_cast<std::remove_reference_t<decltype(out)>>(i->get<int64_t>());
  };
  count("kv_cache_tokens", m.kv_cache_tokens);
  count("max_model_len", m.max_model_len);
  return m;
}

cost_model cost_model::load(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in)
    throw std::runtime_error(file.string() + ": cannot open the cost model");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(file.string() + ": malformed JSON: " + e.what());
  }
  return from_json(doc, file.string());
}

nlohmann::json cost_model::to_json() const {
  return {{"name", name},
          {"provisional", provisional},
          {"step_ms",
           {{"base", step.base_ms},
            {"per_decode_seq", step.per_decode_seq_ms},
            {"per_kv_token", step.per_kv_token_ms},
            {"per_prefill_token", step.per_prefill_token_ms},
            {"per_prefill_attention_pair", step.per_prefill_attention_pair_ms},
            {"per_mixed_kv_token", step.per_mixed_kv_token_ms},
            {"per_prompt_step", step.per_prompt_step_ms}}},
          {"kv_cache_tokens", kv_cache_tokens},
          {"max_model_len", max_model_len}};
}

unloaded_latency unloaded(const cost_model& m, int32_t prompt_tokens, int32_t output_tokens,
                          int32_t budget) {
  unloaded_latency out;
  double ms = 0;
  int64_t done = 0;
  while (done < prompt_tokens) {
    const int64_t n = std::min<int64_t>(budget, prompt_tokens - done);
    step_shape s;
    s.add_chunk(done, n, false);
    ms += m.step_ms(s);
    done += n;
  }
  out.ttft_s = ms / 1e3;
  for (int32_t i = 1; i < output_tokens; ++i) {
    step_shape s;
    s.add_chunk(done, 1, true);
    ms += m.step_ms(s);
    ++done;
  }
  out.e2e_s = ms / 1e3;
  return out;
}

} // namespace metronome::sim
