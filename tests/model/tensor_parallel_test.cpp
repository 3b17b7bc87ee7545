// The shard plan of tensor parallelism (model/tensor_parallel.hpp): every
// refusal names its config field, and the ranks' ranges cover every
// dimension exactly once (kv heads under replication: exactly N / kv_heads
// times, and always the ones the rank's query heads use).

#include <cstring>

#include <gtest/gtest.h>

#include "model/make_model.hpp"
#include "model/model_error.hpp"
#include "model/tensor_parallel.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

constexpr projection all_projections[] = {projection::q,    projection::k,  projection::v,
                                          projection::o,    projection::gate, projection::up,
                                          projection::down};

/// A llama-shaped config for refusals no preset shows.
model_config shape(int32_t heads, int32_t kv_heads, int32_t inter, int32_t head_dim = 16) {
  model_config c = *preset_config("tiny-llama3");
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.hidden_size = heads * head_dim;
  c.intermediate_size = inter;
  return c;
}

std::string refusal(const model_config& cfg, int32_t n) {
  return test::error_of([&] { tensor_parallel_plan(cfg, n); });
}

/// out_features and in_features of `p`'s weight.
std::pair<int64_t, int64_t> weight_shape(const model_config& c, projection p) {
  const int64_t h = c.hidden_size;
  switch (p) {
    case projection::q: return {c.q_size(), h};
    case projection::k:
    case projection::v: return {c.kv_size(), h};
    case projection::o: return {h, c.q_size()};
    case projection::gate:
    case projection::up: return {c.intermediate_size, h};
    case projection::down: return {h, c.intermediate_size};
  }
  return {0, 0};
}

TEST(tensor_parallel_plan_test, refusals_name_the_field) {
  EXPECT_EQ(refusal(shape(32, 8, 14336), 0), "--tensor-parallel: must be at least 1 (got 0)");
  EXPECT_EQ(refusal(shape(32, 8, 14336), -2), "--tensor-parallel: must be at least 1 (got -2)");
  EXPECT_EQ(refusal(shape(32, 8, 14336), 3),
            "config.json: num_attention_heads: 32 is not divisible by --tensor-parallel 3");
  // 4 kv heads over 6 ranks: neither split evenly nor replicated evenly.
  EXPECT_EQ(refusal(shape(24, 4, 240), 6),
            "config.json: num_key_value_heads: 4 is neither divisible by --tensor-parallel 6 "
            "nor a divisor of it");
  EXPECT_EQ(refusal(shape(32, 8, 100), 8),
            "config.json: intermediate_size: 100 is not divisible by --tensor-parallel 8");
  // The file named is the caller's.
  EXPECT_EQ(test::error_of([] { tensor_parallel_plan(shape(32, 8, 14336), 3, "/m/config.json"); }),
            "/m/config.json: num_attention_heads: 32 is not divisible by --tensor-parallel 3");
}

TEST(tensor_parallel_plan_test, quantized_refusals_name_the_field) {
  quantization_config q;
  q.method = quant_method::awq;
  q.group_size = 128;
  // tiny-llama3-g128: o_proj's inputs (128) split in two are half a group.
  model_config g128 = *preset_config("tiny-llama3-g128");
  g128.quantization = q;
  EXPECT_EQ(refusal(g128, 2),
            "config.json: quantization_config.group_size: 128 does not divide the per-rank "
            "inputs of o_proj (64) and down_proj (192) with --tensor-parallel 2");
  EXPECT_NO_THROW(tensor_parallel_plan(g128, 1));
  // The 8B shape splits into whole groups over 8 ranks.
  model_config big = *preset_config("llama3-8b");
  big.quantization = q;
  EXPECT_NO_THROW(tensor_parallel_plan(big, 8));

  q.group_size = -1; // per channel: only the packing matters
  model_config narrow = shape(4, 2, 64, 4);
  narrow.quantization = q;
  EXPECT_EQ(refusal(narrow, 2),
            "config.json: head_dim: 4 gives per-rank q/k/v slices that are not whole words of "
            "8 4-bit values with --tensor-parallel 2");
  model_config odd = shape(4, 2, 48);
  odd.quantization = q;
  EXPECT_EQ(refusal(odd, 4),
            "config.json: intermediate_size: 48 gives per-rank slices of 12, not whole words "
            "of 8 4-bit values, with --tensor-parallel 4");

  q.desc_act = true;
  big.quantization = q;
  EXPECT_EQ(refusal(big, 2), "config.json: quantization_config.desc_act: act-order (g_idx) "
                             "weights are not split by --tensor-parallel 2 yet");
}

