// A real device fault (engine.fault_injection device_fault_after:N): the
// runner's step N + 1 is preceded on the device by a kernel that reads an
// unmapped address. The sticky error must reach the caller as a
// device_error with context_lost() (the executor's signal that only a new
// process can use the device: docs/reliability.md), from submit() or
// collect(), after exactly N good steps, and never as tokens. The fault
// leaves this process's CUDA context unusable, so the runner runs in a
// child (a death test that re-executes this binary) and the parent only
// reads its exit code and message.

#include <cstdio>
#include <cstdlib>

#include "model/device_error.hpp"
#include "model/fault_injection.hpp"
#include "model/model_weights.hpp"
#include "tests/gpu/gpu_test_support.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

/// Runs one sequence step by step on a runner whose step 3 faults; exits
/// 75 when the fault arrives as a lost context (1 as another device error,
/// 2 when no fault came), saying after how many good steps. Never returns:
/// _Exit skips the runner's destructor, which would wait on the dead
/// context (as the executor keeps such a runner, never destroying it).
[[noreturn]] void run_until_fault() {
  auto model = model_folder::open(test::tiny_model("tiny-llama3", 11));
  auto runner = with_faults(make_cuda_runner(model, test::small_runner_options()),
                            *fault_injection::parse("device_fault_after:2"));
  int good = 0;
  try {
    step_plan prefill;
    prefill.step = 0;
    prefill.added.push_back({1, std::vector<int32_t>(40, 3), {}, 0, 0});
    prefill.chunks.push_back({1, 40, {0, 1, 2}});
    runner->execute(prefill);
    ++good;
    for (uint64_t s = 1; s < 8; ++s) {
      step_plan decode;
      decode.step = s;
      decode.chunks.push_back({1, 1, {}});
      runner->execute(decode);
      ++good;
    }
  } catch (const device_error& e) {
    std::fprintf(stderr, "%s after %d good steps: %s\n",
                 e.context_lost() ? "context lost" : "device error kept the context", good,
                 e.what());
    std::_Exit(e.context_lost() ? 75 : 1);
  }
  std::fprintf(stderr, "no fault after %d good steps\n", good);
  std::_Exit(2);
}

TEST(gpu_device_fault, an_injected_invalid_read_ends_in_a_lost_context) {
  METRONOME_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_until_fault(), ::testing::ExitedWithCode(75), "context lost after 2 good steps");
}

} // namespace
} // namespace metronome
