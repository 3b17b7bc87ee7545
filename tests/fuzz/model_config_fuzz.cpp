// libFuzzer target: the config.json reader (model_config::from_json after the
// JSON parse that model_config::load does). Properties: a bad document is a
// model_error and nothing else; an accepted config is consistent (one
// sliding flag per layer, heads that divide, an even head_dim), and what
// to_json() writes of it is accepted again.

#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "model/model_config.hpp"
#include "model/model_error.hpp"
#include "tests/fuzz/fuzz_check.hpp"

using namespace metronome;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto doc = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded())
    return 0; // load() reports this as "malformed JSON"
  model_config cfg;
  try {
    cfg = model_config::from_json(doc, "config.json");
  } catch (const model_error&) {
    return 0;
  }
  FUZZ_CHECK(cfg.layer_sliding.size() == size_t(cfg.num_layers), "one sliding flag per layer");
  FUZZ_CHECK(cfg.num_kv_heads > 0 && cfg.num_heads % cfg.num_kv_heads == 0, "kv heads");
  FUZZ_CHECK(cfg.head_dim > 0 && cfg.head_dim % 2 == 0, "head_dim");
  for (auto id : cfg.eos_token_ids)
    FUZZ_CHECK(id >= 0 && id < cfg.vocab_size, "eos id outside the vocabulary");
  if (cfg.num_layers > 4096)
    return 0; // to_json walks the layers
  try {
    (void)model_config::from_json(cfg.to_json(), "written");
  } catch (const model_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    FUZZ_CHECK(false, "to_json() wrote a config from_json() refuses");
  }
  return 0;
}
