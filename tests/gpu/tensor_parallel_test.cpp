// Tensor parallelism on the device (gpu/tensor_parallel_runner.hpp): ranks
// serving their shards in step, summing over the collective. Without
// several GPUs, two ranks share one device over the peer collective (NCCL
// refuses two ranks on one device); the sharding, the partial sums, the
// all-reduces in the captured graphs and the broadcast ids are the same
// code as on several GPUs. NCCL itself runs here with one rank per device
// where the machine has the devices and the library.

#include <gtest/gtest.h>

#include "gpu/collective.hpp"
#include "gpu/tensor_parallel_runner.hpp"
#include "model/model_error.hpp"
#include "model/model_weights.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/gpu/runner_support.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

using namespace ::metronome::test;

cuda_runner_options two_ranks_on_one_device(const std::string& small_batch_path) {
  auto o = small_runner_options();
  o.limits.max_batch_size = 24;
  o.limits.kv_cache_tokens = 8192;
  o.limits.max_num_batched_tokens = 512;
  o.small_batch_path = small_batch_path;
  o.tensor_parallel = 2;
  o.tensor_parallel_devices = {0, 0};
  return o;
}

/// Greedy generation of 12 tokens for 20 prompts at once (prompts in
/// chunks of `chunk`), each step's id the CPU engine's argmax or a near-tie
/// of it along the ranks' own sequence, most of them exactly.
void expect_follows_cpu(const std::shared_ptr<const model_folder>& model, model_runner& runner,
                        int32_t chunk, const std::string& what) {
  const auto prompts = twenty_prompts(model->config.vocab_size);
  const auto got = generate(runner, prompts, 12, chunk, false);
  ASSERT_EQ(got.size(), prompts.size());
  int32_t exact = 0, steps = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    EXPECT_EQ(got[p].size(), 12u) << what;
    exact += expect_greedy_matches_cpu(model, prompts[p], got[p],
                                       what + " prompt " + std::to_string(p));
    steps += int32_t(got[p].size());
  }
  EXPECT_GE(exact, steps * 8 / 10) << what;
}

// Every decode path (the GEMV with its fused residual epilogue, the skinny
// GEMM, cuBLAS with the all-reduce before the norm), captured graphs and
// chunked prompts (the general pass and the mixed graphs), with two ranks
// of two query heads and one kv head each.
TEST(gpu_tensor_parallel, two_ranks_on_one_device_follow_the_cpu_engine) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(tiny_model("tiny-llama3", 11));
  for (const char* path : {"gemv", "skinny", "cublas", "auto"}) {
    auto runner = make_cuda_runner(model, two_ranks_on_one_device(path));
    const std::string what = describe_cuda_runner(*runner);
    EXPECT_NE(what.find("tensor parallel 2"), std::string::npos) << what;
    EXPECT_NE(what.find("over peer"), std::string::npos) << what;
    EXPECT_EQ(runner->config().num_heads, model->config.num_heads) << "the whole model's config";
    EXPECT_EQ(runner->device(), "cuda:0+cuda:0");
    expect_follows_cpu(model, *runner, 16, std::string(path) + ": " + what);
  }
}

// Ranks of one kv head shared by both (tiny-mistral's one kv head,
// replicated) and Qwen2's q/k/v biases, sliced with their rows.
TEST(gpu_tensor_parallel, replicated_kv_heads_and_qkv_biases) {
  METRONOME_REQUIRE_GPU();
  for (const char* preset : {"tiny-mistral", "tiny-qwen2"}) {
    auto model = model_folder::open(tiny_model(preset, 11));
    auto runner = make_cuda_runner(model, two_ranks_on_one_device("auto"));
    expect_follows_cpu(model, *runner, 1 << 20, preset);
  }
}

// Llama's attention_bias: o_proj's bias is added by rank 0 alone (the
// others hold zeros), on every path that adds it.
TEST(gpu_tensor_parallel, the_o_bias_is_counted_once) {
  METRONOME_REQUIRE_GPU();
  auto model = tiny_llama3_with("tp-attention-bias", 11, [](model_config& c) {
    c.qkv_bias = true;
    c.o_bias = true;
  });
  for (const char* path : {"gemv", "cublas"}) {
    auto runner = make_cuda_runner(model, two_ranks_on_one_device(path));
    expect_follows_cpu(model, *runner, 16, std::string("attention_bias, ") + path);
  }
}

