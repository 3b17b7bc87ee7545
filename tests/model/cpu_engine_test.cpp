// Properties of the CPU engine that the server relies on: batching, chunking
// and page placement never change a sequence's logits, and bad input is
// refused before anything is computed.

#include <numeric>
#include <random>

#include <gtest/gtest.h>

#include "model/cpu_engine.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

class cpu_engine_test : public ::testing::TestWithParam<std::string> {
protected:
  void SetUp() override {
    model_ = model_folder::open(test::tiny_model(GetParam()));
    vocab_ = model_->config.vocab_size;
  }

  std::vector<int32_t> random_tokens(size_t n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::vector<int32_t> out(n);
    for (auto& t : out)
      t = int32_t(rng() % uint32_t(vocab_));
    return out;
  }

  static std::vector<int32_t> page_range(int32_t first, int32_t n) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    std::iota(p.begin(), p.end(), first);
    return p;
  }

  /// Logits of the last token after prefilling `tokens` in chunks of `chunk`.
  std::vector<float> prefill(const std::vector<int32_t>& tokens, size_t chunk,
                             const std::vector<int32_t>& pages, int32_t page_size = 8,
                             bool kv_fp8 = false) {
    cpu_engine engine(model_, 64, page_size);
    engine.set_kv_fp8(kv_fp8);
    std::vector<float> logits(static_cast<size_t>(vocab_));
    for (size_t start = 0; start < tokens.size(); start += chunk) {
      auto part = std::span<const int32_t>(tokens).subspan(start, std::min(chunk, tokens.size() - start));
      forward_input in{part, int32_t(start), pages};
      engine.forward(std::span(&in, 1), logits);
    }
    return logits;
  }

  std::shared_ptr<const model_folder> model_;
  int32_t vocab_ = 0;
};

TEST_P(cpu_engine_test, chunked_prefill_and_decode_equal_a_whole_prefill) {
  auto tokens = random_tokens(37, 1);
  auto pages = page_range(0, 5);
  auto whole = prefill(tokens, tokens.size(), pages);
  EXPECT_EQ(prefill(tokens, 8, pages), whole);  // page-aligned chunks
  EXPECT_EQ(prefill(tokens, 5, pages), whole);  // chunks across page boundaries
  EXPECT_EQ(prefill(tokens, 1, pages), whole);  // token-by-token decode
}

TEST_P(cpu_engine_test, page_placement_does_not_change_results) {
  auto tokens = random_tokens(30, 2);
  auto contiguous = prefill(tokens, 7, page_range(0, 4));
  EXPECT_EQ(prefill(tokens, 7, {63, 2, 40, 17}), contiguous);
  EXPECT_EQ(prefill(tokens, 7, page_range(0, 8), 4), contiguous); // other page size
}

TEST_P(cpu_engine_test, a_sequence_gets_the_same_logits_alone_and_in_a_batch) {
  cpu_engine batched(model_, 64, 8);
  std::vector<std::vector<int32_t>> seqs = {random_tokens(11, 3), random_tokens(3, 4),
                                            random_tokens(26, 5)};
  std::vector<std::vector<int32_t>> pages = {{0, 1}, {2}, {3, 4, 5, 6}};
  std::vector<forward_input> batch;
  for (size_t i = 0; i < seqs.size(); ++i)
    batch.push_back({seqs[i], 0, pages[i]});
  std::vector<float> logits(seqs.size() * size_t(vocab_));
  batched.forward(batch, logits);
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto alone = prefill(seqs[i], seqs[i].size(), pages[i]);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), logits.begin() + long(i) * vocab_))
      << "sequence " << i;
  }
}

// The fp8 cache's reference (set_kv_fp8): the rounding moves the logits, by
// about what 3 mantissa bits of the keys and values cost, and chunking still
// does not change them (a row is rounded once, when it is written).
TEST_P(cpu_engine_test, an_fp8_rounded_cache_moves_the_logits_a_little) {
  const auto tokens = random_tokens(40, 5);
  const auto pages = page_range(0, 8);
  const auto exact = prefill(tokens, 40, pages);
  const auto fp8 = prefill(tokens, 40, pages, 8, true);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < exact.size(); ++i) {
    diff = std::max(diff, double(std::fabs(fp8[i] - exact[i])));
    scale = std::max(scale, double(std::fabs(exact[i])));
  }
  EXPECT_GT(diff, 1e-4 * scale);
  EXPECT_LT(diff, 0.1 * scale);
  EXPECT_EQ(prefill(tokens, 7, pages, 8, true), fp8);
}

TEST_P(cpu_engine_test, refuses_bad_input) {
  cpu_engine engine(model_, 4, 8);
  std::vector<float> logits(static_cast<size_t>(vocab_));
  std::vector<int32_t> bad = {1, vocab_};
  std::vector<int32_t> pages = {0};
  forward_input in{bad, 0, pages};
  EXPECT_THROW(engine.forward(std::span(&in, 1), logits), std::invalid_argument);
  auto long_seq = random_tokens(9, 6); // 9 tokens need 2 pages of 8
  in = {long_seq, 0, pages};
  EXPECT_THROW(engine.forward(std::span(&in, 1), logits), std::invalid_argument);
  std::vector<int32_t> wild = {7};
  auto one = random_tokens(1, 7);
  in = {one, 0, wild};
  EXPECT_THROW(engine.forward(std::span(&in, 1), logits), std::invalid_argument);
}

TEST_P(cpu_engine_test, activations_stay_finite_and_logits_spread) {
  auto logits = prefill(random_tokens(40, 8), 40, page_range(0, 5));
  float lo = logits[0], hi = logits[0];
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_GT(hi - lo, 1.0f); // not a flat distribution
  EXPECT_LT(hi - lo, 100.0f);
}

INSTANTIATE_TEST_SUITE_P(presets, cpu_engine_test,
                         ::testing::Values("tiny-llama3", "tiny-qwen2", "tiny-mistral"),
                         [](const auto& info) {
                           auto s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

} // namespace
} // namespace metronome

namespace metronome {
namespace {

TEST(make_model, activations_stay_in_range_through_32_layers) {
  // The depth of Llama-3.1-8B with a tiny width: the init scales must keep
  // the residual stream and the logits finite and unsaturated.
  make_model_options o;
  o.config = *preset_config("tiny-llama3");
  o.config.num_layers = 32;
  o.config.layer_sliding.assign(32, false);
  o.seed = 3;
  o.out_dir = test::scratch_dir("deep-model");
  make_model(o);
  auto model = model_folder::open(o.out_dir);
  cpu_engine engine(model, 8, 16);
  std::vector<int32_t> tokens(100);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = int32_t((i * 7919) % 32000);
  std::vector<int32_t> pages = {0, 1, 2, 3, 4, 5, 6};
  std::vector<float> logits(size_t(model->config.vocab_size));
  forward_input in{tokens, 0, pages};
  engine.forward(std::span(&in, 1), logits);
  float lo = logits[0], hi = logits[0];
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_GT(hi - lo, 1.0f);
  EXPECT_LT(std::max(std::abs(lo), std::abs(hi)), 50.0f);
}

} // namespace
} // namespace metronome
