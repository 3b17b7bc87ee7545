// A CPU reference of tensor-parallel execution, checked against the
// unsharded CPU engine: the weights of a tiny model are sliced per rank by
// shard_model (the folders the GPU ranks upload), each rank runs attention on its own heads (with a KV
// cache of its own kv heads) and the MLP on its slice of the intermediate
// features, and the ranks' partial o_proj and down_proj outputs are summed
// (the all-reduce). Greedy ids must equal the engine's and the logits agree
// to fp32 rounding: the only difference is the order in which the partial
// dot products of o_proj and down_proj are added.
//
// The ranks run one after the other on one thread, and hold one copy of the
// residual stream between them: every rank would compute the same values
// (embeddings, norms and the LM head are replicated), so the copy stands for
// all of them. What a GPU rank would do differently is only where its
// slices live and that the sum is an NCCL all-reduce.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "model/cpu_engine.hpp"
#include "model/cpu_ops.hpp"
#include "model/dtype.hpp"
#include "model/tensor_parallel.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

/// One rank: its slices of every layer and its KV cache, contiguous by
/// position: keys[layer][pos * local kv size + ...].
struct rank_state {
  rank_shard shard;
  /// The rank's folder (shard_model): q ... down and biases are its slices.
  std::shared_ptr<const model_folder> folder;
  const std::vector<layer_weights>& layers() const {
    return folder->weights.layers;
  }
  std::vector<std::vector<float>> keys, values;
};

/// Tensor-parallel forward on the CPU, by the plan.
class tp_reference {
public:
  tp_reference(std::shared_ptr<const model_folder> model, int32_t ranks)
    : model_(std::move(model)), plan_(model_->config, ranks),
      inv_freq_(rope_inv_freq(model_->config)) {
    const auto& w = model_->weights;
    for (int32_t r = 0; r < ranks; ++r) {
      rank_state& rs = ranks_.emplace_back();
      rs.shard = plan_.shard(r);
      // The slices a GPU rank uploads: column-parallel biases cut with
      // their rows, o's bias on one rank only (zeros on the others).
      rs.folder = shard_model(model_, plan_, r);
      rs.keys.resize(w.layers.size());
      rs.values.resize(w.layers.size());
    }
  }

  const tensor_parallel_plan& plan() const {
    return plan_;
  }

  /// All-reduces run so far (each: one sum over the ranks).
  int64_t all_reduces() const {
    return all_reduces_;
  }

  /// Appends `tokens` to the sequence (positions from the cache's length)
  /// and returns the logits of the last one.
  std::vector<float> forward(std::span<const int32_t> tokens) {
    const auto& cfg = model_->config;
    const auto& local = plan_.rank_config();
    const auto& w = model_->weights;
    const int64_t rows = int64_t(tokens.size()), hidden = cfg.hidden_size;
    const int64_t lq = local.q_size(), lkv = local.kv_size(), linter = local.intermediate_size;
    const int64_t start = length_;

    std::vector<float> x(size_t(rows * hidden)), xn(x.size()), sum(x.size()), part(x.size());
    std::vector<float> q(size_t(rows * lq)), k(size_t(rows * lkv)), v(k.size()), att(q.size());
    std::vector<float> gate(size_t(rows * linter)), up(gate.size());
    ref::embed(*w.embed, tokens, x.data());
    for (int32_t l = 0; l < cfg.num_layers; ++l) {
      const auto& full = w.layers[size_t(l)];
      for (all_reduce_point point : tensor_parallel_plan::layer_all_reduces()) {
        const bool attention = point == all_reduce_point::after_o_proj;
        ref::rms_norm(x.data(), attention ? *full.attn_norm : *full.mlp_norm, cfg.rms_norm_eps,
                      rows, hidden, xn.data());
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (rank_state& rs : ranks_) {
          const layer_weights& lw = rs.layers()[size_t(l)];
          if (attention) {
            ref::linear(*lw.q, lw.q_bias, xn.data(), rows, q.data());
            ref::linear(*lw.k, lw.k_bias, xn.data(), rows, k.data());
            ref::linear(*lw.v, lw.v_bias, xn.data(), rows, v.data());
            for (int64_t t = 0; t < rows; ++t) {
              ref::rope(q.data() + t * lq, local.num_heads, cfg.head_dim, start + t,
                        inv_freq_.data());
              ref::rope(k.data() + t * lkv, local.num_kv_heads, cfg.head_dim, start + t,
                        inv_freq_.data());
            }
            auto& keys = rs.keys[size_t(l)];
            auto& values = rs.values[size_t(l)];
            keys.insert(keys.end(), k.begin(), k.end());
            values.insert(values.end(), v.begin(), v.end());
            attend_local(l, rs, q.data(), rows, att.data());
            ref::linear(*lw.o, lw.o_bias, att.data(), rows, part.data());
          } else {
            ref::linear(*lw.gate, nullptr, xn.data(), rows, gate.data());
            ref::linear(*lw.up, nullptr, xn.data(), rows, up.data());
            ref::silu_mul(gate.data(), up.data(), rows * linter, gate.data());
            ref::linear(*lw.down, nullptr, gate.data(), rows, part.data());
          }
          // The all-reduce, in rank order.
          for (size_t i = 0; i < sum.size(); ++i)
            sum[i] += part[i];
        }
        ++all_reduces_;
        for (size_t i = 0; i < x.size(); ++i)
          x[i] += sum[i];
      }
    }
    length_ += rows;
    std::vector<float> last(x.end() - hidden, x.end()), logits(size_t(cfg.vocab_size));
    ref::rms_norm(last.data(), *w.final_norm, cfg.rms_norm_eps, 1, hidden, last.data());
    ref::linear(*w.lm_head, nullptr, last.data(), 1, logits.data());
    return logits;
  }

private:
  /// Causal attention of `rows` new queries (rank-local heads) over the
  /// rank's cache, with the rank's own GQA grouping; sliding where the layer
  /// slides.
  void attend_local(int32_t layer, const rank_state& rs, const float* q, int64_t rows,
                    float* out) const {
    const auto& cfg = model_->config;
    const auto& local = plan_.rank_config();
    const int32_t d = cfg.head_dim;
    const int64_t lq = local.q_size(), lkv = local.kv_size();
    const float scale = 1.0f / std::sqrt(float(d));
    const auto& keys = rs.keys[size_t(layer)];
    const auto& values = rs.values[size_t(layer)];
    std::vector<float> scores(size_t(length_ + rows));
    for (int64_t t = 0; t < rows; ++t) {
      const int64_t pos = length_ + t;
      const int64_t first = cfg.is_sliding(layer)
                              ? std::max<int64_t>(0, pos - *cfg.sliding_window + 1)
                              : 0;
      for (int32_t h = 0; h < local.num_heads; ++h) {
        const int64_t g = h / local.gqa_group();
        ref::attend(
          q + t * lq + int64_t(h) * d, d, first, pos, scale,
          [&](int64_t j) { return keys.data() + j * lkv + g * d; },
          [&](int64_t j) { return values.data() + j * lkv + g * d; }, scores.data(),
          out + t * lq + int64_t(h) * d);
      }
    }
  }

