#pragma once
// The process' own resource use for /metrics: the standard process_*
// metrics of Prometheus' client libraries (same names, types and units, so
// dashboards and alerts written for them work) and the C heap as glibc's
// allocator sees it, to tell a leak (heap in use grows) from fragmentation
// or memory the allocator keeps for reuse (RSS grows, heap in use does not).
//
// Everything is sampled when the metrics are rendered (a scrape), never on
// a hot path. Linux only (/proc/self); where a source cannot be read, the
// metric keeps its last value, and the heap gauges are absent without glibc.

#include <cstdint>
#include <mutex>
#include <optional>

#include "metrics/prometheus.hpp"

namespace metronome::prometheus {

/// One reading of the process' resource use. Fields are empty where their
/// source could not be read.
struct process_sample {
  /// Resident set size (/proc/self/statm, second field, times the page size).
  std::optional<double> resident_memory_bytes;
  /// Virtual memory size (/proc/self/statm, first field, times the page size).
  std::optional<double> virtual_memory_bytes;
  /// Entries of /proc/self/fd.
  std::optional<double> open_fds;
  /// The soft RLIMIT_NOFILE.
  std::optional<double> max_fds;
  /// When the process started, in seconds since the Unix epoch (/proc/self/stat
  /// field 22, in clock ticks after boot, plus /proc/stat's btime).
  std::optional<double> start_time_seconds;
  /// User plus system CPU time (/proc/self/stat fields 14 and 15).
  std::optional<double> cpu_seconds;
  /// glibc mallinfo2(): bytes handed out by malloc and not freed, in the
  /// arenas (uordblks) plus in chunks mmapped on their own (hblkhd).
  std::optional<double> heap_in_use_bytes;
  /// glibc mallinfo2(): free bytes the allocator holds in its arenas for
  /// reuse (fordblks): resident or not, but not in use.
  std::optional<double> heap_free_bytes;
};

/// Reads the process' resource use now. Any thread. mallinfo2() walks the
/// free lists of every malloc arena under that arena's lock: cheap at a
/// scrape's rate (well under a millisecond here), not for a hot path.
process_sample sample_process();

/// The process metrics, registered in a registry and refreshed on demand.
/// Names: process_resident_memory_bytes, process_virtual_memory_bytes,
/// process_open_fds, process_max_fds, process_start_time_seconds,
/// process_cpu_seconds_total, metronome:heap_in_use_bytes,
/// metronome:heap_free_bytes.
class process_metrics {
public:
  /// Registers the metrics in `r`, which must outlive this object. Takes a
  /// first sample. Any thread.
  explicit process_metrics(registry& r);

  /// Samples the process and updates the metrics; call right before
  /// rendering. Thread-safe (concurrent scrapes serialise here).
  void refresh();

private:
  std::mutex mtx_;
  gauge& resident_;
  gauge& virtual_;
  gauge& open_fds_;
  gauge& max_fds_;
  gauge& start_time_;
  counter& cpu_;
  gauge* heap_in_use_ = nullptr;
  gauge* heap_free_ = nullptr;
  /// The CPU time already added to cpu_ (a counter only goes up).
  double cpu_reported_ = 0;
};

} // namespace metronome::prometheus
