#pragma once
// Counts heap allocations made through operator new on the calling thread
// (alloc_counter.cpp replaces the global operator new of the test binary).

#include <cstddef>

namespace metronome::test {

/// Allocations through operator new on this thread since it started.
size_t allocations_on_this_thread() noexcept;

} // namespace metronome::test
