// The process metrics: the values follow what the process does (memory it
// allocates and touches, files it opens, CPU it burns), the names and types
// are the standard process_* ones, and the engine's /metrics text has them.

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "actors/engine.hpp"
#include "actors/engine_metrics.hpp"
#include "metrics/process_metrics.hpp"
#include "tests/metrics/exposition_checker.hpp"

// The heap figures come from glibc's mallinfo2(); under ASan or TSan the
// sanitizer's allocator replaces glibc's, which then reports nothing.
#if defined(__has_feature)
#  if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#    define METRONOME_SANITIZER_ALLOCATOR 1
#  endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#  define METRONOME_SANITIZER_ALLOCATOR 1
#endif
#if defined(__GLIBC__) && !defined(METRONOME_SANITIZER_ALLOCATOR)
#  define METRONOME_GLIBC_HEAP 1
#endif

namespace metronome {
namespace {

using prometheus::sample_process;

double value_of(const std::vector<test::parsed_family>& families, const std::string& name) {
  const auto* f = test::find_family(families, name);
  if (!f || f->samples.size() != 1) {
    ADD_FAILURE() << "no single sample of " << name;
    return -1;
  }
  return f->samples[0].value;
}

TEST(process_metrics, resident_memory_follows_touched_pages) {
  const auto before = sample_process();
  ASSERT_TRUE(before.resident_memory_bytes && before.virtual_memory_bytes);
  EXPECT_GT(*before.resident_memory_bytes, 0);
  EXPECT_GE(*before.virtual_memory_bytes, *before.resident_memory_bytes);
  constexpr size_t n = 64 << 20;
  std::unique_ptr<char[]> block(new char[n]);
  volatile char* bytes = block.get(); // volatile: every page is really written
  for (size_t i = 0; i < n; i += 4096)
    bytes[i] = 1; // touched: resident now
  const auto after = sample_process();
  EXPECT_GE(*after.resident_memory_bytes - *before.resident_memory_bytes, 0.9 * n);
}

TEST(process_metrics, open_fds_counts_descriptors) {
  const auto before = sample_process();
  ASSERT_TRUE(before.open_fds && before.max_fds);
  const int a = open("/dev/null", O_RDONLY);
  const int b = open("/dev/null", O_RDONLY);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  const auto during = sample_process();
  close(a);
  close(b);
  EXPECT_EQ(*during.open_fds - *before.open_fds, 2);
  EXPECT_EQ(*sample_process().open_fds, *before.open_fds);
  EXPECT_GE(*before.max_fds, *during.open_fds);
}

TEST(process_metrics, start_time_is_this_process_start) {
  const auto s = sample_process();
  ASSERT_TRUE(s.start_time_seconds);
  const double now = std::chrono::duration<double>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  // Started before now, and not long ago: the test binary runs for seconds.
  // (Clock ticks are 10 ms and btime is whole seconds: allow 2 s.)
  EXPECT_LE(*s.start_time_seconds, now + 2);
  EXPECT_GT(*s.start_time_seconds, now - 600);
}

TEST(process_metrics, cpu_seconds_grow_with_work) {
  const auto before = sample_process();
  ASSERT_TRUE(before.cpu_seconds);
  // Burn 0.3 s of this process' CPU time as the kernel counts it here (a
  // wall-clock loop gets less on a loaded machine), then compare.
  const auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
  };
  const double start = cpu_now();
  volatile uint64_t x = 0;
  while (cpu_now() - start < 0.3)
    x = x + 1;
  const auto after = sample_process();
  // /proc counts in clock ticks (10 ms): allow a few.
  EXPECT_NEAR(*after.cpu_seconds - *before.cpu_seconds, 0.3, 0.05);
}

#if defined(METRONOME_GLIBC_HEAP)
TEST(process_metrics, heap_in_use_follows_malloc_and_free) {
  std::vector<void*> small;
  small.reserve(100'000); // before the first sample: only the blocks differ
  const auto before = sample_process();
  ASSERT_TRUE(before.heap_in_use_bytes && before.heap_free_bytes);
  // Small blocks (in the arenas) and one large block (mmapped on its own):
  // both count as in use until freed.
  for (int i = 0; i < 100'000; ++i)
    small.push_back(std::malloc(64));
  void* volatile large = std::malloc(32 << 20); // volatile: the compiler may not drop it
  const auto during = sample_process();
  EXPECT_GE(*during.heap_in_use_bytes - *before.heap_in_use_bytes, 100'000 * 64 + (32 << 20));
  for (void* p : small)
    std::free(p);
  std::free(large);
  const auto after = sample_process();
  EXPECT_LT(*after.heap_in_use_bytes - *before.heap_in_use_bytes, 64 << 10)
    << "freed memory no longer counts as in use";
}
#endif

TEST(process_metrics, the_engine_metrics_text_has_them_with_standard_names) {
  engine_metrics m("tiny");
  engine_status status;
  const auto families = test::check_exposition(m.render(status));
  for (const auto* name : {"process_resident_memory_bytes", "process_virtual_memory_bytes",
                           "process_open_fds", "process_max_fds", "process_start_time_seconds"}) {
    const auto* f = test::find_family(families, name);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_EQ(f->type, "gauge") << name;
  }
  const auto* cpu = test::find_family(families, "process_cpu_seconds_total");
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->type, "counter");
  EXPECT_GT(value_of(families, "process_resident_memory_bytes"), 0);
#if defined(METRONOME_GLIBC_HEAP)
  EXPECT_GT(value_of(families, "metronome:heap_in_use_bytes"), 0);
  EXPECT_GE(value_of(families, "metronome:heap_free_bytes"), 0);
#endif
  // Sampled at each render: a descriptor opened in between shows.
  const double fds = value_of(families, "process_open_fds");
  const int fd = open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 0);
  const auto again = test::check_exposition(m.render(status));
  close(fd);
  EXPECT_EQ(value_of(again, "process_open_fds"), fds + 1);
  EXPECT_GE(value_of(again, "process_cpu_seconds_total"), value_of(families, "process_cpu_seconds_total"));
}

} // namespace
} // namespace metronome
