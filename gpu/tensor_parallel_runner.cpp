#include "gpu/tensor_parallel_runner.hpp"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#include "gpu/collective.hpp"
#include "model/model_weights.hpp"
#include "model/tensor_parallel.hpp"

namespace metronome {

/// A thread that runs one task at a time for its rank. Tasks are the rank
/// runner's own calls, each bounded by the runner's step timeout, so the
/// wait for one is bounded by it too.
class rank_thread {
public:
  rank_thread() : thread_([this] { loop(); }) {
  }

  ~rank_thread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  /// Starts `task` on the thread (none may be running).
  void post(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      task_ = std::move(task);
      busy_ = true;
    }
    wake_.notify_all();
  }

  /// Waits for the posted task; its exception, if any, or null.
  std::exception_ptr wait() {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return !busy_; });
    return std::exchange(error_, nullptr);
  }

private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return busy_ || stop_; });
      if (!busy_)
        return;
      auto task = std::move(task_);
      lock.unlock();
      std::exception_ptr error;
      try {
        task();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      busy_ = false;
      done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::function<void()> task_;
  std::exception_ptr error_;
  bool busy_ = false, stop_ = false;
  std::thread thread_; // last: starts once the members above exist
};

namespace {

/// Runs f(r) for r = 1..N-1 on their threads and f(0) here, then waits for
/// all; returns the first exception (rank order), or null.
std::exception_ptr on_all_ranks(std::vector<std::unique_ptr<rank_thread>>& threads,
                                const std::function<void(size_t)>& f) {
  for (size_t r = 1; r < threads.size(); ++r)
    threads[r]->post([&f, r] { f(r); });
  std::exception_ptr first;
  try {
    f(0);
  } catch (...) {
    first = std::current_exception();
  }
  for (size_t r = 1; r < threads.size(); ++r)
    if (auto e = threads[r]->wait(); e && !first)
      first = e;
  return first;
}

} // namespace

tensor_parallel_runner::tensor_parallel_runner(std::shared_ptr<const model_folder> model,
                                               const cuda_runner_options& options) {
  if (!model)
    throw std::invalid_argument("tensor parallel: no model");
  const int32_t n = options.tensor_parallel;
  config_ = model->config;
  const tensor_parallel_plan plan(model->config, n, (model->dir / "config.json").string());
  devices_ = options.tensor_parallel_devices;
  if (devices_.empty())
    for (int32_t r = 0; r < n; ++r)
      devices_.push_back(options.device + r);
  if (int32_t(devices_.size()) != n)
    throw std::invalid_argument("tensor parallel: " + std::to_string(devices_.size())
                                + " devices listed for " + std::to_string(n) + " ranks");
  for (int d : devices_)
    if (const std::string p = cuda_device_problem(d); !p.empty())
      throw std::invalid_argument("tensor parallel: cuda:" + std::to_string(d) + ": " + p);
  std::map<int, int32_t> per_device;
  for (int d : devices_)
    ++per_device[d];

  // The collectives carry x: up to max(max_num_batched_tokens,
  // max_batch_size) rows of hidden_size floats.
  const auto& lim = options.limits;
  const size_t rows = size_t(std::max(lim.max_num_batched_tokens, lim.max_batch_size));
  auto group = gpu::make_collective_group(
    devices_,
    gpu::parse_collective_kind(options.tensor_parallel_collective, "tensor_parallel_collective"),
    rows * size_t(config_.hidden_size), lim.step_timeout_s());
  describe_ = plan.describe() + " over " + group.front()->describe();

  runners_.resize(size_t(n));
  threads_.resize(size_t(n));
  for (int32_t r = 1; r < n; ++r)
    threads_[size_t(r)] = std::make_unique<rank_thread>();
  std::exception_ptr failed = on_all_ranks(threads_, [&](size_t r) {
    cuda_runner_options o = options;
    o.tensor_parallel = 1;
    o.tensor_parallel_devices.clear();
    o.device = devices_[r];
    o.device_replicas = per_device[o.device];
    o.gpu_memory_fraction = options.gpu_memory_fraction / double(o.device_replicas);
    o.collective = group[r];
    runners_[r] = make_cuda_runner(shard_model(model, plan, int32_t(r)), o);
  });
  if (failed) {
    // Tear down the ranks that started, each on its own thread.
    on_all_ranks(threads_, [&](size_t r) { runners_[r].reset(); });
    threads_.clear();
    std::rethrow_exception(failed);
  }
  num_pages_ = runners_.front()->num_pages();
  for (const auto& r : runners_)
    num_pages_ = std::min(num_pages_, r->num_pages());
}

