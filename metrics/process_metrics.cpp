#include "metrics/process_metrics.hpp"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#if __GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33)
#define METRONOME_HAVE_MALLINFO2 1
#endif
#endif

namespace metronome::prometheus {

namespace {

void read_statm(process_sample& out) {
  std::ifstream in("/proc/self/statm");
  double size = 0, resident = 0;
  if (!(in >> size >> resident))
    return;
  const double page = double(sysconf(_SC_PAGESIZE));
  out.virtual_memory_bytes = size * page;
  out.resident_memory_bytes = resident * page;
}

/// Boot time in seconds since the epoch (/proc/stat's btime).
std::optional<double> boot_time() {
  std::ifstream in("/proc/stat");
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with("btime "))
      return std::stod(line.substr(6));
  return std::nullopt;
}

void read_stat(process_sample& out) {
  std::ifstream in("/proc/self/stat");
  std::string text;
  if (!std::getline(in, text))
    return;
  // Field 2, the command name in parentheses, may hold spaces and ')':
  // the fields after it start after the last ')'.
  const auto close = text.rfind(')');
  if (close == std::string::npos)
    return;
  std::istringstream rest(text.substr(close + 1));
  std::vector<std::string> fields; // fields[0] is field 3 (state)
  for (std::string f; rest >> f;)
    fields.push_back(std::move(f));
  if (fields.size() < 20)
    return;
  const double ticks = double(sysconf(_SC_CLK_TCK));
  if (ticks <= 0)
    return;
  out.cpu_seconds = (std::stod(fields[14 - 3]) + std::stod(fields[15 - 3])) / ticks;
  if (auto boot = boot_time())
    out.start_time_seconds = *boot + std::stod(fields[22 - 3]) / ticks;
}

void read_fds(process_sample& out) {
  // Counts the descriptor that reads the folder too, as the Go and Python
  // clients do.
  DIR* dir = opendir("/proc/self/fd");
  if (!dir)
    return;
  double n = 0;
  while (auto* e = readdir(dir))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
      ++n;
  closedir(dir);
  out.open_fds = n;
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0)
    out.max_fds = lim.rlim_cur == RLIM_INFINITY ? -1.0 : double(lim.rlim_cur);
}

void read_heap([[maybe_unused]] process_sample& out) {
#ifdef METRONOME_HAVE_MALLINFO2
  const auto mi = mallinfo2();
  out.heap_in_use_bytes = double(mi.uordblks) + double(mi.hblkhd);
  out.heap_free_bytes = double(mi.fordblks);
#endif
}

void set_if(gauge& g, const std::optional<double>& v) {
  if (v)
    g.set(*v);
}

} // namespace

process_sample sample_process() {
  process_sample out;
  read_statm(out);
  read_stat(out);
  read_fds(out);
  read_heap(out);
  return out;
}

process_metrics::process_metrics(registry& r)
  : resident_(r.add_gauge("process_resident_memory_bytes", "Resident memory size in bytes.")),
    virtual_(r.add_gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.")),
    open_fds_(r.add_gauge("process_open_fds", "Number of open file descriptors.")),
    max_fds_(r.add_gauge("process_max_fds", "Maximum number of open file descriptors.")),
    start_time_(r.add_gauge("process_start_time_seconds",
                            "Start time of the process since unix epoch in seconds.")),
    cpu_(r.add_counter("process_cpu_seconds_total",
                       "Total user and system CPU time spent in seconds.")) {
#ifdef METRONOME_HAVE_MALLINFO2
  heap_in_use_ = &r.add_gauge("metronome:heap_in_use_bytes",
                              "Bytes allocated with malloc and not freed (glibc mallinfo2: "
                              "uordblks + hblkhd). Grows with a leak; RSS may not shrink when "
                              "it does.");
  heap_free_ = &r.add_gauge("metronome:heap_free_bytes",
                            "Free bytes glibc's allocator holds for reuse (mallinfo2 fordblks).");
#endif
  refresh();
}

void process_metrics::refresh() {
  const auto s = sample_process();
  std::lock_guard<std::mutex> guard(mtx_);
  set_if(resident_, s.resident_memory_bytes);
  set_if(virtual_, s.virtual_memory_bytes);
  set_if(open_fds_, s.open_fds);
  set_if(max_fds_, s.max_fds);
  set_if(start_time_, s.start_time_seconds);
  if (s.cpu_seconds && *s.cpu_seconds > cpu_reported_) {
    cpu_.inc(*s.cpu_seconds - cpu_reported_);
    cpu_reported_ = *s.cpu_seconds;
  }
  if (heap_in_use_)
    set_if(*heap_in_use_, s.heap_in_use_bytes);
  if (heap_free_)
    set_if(*heap_free_, s.heap_free_bytes);
}

} // namespace metronome::prometheus
