// config.json parsing: the fields of the three families, and errors that
// name the field.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/make_model.hpp"
#include "model/model_config.hpp"
#include "model/model_error.hpp"

namespace metronome {
namespace {

using nlohmann::json;

json llama() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": false,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "torch_dtype": "bfloat16"})");
}

/// The field named by the model_error that parsing `doc` throws.
std::string failing_field(const json& doc) {
  try {
    model_config::from_json(doc, "config.json");
  } catch (const model_error& e) {
    EXPECT_EQ(e.file(), "config.json");
    EXPECT_NE(std::string(e.what()).find(e.field()), std::string::npos);
    return e.field();
  }
  ADD_FAILURE() << "no error for " << doc.dump();
  return {};
}

TEST(model_config, reads_llama_3_1_8b) {
  auto c = model_config::from_json(llama(), "config.json");
  EXPECT_EQ(c.arch, model_arch::llama);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.gqa_group(), 4);
  EXPECT_EQ(c.kv_size(), 1024);
  ASSERT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_FALSE(c.sliding_window);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.declared_dtype, dtype::bf16);
}

TEST(model_config, reads_qwen2_bias_and_partial_sliding_window) {
  auto doc = llama();
  doc["architectures"] = {"Qwen2ForCausalLM"};
  doc.erase("rope_scaling");
  doc["use_sliding_window"] = true;
  doc["sliding_window"] = 4096;
  doc["max_window_layers"] = 28;
  auto c = model_config::from_json(doc, "config.json");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_FALSE(c.is_sliding(27));
  EXPECT_TRUE(c.is_sliding(28));
  doc["use_sliding_window"] = false;
  EXPECT_FALSE(model_config::from_json(doc, "config.json").sliding_window);
}

TEST(model_config, reads_mistral_window_and_explicit_head_dim) {
  auto doc = llama();
  doc["architectures"] = {"MistralForCausalLM"};
  doc.erase("rope_scaling");
  doc["sliding_window"] = 4096;
  doc["head_dim"] = 96;
  auto c = model_config::from_json(doc, "config.json");
  EXPECT_EQ(c.head_dim, 96);
  EXPECT_TRUE(c.is_sliding(0));
  EXPECT_TRUE(c.is_sliding(31));
  doc["sliding_window"] = nullptr;
  EXPECT_FALSE(model_config::from_json(doc, "config.json").sliding_window);
}

TEST(model_config, reads_transformers_5_rope_parameters) {
  auto doc = llama();
  doc.erase("rope_scaling");
  doc.erase("rope_theta");
  doc["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 250000.0}, {"factor", 32.0},
                            {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                            {"original_max_position_embeddings", 8192}};
  auto c = model_config::from_json(doc, "config.json");
  EXPECT_EQ(c.rope_theta, 250000.0);
  ASSERT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling->factor, 32.0);
}

TEST(model_config, errors_name_the_field) {
  auto doc = llama();
  doc["architectures"] = {"GPT2LMHeadModel"};
  EXPECT_EQ(failing_field(doc), "architectures[0]");
  doc = llama();
  doc.erase("hidden_size");
  EXPECT_EQ(failing_field(doc), "hidden_size");
  doc = llama();
  doc["num_hidden_layers"] = "32";
  EXPECT_EQ(failing_field(doc), "num_hidden_layers");
  doc = llama();
  doc["num_key_value_heads"] = 5;
  EXPECT_EQ(failing_field(doc), "num_key_value_heads");
  doc = llama();
  doc["rope_scaling"]["rope_type"] = "yarn";
  EXPECT_EQ(failing_field(doc), "rope_scaling.rope_type");
  doc = llama();
  doc["rope_scaling"].erase("factor");
  EXPECT_EQ(failing_field(doc), "rope_scaling.factor");
  doc = llama();
  doc["hidden_act"] = "gelu";
  EXPECT_EQ(failing_field(doc), "hidden_act");
  doc = llama();
  doc["torch_dtype"] = "int8";
  EXPECT_EQ(failing_field(doc), "torch_dtype");
  doc = llama();
  doc["eos_token_id"] = 999999;
  EXPECT_EQ(failing_field(doc), "eos_token_id");
  doc = llama();
  doc["rms_norm_eps"] = -1;
  EXPECT_EQ(failing_field(doc), "rms_norm_eps");
}

// Found by tests/fuzz/model_config_fuzz.cpp: an integral double beyond
// int64_t was converted anyway (undefined behaviour; on x86 it read as
// INT64_MIN).
TEST(model_config, integral_doubles_out_of_range_are_refused) {
  auto doc = llama();
  doc["vocab_size"] = 1e300;
  try {
    model_config::from_json(doc, "config.json");
    ADD_FAILURE() << "accepted vocab_size 1e300";
  } catch (const model_error& e) {
    EXPECT_EQ(e.field(), "vocab_size");
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
  }
  doc["vocab_size"] = 128256.0; // in range: still read
  EXPECT_EQ(model_config::from_json(doc, "config.json").vocab_size, 128256);
}

// A negative max_window_layers indexed the per-layer flags out of bounds.
TEST(model_config, negative_max_window_layers_is_refused) {
  auto doc = llama();
  doc["architectures"] = {"Qwen2ForCausalLM"};
  doc.erase("rope_scaling");
  doc["use_sliding_window"] = true;
  doc["sliding_window"] = 4096;
  doc["max_window_layers"] = -3;
  EXPECT_EQ(failing_field(doc), "max_window_layers");
  doc["max_window_layers"] = 1000; // past the last layer: none slides
  auto c = model_config::from_json(doc, "config.json");
  for (int32_t i = 0; i < c.num_layers; ++i)
    EXPECT_FALSE(c.is_sliding(i));
}

// Token ids wider than 32 bits wrapped to another id (2^32 + 2 read as 2).
TEST(model_config, token_ids_beyond_32_bits_are_refused) {
  auto doc = llama();
  doc["eos_token_id"] = 4294967298LL;
  EXPECT_EQ(failing_field(doc), "eos_token_id");
  doc = llama();
  doc["bos_token_id"] = -4294967296LL;
  EXPECT_EQ(failing_field(doc), "bos_token_id");
}

TEST(model_config, presets_round_trip_through_config_json) {
  for (const auto& name : model_presets()) {
    auto c = *preset_config(name);
    auto back = model_config::from_json(c.to_json(), name);
    EXPECT_EQ(back.to_json(), c.to_json()) << name;
    EXPECT_EQ(back.layer_sliding, c.layer_sliding) << name;
  }
}

TEST(model_config, llama3_scaling_leaves_high_frequencies_and_divides_low_ones) {
  auto c = model_config::from_json(llama(), "config.json");
  auto scaled = rope_inv_freq(c);
  c.rope_scaling.reset();
  auto plain = rope_inv_freq(c);
  ASSERT_EQ(scaled.size(), 64u);
  EXPECT_EQ(scaled[0], plain[0]);                       // wavelength 6 < 2048: unchanged
  EXPECT_FLOAT_EQ(scaled[63], plain[63] / 8.0f);        // wavelength > 8192: divided
  for (size_t i = 0; i < 64; ++i)                       // never faster, never < 1/8
    EXPECT_TRUE(scaled[i] <= plain[i] && scaled[i] >= plain[i] / 8.0f * 0.999999f) << i;
}

} // namespace
} // namespace metronome
