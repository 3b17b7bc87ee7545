#pragma once
// Tells a listener, from a thread of its own, when work enqueued on a CUDA
// stream has ended, without polling: the CUDA runner's half of
// model_runner::set_step_listener.
//
// Design note. After each step the runner calls watch(stream), which records
// an event from a pool on the stream and queues it for the notifier's
// thread. The thread waits for the queued events in order with
// cudaEventSynchronize; the events are made with cudaEventBlockingSync, so
// the wait sleeps in the driver until the device signals the event instead
// of spinning. Then the event goes back to the pool (never earlier: an event
// is recorded again only once no thread waits on it) and the listener is
// called. The thread's state (queue, pool, listener) is shared between the
// notifier and the thread, and is destroyed, events included, by whichever
// lets go of it last: a thread stuck in a step that never ends is detached
// after a bounded wait instead of holding the destructor forever.

#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include <cuda_runtime_api.h>

namespace metronome::gpu {

class step_notifier {
public:
  /// Starts the thread, which makes `device` current first. `listener` is
  /// called on that thread once per watch(), after the work enqueued on the
  /// stream before it has ended (also when the wait fails: a device error is
  /// then the caller's to find, as cudaEventQuery reports it). `stop_wait`:
  /// how long the destructor waits for the thread before it detaches it.
  /// Makes the first events on the calling thread (`device` current).
  step_notifier(int device, std::function<void()> listener,
                std::chrono::milliseconds stop_wait = std::chrono::milliseconds(1000));

  /// Stops the thread: no listener call begins once it has started; a call
  /// in progress ends first. Returns once the thread has ended, or after
  /// stop_wait with the thread detached (waiting on a step that does not
  /// end); then the thread ends, and frees the events, whenever that wait
  /// does.
  ~step_notifier();

  step_notifier(const step_notifier&) = delete;
  step_notifier& operator=(const step_notifier&) = delete;

  /// Replaces the listener; an empty one stops the calls. A call in
  /// progress ends first. Any thread.
  void set_listener(std::function<void()> listener);

  /// Records an event on `stream` after the work enqueued so far and has
  /// the thread call the listener once it has ended. On the thread that
  /// enqueues on `stream` (device current). Throws cuda_error when the
  /// event cannot be made or recorded (nothing is then queued).
  void watch(cudaStream_t stream);

  /// Events made so far (the pool grows only while every event is queued).
  size_t events_made() const;

private:
  struct shared;
  static void run(std::shared_ptr<shared> s);

  std::shared_ptr<shared> state_;
  std::chrono::milliseconds stop_wait_;
  std::thread thread_;
};

} // namespace metronome::gpu
