#include "actors/worker_agent.hpp"

#include "actors/engine.hpp"
#include "actors/scheduler_actor.hpp"

namespace metronome {

worker_agent_actor spawn_worker_agent(caf::actor_system& sys,
                                      std::shared_ptr<const engine_status> status,
                                      std::shared_ptr<std::atomic<int64_t>> last_ping_ns) {
  return sys.spawn([status, last_ping_ns](worker_agent_actor::pointer self)
                     -> worker_agent_actor::behavior_type {
    return {
      [=](ping_atom, int64_t) -> worker_health {
        const auto now = engine_now(self).count();
        last_ping_ns->store(now);
        const auto& s = *status;
        worker_health h;
        h.ready = s.ready;
        h.degraded = s.degraded;
        if (h.degraded)
          h.reason = s.reason();
        h.waiting = s.waiting;
        h.running = s.running;
        h.kv_used_pages = s.kv_used_pages;
        h.kv_total_pages = s.kv_total_pages;
        h.live_requests = s.live_requests;
        h.now_ns = now;
        return h;
      },
    };
  });
}

} // namespace metronome