  std::shared_ptr<const model_folder> model_;
  tensor_parallel_plan plan_;
  std::vector<float> inv_freq_;
  std::deque<rank_state> ranks_;
  int64_t length_ = 0;
  int64_t all_reduces_ = 0;
};

/// The unsharded engine over one sequence.
class engine_sequence {
public:
  explicit engine_sequence(std::shared_ptr<const model_folder> model)
    : engine_(std::move(model), 16, 8), pages_(16) {
    std::iota(pages_.begin(), pages_.end(), 0);
  }

  std::vector<float> forward(std::span<const int32_t> tokens) {
    std::vector<float> logits(size_t(engine_.config().vocab_size));
    forward_input in{tokens, length_, pages_};
    engine_.forward(std::span(&in, 1), logits);
    length_ += int32_t(tokens.size());
    return logits;
  }

private:
  cpu_engine engine_;
  std::vector<int32_t> pages_;
  int32_t length_ = 0;
};

int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

using tp_param = std::tuple<std::string, int32_t>;

class tensor_parallel_reference_test : public ::testing::TestWithParam<tp_param> {};

/// A 24-token prompt (past tiny-mistral's 16-token window) in chunks of 10,
/// 10 and 4, then 8 greedy decode steps: the same ids, and logits within
/// 1e-4 of the logit scale, at every step.
TEST_P(tensor_parallel_reference_test, greedy_ids_and_logits_equal_the_unsharded_engine) {
  const auto& [preset, ranks] = GetParam();
  auto model = model_folder::open(test::tiny_model(preset));
  const auto& cfg = model->config;
  tp_reference tp(model, ranks);
  engine_sequence whole(model);

  std::mt19937 rng(uint32_t(ranks) * 31u + 5u);
  std::vector<int32_t> prompt(24);
  for (auto& t : prompt)
    t = int32_t(rng() % uint32_t(cfg.vocab_size));

  std::vector<int32_t> ids_tp, ids_whole;
  double max_diff = 0, max_scale = 0;
  auto compare = [&](const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, double(std::fabs(a[i] - b[i])));
      scale = std::max(scale, double(std::fabs(b[i])));
    }
    max_diff = std::max(max_diff, diff);
    max_scale = std::max(max_scale, scale);
    EXPECT_LT(diff, 1e-4 * std::max(1.0, scale)) << "step " << ids_whole.size();
    ids_tp.push_back(argmax(a));
    ids_whole.push_back(argmax(b));
  };
  std::vector<float> a, b;
  const std::pair<int, int> chunks[] = {{0, 10}, {10, 10}, {20, 4}};
  for (auto [first, n] : chunks) {
    auto chunk = std::span<const int32_t>(prompt).subspan(size_t(first), size_t(n));
    a = tp.forward(chunk);
    b = whole.forward(chunk);
  }
  compare(a, b);
  for (int step = 0; step < 8; ++step) {
    const int32_t next_tp = ids_tp.back(), next_whole = ids_whole.back();
    a = tp.forward(std::span(&next_tp, 1));
    b = whole.forward(std::span(&next_whole, 1));
    compare(a, b);
  }
  EXPECT_EQ(ids_tp, ids_whole);
  // Two all-reduces per layer per forward call (3 prompt chunks, 8 steps).
  EXPECT_EQ(tp.all_reduces(), int64_t(2) * cfg.num_layers * 11);
  std::printf("[tensor_parallel] %s N=%d (%s): max |logit diff| %.3g, max |logit| %.3g\n",
              preset.c_str(), ranks, tp.plan().describe().c_str(), max_diff, max_scale);
  RecordProperty("max_logit_diff", std::to_string(max_diff));
}

INSTANTIATE_TEST_SUITE_P(presets, tensor_parallel_reference_test,
                         ::testing::Combine(::testing::Values("tiny-llama3", "tiny-qwen2",
                                                              "tiny-mistral"),
                                            ::testing::Values(1, 2, 4)),
                         [](const ::testing::TestParamInfo<tp_param>& info) {
                           std::string name = std::get<0>(info.param) + "_tp"
                                              + std::to_string(std::get<1>(info.param));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

} // namespace
} // namespace metronome
