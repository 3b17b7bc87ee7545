#include "actors/worker_registry.hpp"

#include <cstdlib>
#include <vector>

#include <spdlog/spdlog.h>

#include "actors/engine.hpp"
#include "actors/engine_metrics.hpp"
#include "actors/scheduler_actor.hpp"

namespace metronome {

namespace {

/// One worker slot of the router.
struct worker_slot {
  /// Empty while no worker holds the slot; else the worker's name.
  std::string name;
  worker_agent_actor agent;
  caf::actor scheduler;
  /// A heartbeat is on its way (at most one per worker).
  bool pinging = false;
  /// Bumped on every attach and loss: answers meant for an earlier holder
  /// of the slot are told apart.
  uint64_t generation = 0;
  int64_t clock_offset_ns = 0;
  /// The name that held the slot last (kept after a loss: the same worker
  /// coming back gets its slot, and its /metrics series, again).
  std::string last_name;
};

struct worker_registry_state {
  worker_registry_config config;
  replica_router_actor router;
  std::shared_ptr<engine_status> status;
  std::shared_ptr<engine_metrics> metrics;
  std::vector<worker_slot> slots;
  static inline const char* name = "worker-registry";
};

using self_ptr = worker_registry_actor::stateful_pointer<worker_registry_state>;

int32_t replica_of(self_ptr self, size_t slot) {
  return self->state.config.first_slot + int32_t(slot);
}

void count(self_ptr self, const char* event) {
  if (self->state.metrics)
    self->state.metrics->on_worker_event(event);
}

/// The worker in `slot` is gone: out of the router (its requests re-run or
/// fail there), its gauges zeroed, its agent no longer watched.
void lose(self_ptr self, size_t slot, const std::string& reason) {
  auto& st = self->state;
  auto& w = st.slots[slot];
  if (w.name.empty())
    return;
  const auto replica = replica_of(self, slot);
  spdlog::warn("worker {} (replica {}) lost: {}", w.name, replica, reason);
  self->demonitor(w.agent.address());
  self->send(st.router, worker_lost{replica, reason});
  if (replica < st.status->num_replicas())
    st.status->publish_load(replica, 0, 0, 0, 0);
  count(self, "lost");
  w.last_name = std::move(w.name);
  w.name.clear();
  w.agent = nullptr;
  w.scheduler = nullptr;
  w.pinging = false;
  ++w.generation;
}

caf::error refuse(self_ptr self, const worker_join& j, std::string why) {
  spdlog::warn("worker {} refused: {}", j.name, why);
  count(self, "refused");
  return caf::make_error(worker_errc::refused, std::move(why));
}

/// Sends worker `slot` a heartbeat; its answer updates the replica's gauges
/// and clock offset, its absence removes the worker.
void ping(self_ptr self, size_t slot) {
  auto& st = self->state;
  auto& w = st.slots[slot];
  if (w.name.empty() || w.pinging)
    return;
  w.pinging = true;
  const auto generation = w.generation;
  const auto sent = engine_now(self).count();
  const auto timeout = st.config.timeout;
  self->request(w.agent, timeout, ping_atom::value, sent)
    .then(
      [=](worker_health& h) {
        auto& s = self->state;
        auto& x = s.slots[slot];
        if (x.generation != generation)
          return; // for an earlier holder of the slot
        x.pinging = false;
        const auto replica = replica_of(self, slot);
        if (h.degraded) {
          lose(self, slot, "its engine is degraded (" + h.reason + ")");
          return;
        }
        if (replica < s.status->num_replicas())
          s.status->publish_load(replica, h.waiting, h.running, h.kv_used_pages,
                                 h.kv_total_pages);
        // Its clock at the midpoint of the round trip, against ours.
        const auto received = engine_now(self).count();
        const int64_t offset = h.now_ns - (sent + (received - sent) / 2);
        if (std::llabs(offset - x.clock_offset_ns) > 1'000'000) {
          x.clock_offset_ns = offset;
          self->send(s.router, worker_attached{replica, x.scheduler, x.name, offset});
        }
      },
      [=](caf::error& e) {
        auto& x = self->state.slots[slot];
        if (x.generation != generation)
          return;
        lose(self, slot,
             e == caf::sec::request_timeout
               ? "no heartbeat answer within " + std::to_string(timeout.count()) + " ms"
               : "its heartbeat failed (" + self->system().render(e) + ")");
      });
}

/// The slot for a joining worker named `name`: the one that name held last
/// if free, else the first that was never held, else any free one; -1 when
/// all are held.
int32_t choose_slot(self_ptr self, const std::string& name) {
  auto& slots = self->state.slots;
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i].name.empty() && slots[i].last_name == name)
      return int32_t(i);
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i].name.empty() && slots[i].last_name.empty())
      return int32_t(i);
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i].name.empty())
      return int32_t(i);
  return -1;
}