// 4-bit weights cut per rank in their own layout (GPTQ packed along the
// inputs, AWQ along the outputs): the 4-bit GEMV, the skinny GEMM's 4-bit
// form and cuBLAS on the dequantized form follow the CPU engine, which
// dequantizes the whole model.
TEST(gpu_tensor_parallel, four_bit_weights_follow_the_cpu_engine) {
  METRONOME_REQUIRE_GPU();
  for (quant_method layout : {quant_method::gptq, quant_method::awq}) {
    auto model = model_folder::open(int4_model(layout));
    for (const char* path : {"gemv", "skinny", "cublas"}) {
      auto runner = make_cuda_runner(model, two_ranks_on_one_device(path));
      const std::string what = describe_cuda_runner(*runner);
      EXPECT_NE(what.find("int4"), std::string::npos) << what;
      expect_follows_cpu(model, *runner, 16,
                         std::string(quant_method_name(layout)) + " " + path + ": " + what);
    }
  }
}

// Overlapped steps (submit behind submit) keep the ranks in step: the ids
// equal those of steps run one at a time, and every rank's pages come back.
TEST(gpu_tensor_parallel, submitted_steps_equal_executed_ones) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(tiny_model("tiny-llama3", 11));
  auto runner = make_cuda_runner(model, two_ranks_on_one_device("auto"));
  const auto prompts = twenty_prompts(model->config.vocab_size);
  const auto once = generate(*runner, prompts, 12, 16, false);
  // The same prompts again on the same runner, staggered: other batches,
  // the same greedy ids (up to near-ties).
  const auto staggered = generate(*runner, prompts, 12, 16, true);
  for (size_t p = 0; p < prompts.size(); ++p)
    expect_same_or_near_tie(model, prompts[p], once[p], staggered[p],
                            "prompt " + std::to_string(p));
  const auto plan = runner->memory_plan();
  bool rank1 = false;
  for (const auto& e : plan)
    rank1 = rank1 || e.name == "rank1_kv_pool";
  EXPECT_TRUE(rank1) << "each rank's memory plan is listed";
}

// A model that does not split is refused before any device work, naming
// the field.
TEST(gpu_tensor_parallel, a_model_that_does_not_split_is_refused_by_name) {
  METRONOME_REQUIRE_GPU();
  auto model = model_folder::open(tiny_model("tiny-llama3", 11));
  auto o = two_ranks_on_one_device("auto");
  o.tensor_parallel = 3;
  o.tensor_parallel_devices = {0, 0, 0};
  try {
    make_cuda_runner(model, o);
    ADD_FAILURE() << "3 ranks of 4 heads were accepted";
  } catch (const model_error& e) {
    EXPECT_NE(std::string(e.what()).find("num_attention_heads"), std::string::npos) << e.what();
  }
  o.tensor_parallel = 2;
  o.tensor_parallel_devices = {0, 0};
  o.tensor_parallel_collective = "nccl";
  try {
    make_cuda_runner(model, o);
    ADD_FAILURE() << "two NCCL ranks on one device were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("more than one rank"), std::string::npos) << e.what();
  }
}

// NCCL with one rank per device, where there are the devices and the
// library (the multi-GPU machines); the same checks as over peer.
TEST(gpu_tensor_parallel, nccl_ranks_on_two_devices_follow_the_cpu_engine) {
  METRONOME_REQUIRE_GPU();
  if (cuda_device_count() < 2)
    GTEST_SKIP() << "one CUDA device: NCCL ranks need two";
  if (const std::string p = gpu::nccl_problem(); !p.empty())
    GTEST_SKIP() << p;
  auto model = model_folder::open(tiny_model("tiny-llama3", 11));
  for (const char* kind : {"nccl", "peer"}) {
    auto o = two_ranks_on_one_device("auto");
    o.tensor_parallel_devices = {0, 1};
    o.tensor_parallel_collective = kind;
    auto runner = make_cuda_runner(model, o);
    expect_follows_cpu(model, *runner, 16, describe_cuda_runner(*runner));
  }
}

} // namespace
} // namespace metronome
