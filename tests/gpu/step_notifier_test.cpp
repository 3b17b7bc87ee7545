// The step notifier and wait_event on a real device, with stream work that
// takes a known time (a host function that sleeps, or one that waits for the
// test to open a gate): the listener hears of each watched point once the
// work before it has ended, and the process spends (almost) no CPU while it
// waits; events are reused once the thread is done with them; a notifier
// whose thread waits on work that never ends is destroyed within its bound
// and calls nobody afterwards; wait_event sleeps and keeps its timeout.

#include <time.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "gpu/step_notifier.hpp"
#include "tests/gpu/gpu_test_support.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

/// Counts listener calls; the test waits for them.
struct call_counter {
  std::mutex mutex;
  std::condition_variable cv;
  int calls = 0;
  clock_type::time_point last;

  void call() {
    {
      std::lock_guard lock(mutex);
      ++calls;
      last = clock_type::now();
    }
    cv.notify_all();
  }

  bool wait_for_calls(int n, clock_type::duration limit) {
    std::unique_lock lock(mutex);
    return cv.wait_for(lock, limit, [&] { return calls >= n; });
  }

  int count() {
    std::lock_guard lock(mutex);
    return calls;
  }
};

/// Holds the stream in a host function until opened.
struct gate {
  std::mutex mutex;
  std::condition_variable cv;
  bool open = false;

  void release() {
    {
      std::lock_guard lock(mutex);
      open = true;
    }
    cv.notify_all();
  }

  static void CUDART_CB hold(void* p) {
    auto* g = static_cast<gate*>(p);
    std::unique_lock lock(g->mutex);
    g->cv.wait(lock, [&] { return g->open; });
  }
};

void CUDART_CB sleep_300ms(void*) {
  std::this_thread::sleep_for(300ms);
}

void CUDART_CB nothing(void*) {
}

class step_notifier_test : public ::testing::Test {
protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device: GPU test skipped";
    METRONOME_CUDA(cudaSetDevice(0));
    METRONOME_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }

  void TearDown() override {
    if (stream) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
  }

  cudaStream_t stream = nullptr;
};

TEST_F(step_notifier_test, calls_the_listener_after_the_work_ends_and_sleeps_meanwhile) {
  auto counter = std::make_shared<call_counter>();
  gpu::step_notifier notifier(0, [counter] { counter->call(); });
  const auto t0 = clock_type::now();
  const double cpu0 = process_cpu_seconds();
  METRONOME_CUDA(cudaLaunchHostFunc(stream, sleep_300ms, nullptr));
  notifier.watch(stream);
  ASSERT_TRUE(counter->wait_for_calls(1, 10s)) << "the listener was not called";
  const double cpu = process_cpu_seconds() - cpu0;
  const double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
  EXPECT_GE(counter->last - t0, 300ms) << "called before the work ended";
  EXPECT_LT(cpu, 0.2 * wall) << cpu << " s of CPU in " << wall << " s: the wait spins";
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(counter->count(), 1);
}

TEST_F(step_notifier_test, calls_once_per_watch_and_reuses_its_events) {
  auto counter = std::make_shared<call_counter>();
  gpu::step_notifier notifier(0, [counter] { counter->call(); });
  // One at a time: each event is back in the pool before the next watch.
  for (int i = 0; i < 50; ++i) {
    METRONOME_CUDA(cudaLaunchHostFunc(stream, nothing, nullptr));
    notifier.watch(stream);
    ASSERT_TRUE(counter->wait_for_calls(i + 1, 10s)) << "watch " << i;
  }
  EXPECT_EQ(notifier.events_made(), 2u);
  // Three queued at once behind held work: the pool grows by one.
  gate g;
  METRONOME_CUDA(cudaLaunchHostFunc(stream, gate::hold, &g));
  for (int i = 0; i < 3; ++i)
    notifier.watch(stream);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(counter->count(), 50) << "called before the work ended";
  g.release();
  ASSERT_TRUE(counter->wait_for_calls(53, 10s));
  EXPECT_EQ(notifier.events_made(), 3u);
}

TEST_F(step_notifier_test, destroyed_while_waiting_on_work_that_does_not_end_returns_in_time) {
  // The destructor detaches the thread after its stop wait; the thread goes
  // on waiting, and once the work ends it exits without calling anyone and
  // frees the events.
  auto counter = std::make_shared<call_counter>();
  gate g;
  auto notifier = std::make_unique<gpu::step_notifier>(0, [counter] { counter->call(); }, 100ms);
  METRONOME_CUDA(cudaLaunchHostFunc(stream, gate::hold, &g));
  notifier->watch(stream);
  std::this_thread::sleep_for(20ms);
  const auto t0 = clock_type::now();
  notifier.reset();
  const auto took = clock_type::now() - t0;
  EXPECT_GE(took, 100ms);
  EXPECT_LT(took, 2s);
  g.release();
  METRONOME_CUDA(cudaStreamSynchronize(stream));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(counter->count(), 0);
}

TEST_F(step_notifier_test, wait_event_sleeps_and_keeps_its_timeout) {
  cudaEvent_t e = nullptr;
  METRONOME_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  // A long wait: the process sleeps.
  const auto t0 = clock_type::now();
  const double cpu0 = process_cpu_seconds();
  METRONOME_CUDA(cudaLaunchHostFunc(stream, sleep_300ms, nullptr));
  METRONOME_CUDA(cudaEventRecord(e, stream));
  gpu::wait_event(e, 10.0, "sleeping work");
  const double cpu = process_cpu_seconds() - cpu0;
  const double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
  EXPECT_GE(wall, 0.3);
  EXPECT_LT(wall, 0.5) << "noticed the end late";
  EXPECT_LT(cpu, 0.2 * wall) << cpu << " s of CPU in " << wall << " s: wait_event spins";
  // Work that does not end: cuda_error naming it after the timeout.
  gate g;
  METRONOME_CUDA(cudaLaunchHostFunc(stream, gate::hold, &g));
  METRONOME_CUDA(cudaEventRecord(e, stream));
  const auto t1 = clock_type::now();
  try {
    gpu::wait_event(e, 0.2, "held work");
    ADD_FAILURE() << "wait_event returned before the work ended";
  } catch (const gpu::cuda_error& err) {
    EXPECT_NE(std::string(err.what()).find("held work"), std::string::npos) << err.what();
  }
  const auto took = clock_type::now() - t1;
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, 1s);
  g.release();
  METRONOME_CUDA(cudaStreamSynchronize(stream));
  cudaEventDestroy(e);
}

} // namespace
} // namespace metronome
