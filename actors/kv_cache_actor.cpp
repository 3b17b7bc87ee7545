#include "actors/kv_cache_actor.hpp"

#include "actors/engine.hpp"
#include "actors/kv_page_pool.hpp"

namespace metronome {

namespace {

struct kv_cache_state {
  kv_page_pool pool;
  std::shared_ptr<engine_status> status;
  static inline const char* name = "kv-cache";

  void publish() {
    if (status) {
      status->kv_used_pages = pool.used_pages();
      status->kv_total_pages = pool.num_pages();
    }
  }
};

kv_cache_actor::behavior_type kv_cache(kv_cache_actor::stateful_pointer<kv_cache_state> self,
                                       int32_t num_pages, std::shared_ptr<engine_status> status) {
  self->state.pool.reset(num_pages);
  self->state.status = std::move(status);
  self->state.publish();
  return {
    [=](alloc_atom, const std::vector<page_request>& requests) {
      auto& st = self->state;
      page_grant grant;
      for (const auto& r : requests) {
        auto pages = st.pool.grow(r.seq_id, r.pages);
        grant.pages.push_back(pages ? std::move(*pages) : std::vector<int32_t>{});
      }
      grant.free_pages = st.pool.free_pages();
      st.publish();
      return grant;
    },
    [=](free_atom, uint64_t seq) {
      self->state.pool.release(seq);
      self->state.publish();
    },
    [=](reset_atom, int32_t pages) {
      self->state.pool.reset(pages);
      self->state.publish();
    },
    [=](stats_atom) {
      const auto& p = self->state.pool;
      return kv_stats{p.num_pages(), p.used_pages(), p.sequences(), p.unmatched_frees()};
    },
  };
}

} // namespace

kv_cache_actor spawn_kv_cache(caf::actor_system& sys, int32_t num_pages,
                              std::shared_ptr<engine_status> status) {
  return sys.spawn(kv_cache, num_pages, std::move(status));
}

} // namespace metronome