TEST(tensor_parallel_plan_test, splits_and_all_reduces) {
  EXPECT_EQ(split_of(projection::q), split_kind::column_parallel);
  EXPECT_EQ(split_of(projection::k), split_kind::column_parallel);
  EXPECT_EQ(split_of(projection::v), split_kind::column_parallel);
  EXPECT_EQ(split_of(projection::gate), split_kind::column_parallel);
  EXPECT_EQ(split_of(projection::up), split_kind::column_parallel);
  EXPECT_EQ(split_of(projection::o), split_kind::row_parallel);
  EXPECT_EQ(split_of(projection::down), split_kind::row_parallel);
  EXPECT_EQ(tensor_parallel_plan::layer_all_reduces(),
            (std::vector{all_reduce_point::after_o_proj, all_reduce_point::after_down_proj}));
}

TEST(tensor_parallel_plan_test, rank_config_and_description) {
  const model_config big = *preset_config("llama3-8b"); // 32 heads, 8 kv, 14336
  tensor_parallel_plan two(big, 2);
  EXPECT_EQ(two.kv_layout(), kv_head_layout::split);
  EXPECT_EQ(two.rank_config().num_heads, 16);
  EXPECT_EQ(two.rank_config().num_kv_heads, 4);
  EXPECT_EQ(two.rank_config().intermediate_size, 7168);
  EXPECT_EQ(two.rank_config().hidden_size, big.hidden_size);
  EXPECT_EQ(two.rank_config().head_dim, big.head_dim);
  EXPECT_EQ(two.rank_config().vocab_size, big.vocab_size);
  EXPECT_EQ(two.describe(), "tensor parallel 2: 16 of 32 query heads, 4 of 8 kv heads, "
                            "7168 of 14336 intermediate per rank");
  tensor_parallel_plan sixteen(big, 16);
  EXPECT_EQ(sixteen.kv_layout(), kv_head_layout::replicated);
  EXPECT_EQ(sixteen.rank_config().num_heads, 2);
  EXPECT_EQ(sixteen.rank_config().num_kv_heads, 1);
  EXPECT_EQ(sixteen.rank_config().gqa_group(), 2);
  EXPECT_EQ(sixteen.describe(), "tensor parallel 16: 2 of 32 query heads, 1 of 8 kv heads "
                                "(replicated 2x), 896 of 14336 intermediate per rank");
  tensor_parallel_plan one(big, 1);
  EXPECT_EQ(one.ranks(), 1);
  EXPECT_EQ(one.bias_rank(), 0);
  EXPECT_EQ(one.shard(0).q_heads, (index_range{0, 32}));
  EXPECT_EQ(one.shard(0).rows(projection::down), (index_range{0, big.hidden_size}));
  EXPECT_EQ(one.shard(0).cols(projection::down), (index_range{0, 14336}));
}

