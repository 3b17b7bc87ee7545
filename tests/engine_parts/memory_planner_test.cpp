// The memory planner's arithmetic, against figures worked out by hand.

#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "gpu/memory_planner.hpp"

namespace metronome::gpu {
namespace {

constexpr size_t mib = 1ull << 20;

model_config small_model() {
  model_config c;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim = 64;
  c.max_position_embeddings = 4096;
  return c;
}

cuda_runner_options options_with(double fraction) {
  cuda_runner_options o;
  o.limits.page_size = 16;
  o.limits.max_batch_size = 8;
  o.gpu_memory_fraction = fraction;
  return o;
}

TEST(memory_planner, sizes_kv_rows_and_layers_for_bf16_and_fp8) {
  const model_config c = small_model();
  cuda_runner_options o = options_with(0.5);
  const memory_planner bf16(c, o);
  EXPECT_EQ(bf16.kv_row_bytes(), 128u);              // 64 dims x 2 bytes
  EXPECT_EQ(bf16.kv_layer_bytes(3), 2u * 48 * 128);  // K and V, 3 pages x 16 rows
  o.kv_cache_dtype = kv_cache_dtype_kind::fp8;
  const memory_planner fp8(c, o);
  EXPECT_EQ(fp8.kv_row_bytes(), 68u);                // 64 bytes and a float scale
  EXPECT_EQ(fp8.kv_layer_bytes(1), 2304u);           // 2 x 16 x 68 = 2176, to 256s
}

TEST(memory_planner, gives_the_kv_pool_what_the_budget_leaves) {
  const model_config c = small_model();
  cuda_runner_options o = options_with(0.5);
  const memory_planner p(c, o);
  EXPECT_EQ(p.budget(1000 * mib), 500 * mib);
  // 500 - 100 used - 10 graphs - 256 reserve = 134 MiB; a page of 16 tokens
  // holds 3 layers x K and V x 128 bytes each: 12,288 bytes; one page less
  // for the scratch page.
  EXPECT_EQ(p.kv_pages(1000 * mib, 100 * mib, 10 * mib), 11433);
  o.limits.kv_cache_tokens = 100; // a fixed capacity: ceil(100 / 16)
  EXPECT_EQ(memory_planner(c, o).kv_pages(1000 * mib, 100 * mib, 10 * mib), 7);
}

TEST(memory_planner, names_the_budget_when_nothing_is_left_for_the_kv_pool) {
  const model_config c = small_model();
  const cuda_runner_options o = options_with(0.5);
  const memory_planner p(c, o);
  try {
    p.kv_pages(1000 * mib, 400 * mib, 10 * mib);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no memory left for the KV cache: budget 500 MiB"),
              std::string::npos)
      << e.what();
    EXPECT_NE(std::string(e.what()).find("already used 400 MiB, graphs ~10 MiB"),
              std::string::npos)
      << e.what();
  }
}

TEST(memory_planner, caps_the_page_stride_by_the_model_and_the_pool) {
  const model_config c = small_model();
  cuda_runner_options o = options_with(0.5);
  EXPECT_EQ(memory_planner(c, o).page_stride(1000), 256); // 4,096 positions
  EXPECT_EQ(memory_planner(c, o).page_stride(10), 10);    // the pool's 160 tokens
  o.limits.max_model_len = 100;
  EXPECT_EQ(memory_planner(c, o).page_stride(1000), 7);   // ceil(100 / 16)
}

TEST(memory_planner, holds_four_batches_of_sequences_unless_told_and_never_fewer_than_one) {
  const model_config c = small_model();
  cuda_runner_options o = options_with(0.5);
  EXPECT_EQ(memory_planner(c, o).max_seqs(8), 32);
  o.max_seqs = 12;
  EXPECT_EQ(memory_planner(c, o).max_seqs(8), 12);
  o.max_seqs = 4;
  EXPECT_THROW(memory_planner(c, o).max_seqs(8), std::invalid_argument);
}

TEST(memory_planner, estimates_graphs_as_twins_plus_the_auto_candidates) {
  // 3 decode sizes: 2 x 3 twins + 3 candidates, 12 MiB each (10 + 2).
  EXPECT_EQ(memory_planner::graph_estimate(10 * mib, 3, true, 0, 0), 9 * 12 * mib);
  EXPECT_EQ(memory_planner::graph_estimate(10 * mib, 3, false, 0, 0), 6 * 12 * mib);
  // 5 mixed sizes, twins of 4 + 2 MiB.
  EXPECT_EQ(memory_planner::graph_estimate(0, 0, false, 4 * mib, 5), 10 * 6 * mib);
}

} // namespace
} // namespace metronome::gpu