caf::result<worker_welcome> join(self_ptr self, worker_join& j) {
  auto& st = self->state;
  const auto& c = st.config;
  if (j.version != wire_version)
    return refuse(self, j,
                  "the worker speaks wire version " + std::to_string(j.version)
                    + " and this front end " + std::to_string(wire_version)
                    + ": run the same Metronome release on both");
  if (j.model_fingerprint != c.model_fingerprint)
    return refuse(self, j,
                  "the worker serves another model (" + j.model_name + ") than this front end ("
                    + c.model_name
                    + "): they must share the tokenizer and the model's shape");
  if (j.max_model_len < c.max_model_len)
    return refuse(self, j,
                  "the worker's context is " + std::to_string(j.max_model_len)
                    + " tokens, shorter than this front end's " + std::to_string(c.max_model_len)
                    + ": it would refuse requests the front end accepts (lower "
                      "model.max_model_len here, or raise it there)");
  if (!j.scheduler || !j.agent)
    return refuse(self, j, "the join names no scheduler or no agent");
  if (j.name.empty())
    return refuse(self, j, "the worker has no name");
  auto agent = caf::actor_cast<worker_agent_actor>(j.agent);
  const auto now = engine_now(self).count();
  for (size_t i = 0; i < st.slots.size(); ++i) {
    auto& w = st.slots[i];
    if (w.name.empty())
      continue;
    if (w.agent == agent) // it joins again (it lost track of us, not we of it)
      return worker_welcome{replica_of(self, i), now};
    if (w.name == j.name)
      lose(self, i, "replaced by a new worker of the same name");
  }
  const auto slot = choose_slot(self, j.name);
  if (slot < 0)
    return refuse(self, j,
                  "all " + std::to_string(c.slots) + " worker slots are taken (workers.max_workers)");
  auto& w = st.slots[size_t(slot)];
  w.name = j.name;
  w.agent = agent;
  w.scheduler = j.scheduler;
  w.pinging = false;
  ++w.generation;
  // The worker's clock when it sent the join, against ours when it came:
  // off by the one-way delay until the first heartbeat measures it.
  w.clock_offset_ns = j.now_ns - now;
  self->monitor(agent);
  const auto replica = replica_of(self, size_t(slot));
  self->send(st.router, worker_attached{replica, w.scheduler, w.name, w.clock_offset_ns});
  count(self, "joined");
  st.status->ready = true; // a front end without local replicas is ready now
  spdlog::info("worker {} attached as replica {}: {} ({} KV pages of {} tokens, context {})",
               j.name, replica, j.device, j.kv_pages, j.page_size, j.max_model_len);
  ping(self, size_t(slot));
  return worker_welcome{replica, now};
}

worker_registry_actor::behavior_type registry_behavior(self_ptr self,
                                                       worker_registry_config config,
                                                       replica_router_actor router,
                                                       std::shared_ptr<engine_status> status,
                                                       std::shared_ptr<engine_metrics> metrics) {
  auto& st = self->state;
  st.config = std::move(config);
  st.router = std::move(router);
  st.status = std::move(status);
  st.metrics = std::move(metrics);
  st.slots.resize(size_t(st.config.slots));
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& s = self->state;
    for (size_t i = 0; i < s.slots.size(); ++i)
      if (!s.slots[i].name.empty() && s.slots[i].agent.address() == dm.source) {
        lose(self, i, "its connection closed (" + self->system().render(dm.reason) + ")");
        return;
      }
  });
  self->send(worker_registry_actor{self}, tick_atom::value, uint64_t(0));
  return {
    [=](worker_join& j) -> caf::result<worker_welcome> { return join(self, j); },
    [=](tick_atom, uint64_t n) {
      for (size_t i = 0; i < self->state.slots.size(); ++i)
        ping(self, i);
      self->delayed_send(worker_registry_actor{self}, self->state.config.heartbeat,
                         tick_atom::value, n + 1);
    },
  };
}

} // namespace

worker_registry_actor spawn_worker_registry(caf::actor_system& sys,
                                            worker_registry_config config,
                                            replica_router_actor router,
                                            std::shared_ptr<engine_status> status,
                                            std::shared_ptr<engine_metrics> metrics) {
  return sys.spawn(registry_behavior, std::move(config), std::move(router), std::move(status),
                   std::move(metrics));
}

uint64_t model_fingerprint(const std::string& tokenizer_file_bytes, const std::string& shape) {
  // FNV-1a, 64 bits: an identity check between two copies of a folder, not
  // a defence against forgery (the workers' network is trusted).
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 0x100000001b3ull;
    }
    h ^= 0xff; // a separator: ("ab", "c") and ("a", "bc") differ
    h *= 0x100000001b3ull;
  };
  mix(tokenizer_file_bytes);
  mix(shape);
  return h;
}

} // namespace metronome
