#pragma once
// Monitors that end with the actor that made them.
//
// CAF 0.17 keeps a monitor as a record (default_attachable) in the
// *monitored* actor, with weak references to both actors. Nothing removes it
// when the monitoring actor ends: only the monitored actor's own exit (which
// fires it) or demonitor(). A per-request actor that monitors a long-lived
// one (the scheduler, the frontend, a client actor that stays) and ends
// without demonitor leaves its record there for the long-lived actor's
// lifetime, and the record's weak reference keeps the dead actor's storage
// (control block plus actor object, about 1.5 KB) allocated: a leak per
// request (issue 39).
//
// scoped_monitors pairs each monitor with its demonitor. Kept in a stateful
// actor's state, its destructor runs when the state is destroyed, which CAF
// does on every way an actor ends (stateful_actor::on_exit: after quit(),
// an unhandled exception, an exit message, or from on_destroy when the actor
// became unreachable), so no exit path has to remember the cleanup.

#include <vector>

#include "caf/all.hpp"

namespace metronome {

class scoped_monitors {
public:
  scoped_monitors() = default;
  scoped_monitors(const scoped_monitors&) = delete;
  scoped_monitors& operator=(const scoped_monitors&) = delete;

  /// Removes every monitor added here.
  ~scoped_monitors() {
    clear();
  }

  /// Has `self` (the actor whose state holds this object) monitor `whom` (a
  /// caf::actor or a typed handle) and remembers it for removal. A null handle is ignored. Only on `self`'s
  /// thread (its handlers and its state's constructor/destructor).
  template <class Handle>
  void add(caf::local_actor* self, const Handle& whom) {
    if (!whom)
      return;
    self_ = self;
    self->monitor(whom);
    watched_.push_back(whom.address());
  }

  /// Removes every monitor added so far; later add() calls work again.
  /// Removing the monitor of an actor that already died does nothing (its
  /// record went with it). `self`'s thread.
  void clear() {
    for (const auto& addr : watched_)
      self_->demonitor(addr);
    watched_.clear();
  }

  /// How many monitors are held (added and not yet removed).
  size_t size() const noexcept {
    return watched_.size();
  }

private:
  caf::local_actor* self_ = nullptr;
  /// Weak references: remembering whom we watch must not keep it alive.
  std::vector<caf::actor_addr> watched_;
};

} // namespace metronome
