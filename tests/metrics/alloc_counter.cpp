// Replaces the global allocation functions of this test binary with ones that
// count calls per thread and forward to malloc/free.

#include "tests/metrics/alloc_counter.hpp"

#include <cstdlib>
#include <new>

namespace {

thread_local size_t allocations = 0;

void* counted_alloc(std::size_t size) {
  ++allocations;
  if (void* p = std::malloc(size == 0 ? 1 : size))
    return p;
  throw std::bad_alloc();
}

} // namespace

namespace metronome::test {

size_t allocations_on_this_thread() noexcept {
  return allocations;
}

} // namespace metronome::test

void* operator new(std::size_t size) {
  return counted_alloc(size);
}

void* operator new[](std::size_t size) {
  return counted_alloc(size);
}

void operator delete(void* p) noexcept {
  std::free(p);
}

void operator delete[](void* p) noexcept {
  std::free(p);
}

void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
