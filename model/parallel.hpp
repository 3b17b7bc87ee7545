#pragma once
// A small fork-join pool for the CPU engine's loops.
//
// Design note. OpenMP's runtime spins its idle threads for a while after
// each parallel region; in a server whose executor shares two cores with the
// actor scheduler and the network threads, that spinning steals the cores
// the other threads need (measured here: 25 ms per token instead of 4). This
// pool's workers block on a condition variable between jobs. A job is split
// into one contiguous range per thread (the caller takes the first), so the
// same element is always computed by the same code and results do not depend
// on the thread count.

#include <cstdint>
#include <functional>

namespace metronome {

/// Threads parallel_for uses: METRONOME_THREADS if set, else the hardware's.
int parallel_threads();

/// Calls fn(lo, hi) on disjoint ranges covering [begin, end), in parallel when
/// the range holds at least `min_per_thread` items per extra thread. Blocks
/// until all ranges are done. Any thread may call it; a call made from
/// inside a job runs serially.
void parallel_for(int64_t begin, int64_t end, int64_t min_per_thread,
                  const std::function<void(int64_t, int64_t)>& fn);

} // namespace metronome