/// Every accepted (preset, N): each dimension covered as the plan says.
TEST(tensor_parallel_plan_test, ranges_cover_every_dimension_exactly_once) {
  int checked = 0;
  for (const auto& name : model_presets()) {
    const model_config cfg = *preset_config(name);
    for (int32_t n : {1, 2, 4, 8, 16, 32}) {
      if (cfg.num_heads % n != 0)
        continue;
      SCOPED_TRACE(name + " N=" + std::to_string(n));
      tensor_parallel_plan plan(cfg, n);
      ASSERT_EQ(plan.ranks(), n);
      const bool replicated = plan.kv_layout() == kv_head_layout::replicated;
      EXPECT_EQ(replicated, n > cfg.num_kv_heads);
      for (projection p : all_projections) {
        const auto [out, in] = weight_shape(cfg, p);
        const bool column = split_of(p) == split_kind::column_parallel;
        // How many ranks hold each index of the split dimension.
        std::vector<int> held(size_t(column ? out : in), 0);
        for (int32_t r = 0; r < n; ++r) {
          const rank_shard& s = plan.shard(r);
          EXPECT_EQ(s.rank, r);
          const index_range split = column ? s.rows(p) : s.cols(p);
          const index_range whole = column ? s.cols(p) : s.rows(p);
          EXPECT_EQ(whole, (index_range{0, column ? in : out}));
          ASSERT_GE(split.begin, 0);
          ASSERT_LE(split.end, int64_t(held.size()));
          EXPECT_GT(split.size(), 0);
          for (int64_t i = split.begin; i < split.end; ++i)
            ++held[size_t(i)];
        }
        const bool kv = p == projection::k || p == projection::v;
        const int times = kv && replicated ? n / cfg.num_kv_heads : 1;
        for (size_t i = 0; i < held.size(); ++i)
          ASSERT_EQ(held[i], times) << "index " << i << " of projection " << int(p);
      }
      // o_proj's columns are exactly q's rows; down's exactly gate's and up's.
      for (int32_t r = 0; r < n; ++r) {
        const rank_shard& s = plan.shard(r);
        EXPECT_EQ(s.cols(projection::o), s.rows(projection::q));
        EXPECT_EQ(s.cols(projection::down), s.rows(projection::gate));
        EXPECT_EQ(s.rows(projection::up), s.rows(projection::gate));
        EXPECT_EQ(s.rows(projection::k), s.rows(projection::v));
        EXPECT_EQ(s.q_heads.size(), plan.rank_config().num_heads);
        EXPECT_EQ(s.kv_heads.size(), plan.rank_config().num_kv_heads);
        EXPECT_EQ(s.intermediate.size(), plan.rank_config().intermediate_size);
        // Every query head finds its kv head on its own rank, at the local
        // index the rank's own GQA grouping gives it.
        for (int64_t h = s.q_heads.begin; h < s.q_heads.end; ++h) {
          const int64_t kv_head = h / cfg.gqa_group();
          EXPECT_GE(kv_head, s.kv_heads.begin);
          EXPECT_LT(kv_head, s.kv_heads.end);
          EXPECT_EQ(kv_head - s.kv_heads.begin,
                    (h - s.q_heads.begin) / plan.rank_config().gqa_group());
        }
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 20);
}


// -- shard_model: the folder one GPU rank uploads ----------------------------------------

/// Whether `part` holds exactly rows x cols of the 2-D `whole`.
void expect_slice(const tensor_view& whole, const tensor_view& part, index_range rows,
                  index_range cols) {
  ASSERT_EQ(part.type, whole.type) << part.name;
  ASSERT_EQ(part.shape, (std::vector<int64_t>{rows.size(), cols.size()})) << part.name;
  const size_t es = dtype_size(whole.type), in = size_t(whole.shape.at(1));
  for (int64_t r = 0; r < rows.size(); ++r)
    ASSERT_EQ(std::memcmp(part.data + size_t(r * cols.size()) * es,
                          whole.data + (size_t(rows.begin + r) * in + size_t(cols.begin)) * es,
                          size_t(cols.size()) * es),
              0)
      << part.name << " row " << r;
}

TEST(shard_model_test, each_rank_holds_its_rows_and_columns_in_the_checkpoint_type) {
  for (const char* preset : {"tiny-llama3", "tiny-qwen2", "tiny-mistral"}) {
    auto model = model_folder::open(test::tiny_model(preset));
    for (int32_t n : {1, 2}) {
      const tensor_parallel_plan plan(model->config, n);
      for (int32_t r = 0; r < n; ++r) {
        SCOPED_TRACE(std::string(preset) + " rank " + std::to_string(r) + " of "
                     + std::to_string(n));
        auto shard = shard_model(model, plan, r);
        const auto& c = shard->config;
        EXPECT_EQ(c.num_heads, plan.rank_config().num_heads);
        EXPECT_EQ(c.num_kv_heads, plan.rank_config().num_kv_heads);
        EXPECT_EQ(c.intermediate_size, plan.rank_config().intermediate_size);
        EXPECT_EQ(c.hidden_size, model->config.hidden_size);
        // Replicated: the whole folder's own views.
        EXPECT_EQ(shard->weights.embed, model->weights.embed);
        EXPECT_EQ(shard->weights.final_norm, model->weights.final_norm);
        EXPECT_EQ(shard->weights.lm_head, model->weights.lm_head);
        const rank_shard& s = plan.shard(r);
        ASSERT_EQ(shard->weights.layers.size(), model->weights.layers.size());
        for (size_t l = 0; l < model->weights.layers.size(); ++l) {
          const auto& whole = model->weights.layers[l];
          const auto& mine = shard->weights.layers[l];
          EXPECT_EQ(mine.attn_norm, whole.attn_norm);
          EXPECT_EQ(mine.mlp_norm, whole.mlp_norm);
          for (projection p : all_projections)
            expect_slice(*whole.weight(p), *mine.weight(p), s.rows(p), s.cols(p));
          const std::pair<const tensor_view*, const tensor_view*> biases[] = {
            {whole.q_bias, mine.q_bias}, {whole.k_bias, mine.k_bias}, {whole.v_bias, mine.v_bias}};
          const projection of[] = {projection::q, projection::k, projection::v};
          for (int i = 0; i < 3; ++i) {
            auto [w, m] = biases[i];
            ASSERT_EQ(w == nullptr, m == nullptr);
            if (!w)
              continue;
            const index_range rows = s.rows(of[i]);
            const size_t es = dtype_size(w->type);
            ASSERT_EQ(m->shape, std::vector<int64_t>{rows.size()});
            EXPECT_EQ(std::memcmp(m->data, w->data + size_t(rows.begin) * es,
                                  size_t(rows.size()) * es),
                      0);
          }
        }
      }
    }
  }
}

TEST(shard_model_test, o_bias_is_added_by_one_rank_only) {
  auto whole = model_folder::open(test::tiny_model("tiny-llama3"));
  // tiny-llama3 with an o_proj bias of 1, 2, 3, ... (no preset has one).
  auto model = std::make_shared<model_folder>();
  model->dir = whole->dir;
  model->config = whole->config;
  model->config.o_bias = true;
  model->weights = whole->weights;
  auto values = std::make_shared<std::vector<float>>(size_t(whole->config.hidden_size));
  for (size_t i = 0; i < values->size(); ++i)
    (*values)[i] = float(i + 1);
  auto view = std::make_shared<tensor_view>();
  view->name = "o_proj.bias";
  view->type = dtype::f32;
  view->shape = {whole->config.hidden_size};
  view->data = reinterpret_cast<const std::byte*>(values->data());
  view->nbytes = values->size() * 4;
  for (auto& l : model->weights.layers)
    l.o_bias = view.get();
  model->held = {whole, values, view};

  const tensor_parallel_plan plan(model->config, 2);
  auto first = shard_model(model, plan, plan.bias_rank());
  auto second = shard_model(model, plan, 1 - plan.bias_rank());
  for (size_t l = 0; l < model->weights.layers.size(); ++l) {
    EXPECT_EQ(first->weights.layers[l].o_bias, view.get());
    const tensor_view* zero = second->weights.layers[l].o_bias;
    ASSERT_NE(zero, nullptr);
    EXPECT_EQ(zero->shape, view->shape);
    EXPECT_EQ(zero->type, dtype::f32);
    for (size_t i = 0; i < zero->nbytes; ++i)
      ASSERT_EQ(zero->data[i], std::byte{0}) << "layer " << l << " byte " << i;
  }
}

TEST(shard_model_test, the_shard_keeps_the_whole_folder_alive) {
  auto model = model_folder::open(test::tiny_model("tiny-llama3"));
  const tensor_parallel_plan plan(model->config, 2);
  auto shard = shard_model(model, plan, 1);
  std::vector<std::byte> embed(shard->weights.embed->data,
                               shard->weights.embed->data + shard->weights.embed->nbytes);
  model.reset(); // the shard's reference is the last
  auto again = model_folder::open(test::tiny_model("tiny-llama3"));
  ASSERT_EQ(embed.size(), again->weights.embed->nbytes);
  EXPECT_EQ(std::memcmp(shard->weights.embed->data, again->weights.embed->data, embed.size()), 0);
  const tensor_view& down = *shard->weights.layers.back().down;
  expect_slice(*again->weights.layers.back().down, down, plan.shard(1).rows(projection::down),
               plan.shard(1).cols(projection::down));
}

/// Every 4-bit projection of every rank dequantizes (the layouts' published
/// formulas) to exactly its block of the whole projection's dequantization:
/// GPTQ (packed along inputs) and AWQ (along outputs, interleaved), groups
/// of 128 and per channel (a checkpoint as transformers' tools write it),
/// both ranks.
TEST(shard_model_test, four_bit_slices_dequantize_to_their_block_of_the_whole) {
  std::vector<std::pair<std::string, std::shared_ptr<const model_folder>>> models = {
    {"gptq g128", model_folder::open(test::int4_model(quant_method::gptq))},
    {"awq g128", model_folder::open(test::int4_model(quant_method::awq))},
    {"gptq per channel (golden checkpoint)",
     model_folder::open(test::int4_goldens() / "gptq-perchannel")}};
  for (const auto& [name, model] : models) {
    ASSERT_TRUE(model->weights.quantized) << name;
    const quantization_config& qc = *model->config.quantization;
    const tensor_parallel_plan plan(model->config, 2);
    for (int32_t r = 0; r < 2; ++r) {
      auto shard = shard_model(model, plan, r);
      ASSERT_TRUE(shard->weights.quantized);
      ASSERT_TRUE(shard->config.quantization);
      const rank_shard& s = plan.shard(r);
      for (size_t l = 0; l < model->weights.layers.size(); ++l)
        for (projection p : all_projections) {
          SCOPED_TRACE(name + " rank " + std::to_string(r) + " layer " + std::to_string(l)
                       + " projection " + std::to_string(int(p)));
          const quantized_linear& whole = model->weights.layers[l].quantized[size_t(p)];
          const quantized_linear& part = shard->weights.layers[l].quantized[size_t(p)];
          ASSERT_TRUE(whole.present());
          ASSERT_TRUE(part.present());
          EXPECT_EQ(shard->weights.layers[l].weight(p), nullptr);
          const index_range rows = s.rows(p), cols = s.cols(p);
          ASSERT_EQ(part.out_features, rows.size());
          ASSERT_EQ(part.in_features, cols.size());
          std::vector<float> w(size_t(whole.out_features * whole.in_features));
          std::vector<float> mine(size_t(part.out_features * part.in_features));
          dequantize(qc, whole, w.data());
          dequantize(qc, part, mine.data());
          int64_t differ = 0;
          for (int64_t o = 0; o < rows.size(); ++o)
            for (int64_t i = 0; i < cols.size(); ++i)
              differ += mine[size_t(o * cols.size() + i)]
                        != w[size_t((rows.begin + o) * whole.in_features + cols.begin + i)];
          EXPECT_EQ(differ, 0);
        }
    }
  }
}

} // namespace
} // namespace metronome
