#include "actors/replica_router_actor.hpp"

#include <stdexcept>
#include <string>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "actors/engine.hpp"
#include "actors/engine_metrics.hpp"

namespace metronome {

namespace {

struct replica_router_state {
  std::unique_ptr<replica_router> core;
  /// Replica i's scheduler; null for a worker slot with no worker attached.
  std::vector<scheduler_actor> schedulers;
  /// Slots from this index on are workers' (other processes).
  int32_t first_worker = 0;
  /// Per replica: its engine clock minus ours (workers only; 0 locally).
  std::vector<int64_t> clock_offset_ns;
  std::shared_ptr<engine_status> status;
  std::shared_ptr<engine_metrics> metrics;
  /// The request actors placed and not yet ended (monitored), by address,
  /// and by sequence id (a worker's loss tells each of its own).
  std::unordered_map<caf::actor_addr, uint64_t> by_addr;
  std::unordered_map<uint64_t, request_actor> by_id;
  static inline const char* name = "replica-router";
};

using self_ptr = replica_router_actor::stateful_pointer<replica_router_state>;

void set_membership(self_ptr self, int32_t replica, bool up) {
  auto& st = self->state;
  if (replica < 0 || replica >= st.core->num_replicas())
    return;
  if (up == st.core->is_up(replica))
    return;
  if (up) {
    st.core->mark_up(replica);
    spdlog::info("replica {} re-joined the router ({} of {} up)", replica, st.core->num_up(),
                 st.core->num_replicas());
  } else {
    st.core->mark_down(replica);
    spdlog::warn("replica {} left the router ({} of {} up)", replica, st.core->num_up(),
                 st.core->num_replicas());
  }
  if (replica < st.status->num_replicas())
    st.status->replica(replica).up = up;
}

/// Forgets request `id` (placed on some replica): its load leaves it.
void forget(self_ptr self, uint64_t id) {
  auto& s = self->state;
  s.core->finish(id);
  if (auto i = s.by_id.find(id); i != s.by_id.end()) {
    s.by_addr.erase(i->second.address());
    self->demonitor(i->second.address());
    s.by_id.erase(i);
  }
}

/// The worker on `replica` is gone: it takes no more requests, and each
/// request placed on it hears so (it runs again elsewhere, or fails:
/// request_actor.cpp). Its scheduler is told to cancel them, in case it is
/// only slow and reads its mailbox again.
void lose_worker(self_ptr self, int32_t replica, const std::string& reason) {
  auto& s = self->state;
  if (replica < s.first_worker || replica >= s.core->num_replicas())
    return;
  auto old = std::move(s.schedulers[size_t(replica)]);
  s.schedulers[size_t(replica)] = nullptr;
  set_membership(self, replica, false);
  std::vector<std::pair<uint64_t, request_actor>> placed;
  for (const auto& [id, actor] : s.by_id)
    if (s.core->replica_of(id) == replica)
      placed.emplace_back(id, actor);
  for (auto& [id, actor] : placed) {
    if (old)
      self->send(old, cancel_atom::value, id, finish_kind::failed);
    self->send(actor, replica_lost{reason, old ? old.address() : caf::actor_addr()});
    forget(self, id);
  }
  if (!placed.empty())
    spdlog::warn("replica {}: {} requests it held run again elsewhere or fail", replica,
                 placed.size());
}

replica_router_actor::behavior_type replica_router_behavior(
  self_ptr self, replica_router_config config, std::vector<scheduler_actor> schedulers,
  std::shared_ptr<engine_status> status, std::shared_ptr<engine_metrics> metrics) {
  auto& st = self->state;
  st.core = std::make_unique<replica_router>(config);
  st.first_worker = int32_t(schedulers.size());
  st.schedulers = std::move(schedulers);
  st.schedulers.resize(size_t(config.replicas));
  st.clock_offset_ns.assign(size_t(config.replicas), 0);
  st.status = std::move(status);
  st.metrics = std::move(metrics);
  // Worker slots are down until a worker attaches.
  for (int32_t r = st.first_worker; r < config.replicas; ++r) {
    st.core->mark_down(r);
    if (r < st.status->num_replicas())
      st.status->replica(r).up = false;
  }
  self->set_down_handler([=](caf::down_msg& dm) {
    // A request actor ended (finished, cancelled, failed): its tokens no
    // longer load its replica.
    auto& s = self->state;
    if (auto i = s.by_addr.find(dm.source); i != s.by_addr.end()) {
      s.core->finish(i->second);
      s.by_id.erase(i->second);
      s.by_addr.erase(i);
    }
  });
  return {
    [=](admit_msg& m) {
      auto& s = self->state;
      // The sender is the request actor (interfaces.hpp): it stays the
      // sender of the forwarded admission, and hears from its replica.
      auto sender = caf::actor_cast<request_actor>(self->current_sender());
      const auto replica = s.core->choose(m.prompt, m.params.max_tokens);
      if (!replica) {
        self->send(sender, generation_error{{}, request_errc::unavailable,
                                            s.first_worker < s.core->num_replicas()
                                              ? "the engine is unavailable: none of its replicas "
                                                "is up (local executors failing, no worker "
                                                "attached)"
                                              : "the engine is unavailable: the executors of all "
                                                "its replicas keep failing",
                                            ""});
        return;
      }
      s.core->place(m.seq_id, *replica, m.prompt, m.params.max_tokens);
      if (auto [it, fresh] = s.by_addr.emplace(sender.address(), m.seq_id); fresh) {
        self->monitor(sender);
      } else {
        s.by_id.erase(it->second);
        it->second = m.seq_id;
      }
      s.by_id[m.seq_id] = sender;
      if (s.metrics)
        s.metrics->on_routed(*replica);
      // Arrival is on the engine clock of the replica's process.
      m.arrival_ns += s.clock_offset_ns[size_t(*replica)];
      caf::send_as(sender, s.schedulers[size_t(*replica)], std::move(m));
    },
    [=](cancel_atom, uint64_t id, finish_kind reason) {
      auto& s = self->state;
      if (auto replica = s.core->replica_of(id); replica && s.schedulers[size_t(*replica)])
        self->send(s.schedulers[size_t(*replica)], cancel_atom::value, id, reason);
    },
    [=](ready_atom, int32_t replica, bool up) {
      // Local replicas only: a worker's membership is the registry's.
      if (replica < self->state.first_worker)
        set_membership(self, replica, up);
    },
    [=](worker_attached& w) {
      auto& s = self->state;
      if (w.replica < s.first_worker || w.replica >= s.core->num_replicas() || !w.scheduler)
        return;
      const auto r = size_t(w.replica);
      s.clock_offset_ns[r] = w.clock_offset_ns;
      auto scheduler = caf::actor_cast<scheduler_actor>(w.scheduler);
      if (s.schedulers[r] == scheduler)
        return; // a new clock offset only
      if (s.schedulers[r])
        lose_worker(self, w.replica, "replaced by worker " + w.name);
      s.schedulers[r] = std::move(scheduler);
      set_membership(self, w.replica, true);
    },
    [=](worker_lost& w) { lose_worker(self, w.replica, w.reason); },
  };
}

} // namespace

replica_router_actor spawn_replica_router(caf::actor_system& sys, replica_router_config config,
                                          std::vector<scheduler_actor> schedulers,
                                          std::shared_ptr<engine_status> status,
                                          std::shared_ptr<engine_metrics> metrics,
                                          int32_t worker_slots) {
  if ((schedulers.empty() && worker_slots == 0) || worker_slots < 0
      || int32_t(schedulers.size()) + worker_slots != config.replicas)
    throw std::invalid_argument("spawn_replica_router: one scheduler per local replica, and "
                                "config.replicas counting the worker slots too");
  return sys.spawn(replica_router_behavior, config, std::move(schedulers), std::move(status),
                   std::move(metrics));
}

} // namespace metronome
