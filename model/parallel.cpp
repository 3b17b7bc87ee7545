#include "model/parallel.hpp"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model/environment.hpp"

namespace metronome {

namespace {

thread_local bool inside_job = false;

class pool {
public:
  explicit pool(int threads) {
    for (int i = 1; i < threads; ++i)
      workers_.emplace_back([this, i] { work(i); });
  }

  ~pool() {
    {
      std::lock_guard guard{mtx_};
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_)
      w.join();
  }

  int size() const {
    return int(workers_.size()) + 1;
  }

  void run(int64_t begin, int64_t end, int parts, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard one_job{job_mtx_}; // one job at a time
    {
      std::lock_guard guard{mtx_};
      fn_ = &fn;
      begin_ = begin;
      end_ = end;
      parts_ = parts;
      pending_ = parts - 1;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    inside_job = true;
    try {
      range(0, fn);
    } catch (...) {
      std::lock_guard guard{mtx_};
      if (!error_)
        error_ = std::current_exception();
    }
    inside_job = false;
    std::unique_lock lock{mtx_};
    done_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
    if (error_)
      std::rethrow_exception(error_);
  }

private:
  void range(int part, const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t n = end_ - begin_;
    const int64_t lo = begin_ + n * part / parts_, hi = begin_ + n * (part + 1) / parts_;
    if (lo < hi)
      fn(lo, hi);
  }

  void work(int index) {
    inside_job = true;
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t, int64_t)>* fn = nullptr;
      {
        std::unique_lock lock{mtx_};
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_)
          return;
        seen = generation_;
        if (index >= parts_)
          continue; // this job uses fewer threads
        fn = fn_;
      }
      try {
        range(index, *fn);
      } catch (...) {
        std::lock_guard guard{mtx_};
        if (!error_)
          error_ = std::current_exception();
      }
      std::lock_guard guard{mtx_};
      if (--pending_ == 0)
        done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex job_mtx_;
  std::mutex mtx_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t begin_ = 0, end_ = 0;
  int parts_ = 1;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

pool& global_pool() {
  static pool p(parallel_threads());
  return p;
}

} // namespace

int parallel_threads() {
  static const int n = [] {
    const int cores = std::max(1, int(std::thread::hardware_concurrency()));
    const auto want = env_integer("METRONOME_THREADS", 1, 4096,
                                  "expected 1 to 4096; " + std::to_string(cores));
    return want ? int(*want) : cores;
  }();
  return n;
}

void parallel_for(int64_t begin, int64_t end, int64_t min_per_thread,
                  const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t n = end - begin;
  if (n <= 0)
    return;
  auto& p = global_pool();
  int parts = int(std::min<int64_t>(p.size(), std::max<int64_t>(1, n / std::max<int64_t>(1, min_per_thread))));
  if (parts <= 1 || inside_job) {
    fn(begin, end);
    return;
  }
  p.run(begin, end, parts, fn);
}

} // namespace metronome
