#include "gpu/step_notifier.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <vector>

#include "gpu/cuda_check.hpp"

namespace metronome::gpu {

namespace {

/// Steps in flight at once in the CUDA engine: the pool starts this big.
constexpr int initial_events = 2;

cudaEvent_t make_event() {
  cudaEvent_t e = nullptr;
  // BlockingSync: cudaEventSynchronize sleeps until the device signals the
  // event; without it the driver spins.
  METRONOME_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
  return e;
}

} // namespace

/// What the thread and the notifier share; the last of them to let go of it
/// destroys the events.
struct step_notifier::shared {
  int device = 0;
  mutable std::mutex mutex;
  std::condition_variable wake;   // the thread: work queued, or stop
  std::condition_variable exited; // the destructor: the thread has ended
  std::deque<cudaEvent_t> queue;  // recorded, oldest first; the front is waited on
  std::vector<cudaEvent_t> pool;  // free: no thread waits on them
  std::vector<cudaEvent_t> all;   // every event made
  std::function<void()> listener;
  bool stop = false;
  bool ended = false;

  ~shared() {
    for (auto e : all)
      cudaEventDestroy(e);
  }
};

step_notifier::step_notifier(int device, std::function<void()> listener,
                             std::chrono::milliseconds stop_wait)
  : state_(std::make_shared<shared>()), stop_wait_(stop_wait) {
  state_->device = device;
  state_->listener = std::move(listener);
  for (int i = 0; i < initial_events; ++i) {
    state_->all.push_back(make_event());
    state_->pool.push_back(state_->all.back());
  }
  thread_ = std::thread(&step_notifier::run, state_);
}

step_notifier::~step_notifier() {
  std::function<void()> listener; // destroyed here, after the lock
  std::unique_lock lock(state_->mutex);
  state_->stop = true;
  listener = std::move(state_->listener);
  state_->listener = nullptr;
  state_->wake.notify_all();
  const bool ended = state_->exited.wait_for(lock, stop_wait_, [&] { return state_->ended; });
  lock.unlock();
  if (ended)
    thread_.join();
  else
    thread_.detach(); // in a wait that has not ended; the shared state outlives us
}

void step_notifier::set_listener(std::function<void()> listener) {
  std::unique_lock lock(state_->mutex);
  std::swap(state_->listener, listener);
  lock.unlock();
  // The old listener is destroyed here, outside the lock.
}

void step_notifier::watch(cudaStream_t stream) {
  cudaEvent_t e = nullptr;
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->pool.empty()) {
      e = state_->pool.back();
      state_->pool.pop_back();
    }
  }
  if (!e) {
    e = make_event();
    std::lock_guard lock(state_->mutex);
    state_->all.push_back(e);
  }
  const cudaError_t st = cudaEventRecord(e, stream);
  std::lock_guard lock(state_->mutex);
  if (st != cudaSuccess) {
    state_->pool.push_back(e);
    throw_cuda_error(st, "cudaEventRecord(step notifier)", __FILE__, __LINE__);
  }
  state_->queue.push_back(e);
  state_->wake.notify_one();
}

size_t step_notifier::events_made() const {
  std::lock_guard lock(state_->mutex);
  return state_->all.size();
}

void step_notifier::run(std::shared_ptr<shared> s) {
  // Events belong to the device's context; the wait needs it current.
  if (cudaSetDevice(s->device) != cudaSuccess)
    cudaGetLastError(); // the waits below then report the problem
  std::unique_lock lock(s->mutex);
  for (;;) {
    s->wake.wait(lock, [&] { return s->stop || !s->queue.empty(); });
    if (s->stop)
      break;
    const cudaEvent_t e = s->queue.front(); // stays queued (in use) while waited on
    lock.unlock();
    // Sleeps until the device signals the event (cudaEventBlockingSync). A
    // failure is not ours to report: the listener's owner finds it when it
    // asks about the step (cudaEventQuery returns the same error).
    if (cudaEventSynchronize(e) != cudaSuccess)
      cudaGetLastError();
    lock.lock();
    s->queue.pop_front();
    s->pool.push_back(e); // free again: nothing waits on it any more
    if (!s->stop && s->listener) {
      try {
        s->listener(); // under the lock: the destructor never races a call
      } catch (...) {
        // A listener must not throw; the thread goes on regardless.
      }
    }
  }
  s->ended = true;
  s->exited.notify_all();
}

} // namespace metronome::gpu
