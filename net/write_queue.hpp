#pragma once
// What a session has queued for its client, bounded in bytes: a client that
// stops reading is disconnected rather than buffered without end. Both the
// HTTP and the WebSocket session keep one; used on the session's strand only.

#include <cstddef>
#include <deque>
#include <utility>

namespace metronome::net {

template <class Entry>
class write_queue {
public:
  explicit write_queue(size_t limit) : limit_(limit) {
  }

  /// Queues `e`, which puts `bytes` on the wire. Returns false, and keeps
  /// returning false for every later push, once the queue holds more than
  /// the limit: the caller then closes the connection.
  bool push(Entry e, size_t bytes) {
    if (overflowed_)
      return false;
    bytes_ += bytes;
    items_.push_back({std::move(e), bytes});
    overflowed_ = bytes_ > limit_;
    return !overflowed_;
  }

  /// The oldest entry has been written.
  void pop() {
    bytes_ -= items_.front().bytes;
    items_.pop_front();
  }

  const Entry& operator[](size_t i) const {
    return items_[i].entry;
  }
  const Entry& front() const {
    return items_.front().entry;
  }
  bool empty() const {
    return items_.empty();
  }
  size_t size() const {
    return items_.size();
  }
  size_t bytes() const {
    return bytes_;
  }
  bool overflowed() const {
    return overflowed_;
  }

private:
  struct item {
    Entry entry;
    size_t bytes;
  };
  std::deque<item> items_;
  size_t bytes_ = 0;
  size_t limit_;
  bool overflowed_ = false;
};

} // namespace metronome::net