tensor_parallel_runner::~tensor_parallel_runner() {
  // Each runner goes on the thread that made it; steps in flight finish
  // first (bounded), which needs every rank's share of them: all at once.
  on_all_ranks(threads_, [&](size_t r) { runners_[r].reset(); });
}

void tensor_parallel_runner::check_usable() const {
  if (broken_)
    throw std::runtime_error("tensor parallel: a rank failed earlier; the group must be "
                             "restarted");
}

void tensor_parallel_runner::for_each_rank(const std::function<void(model_runner&)>& f) {
  check_usable();
  if (auto e = on_all_ranks(threads_, [&](size_t r) { f(*runners_[r]); })) {
    broken_ = true;
    std::rethrow_exception(e);
  }
}

step_output tensor_parallel_runner::execute(const step_plan& plan) {
  submit(plan);
  return collect();
}

void tensor_parallel_runner::submit(const step_plan& plan) {
  check_usable();
  std::vector<char> plan_errors(runners_.size(), 0);
  auto e = on_all_ranks(threads_, [&](size_t r) {
    try {
      runners_[r]->submit(plan);
    } catch (const plan_error&) {
      plan_errors[r] = 1;
      throw;
    }
  });
  if (!e)
    return;
  // A plan every rank refused changed nothing on any of them: the group is
  // intact (the ranks hold the same state and check plans alike).
  if (std::find(plan_errors.begin(), plan_errors.end(), 0) != plan_errors.end())
    broken_ = true;
  std::rethrow_exception(e);
}

size_t tensor_parallel_runner::in_flight() const {
  return runners_.front()->in_flight();
}

bool tensor_parallel_runner::ready() {
  if (broken_)
    return in_flight() > 0;
  // Between calls the ranks' threads are idle: their runners' ready() (an
  // event query and the age of the oldest step) may be asked from here.
  for (const auto& r : runners_)
    if (!r->ready())
      return false;
  return true;
}

step_output tensor_parallel_runner::collect() {
  check_usable();
  std::vector<step_output> outs(runners_.size());
  if (auto e = on_all_ranks(threads_, [&](size_t r) { outs[r] = runners_[r]->collect(); })) {
    broken_ = true;
    std::rethrow_exception(e);
  }
  for (size_t r = 1; r < outs.size(); ++r) {
    bool same = outs[r].tokens.size() == outs[0].tokens.size();
    for (size_t i = 0; same && i < outs[0].tokens.size(); ++i)
      same = outs[r].tokens[i].id == outs[0].tokens[i].id
             && outs[r].tokens[i].token == outs[0].tokens[i].token;
    if (!same) {
      broken_ = true;
      throw std::runtime_error("tensor parallel: rank " + std::to_string(r)
                               + " reports other ids than rank 0 for step "
                               + std::to_string(outs[0].step));
    }
  }
  // The step's device time is its slowest rank's.
  for (size_t r = 1; r < outs.size(); ++r)
    outs[0].device_seconds = std::max(outs[0].device_seconds, outs[r].device_seconds);
  return std::move(outs[0]);
}

void tensor_parallel_runner::set_step_listener(std::function<void()> on_step_done) {
  // Every rank calls it when its share of a step ends; the caller then asks
  // ready(), which needs all of them (calls that find nothing are allowed).
  for_each_rank([&](model_runner& r) { r.set_step_listener(on_step_done); });
}

bool tensor_parallel_runner::device_stuck() {
  for (const auto& r : runners_)
    if (r->device_stuck())
      return true;
  return false;
}

bool tensor_parallel_runner::arm_device_fault() {
  return runners_.front()->arm_device_fault();
}

int32_t tensor_parallel_runner::page_size() const {
  return runners_.front()->page_size();
}

std::string tensor_parallel_runner::device() const {
  std::string s;
  for (int d : devices_) {
    if (!s.empty())
      s += '+';
    s += "cuda:";
    s += std::to_string(d);
  }
  return s;
}

std::vector<memory_plan_entry> tensor_parallel_runner::memory_plan() const {
  std::vector<memory_plan_entry> out;
  for (size_t r = 0; r < runners_.size(); ++r)
    for (auto e : runners_[r]->memory_plan()) {
      e.name = "rank" + std::to_string(r) + "_" + e.name;
      out.push_back(std::move(e));
    }
  return out;
}

} // namespace metronome
