#pragma once
// The KV cache allocator actor: owns the page bookkeeping (kv_page_pool) of
// one executor's KV memory; the executor owns the memory.

#include <memory>

#include "actors/interfaces.hpp"

namespace metronome {

struct engine_status;

/// Spawns the allocator for a pool of `num_pages` pages (0 until the
/// executor reports its memory). Publishes usage into `status` if given.
kv_cache_actor spawn_kv_cache(caf::actor_system& sys, int32_t num_pages,
                              std::shared_ptr<engine_status> status = nullptr);

} // namespace metronome
