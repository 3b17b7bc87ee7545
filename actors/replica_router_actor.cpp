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
  std::vector<scheduler_actor> schedulers;
  std::shared_ptr<engine_status> status;
  std::shared_ptr<engine_metrics> metrics;
  /// The request actors placed and not yet ended (monitored), by address.
  std::unordered_map<caf::actor_addr, uint64_t> by_addr;
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

replica_router_actor::behavior_type replica_router_behavior(
  self_ptr self, replica_router_config config, std::vector<scheduler_actor> schedulers,
  std::shared_ptr<engine_status> status, std::shared_ptr<engine_metrics> metrics) {
  auto& st = self->state;
  st.core = std::make_unique<replica_router>(config);
  st.schedulers = std::move(schedulers);
  st.status = std::move(status);
  st.metrics = std::move(metrics);
  self->set_down_handler([=](caf::down_msg& dm) {
    // A request actor ended (finished, cancelled, failed): its tokens no
    // longer load its replica.
    auto& s = self->state;
    if (auto i = s.by_addr.find(dm.source); i != s.by_addr.end()) {
      s.core->finish(i->second);
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
                                            "the engine is unavailable: the executors of all "
                                              "its replicas keep failing",
                                            ""});
        return;
      }
      s.core->place(m.seq_id, *replica, m.prompt, m.params.max_tokens);
      if (auto [it, fresh] = s.by_addr.emplace(sender.address(), m.seq_id); fresh)
        self->monitor(sender);
      else
        it->second = m.seq_id;
      if (s.metrics)
        s.metrics->on_routed(*replica);
      caf::send_as(sender, s.schedulers[size_t(*replica)], std::move(m));
    },
    [=](cancel_atom, uint64_t id, finish_kind reason) {
      auto& s = self->state;
      if (auto replica = s.core->replica_of(id))
        self->send(s.schedulers[size_t(*replica)], cancel_atom::value, id, reason);
    },
    [=](ready_atom, int32_t replica, bool up) { set_membership(self, replica, up); },
  };
}

} // namespace

replica_router_actor spawn_replica_router(caf::actor_system& sys, replica_router_config config,
                                          std::vector<scheduler_actor> schedulers,
                                          std::shared_ptr<engine_status> status,
                                          std::shared_ptr<engine_metrics> metrics) {
  if (schedulers.empty() || int32_t(schedulers.size()) != config.replicas)
    throw std::invalid_argument("spawn_replica_router: one scheduler per replica");
  return sys.spawn(replica_router_behavior, config, std::move(schedulers), std::move(status),
                   std::move(metrics));
}

} // namespace metronome
