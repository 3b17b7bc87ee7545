#pragma once
// The worker registry: the front end's door for replicas that run in other
// processes (`metronome worker`, docs/scale-out.md).
//
// It is published on workers.listen through CAF's middleman. A worker
// connects, sends worker_join and, once admitted, is a replica like the
// local ones: the registry gives it a worker slot of the router (a replica
// index after the local replicas; the slot its name held before, if free,
// so that its /metrics series stay its own), and the router forwards
// admissions to the worker's scheduler; tokens go from that scheduler to
// the request actors over the same connection.
//
// NOTE on failure detection. Two signals, either of which removes a worker:
//   - its agent's DOWN: the connection closed (the process died: at once),
//     or CAF's connection heartbeat found it silent for
//     middleman.connection-timeout (set from workers.timeout_ms on both
//     sides: a stopped or partitioned process);
//   - a heartbeat of ours unanswered within workers.timeout_ms: every
//     workers.heartbeat_ms the registry asks the agent for its health and
//     load (the answer fills the replica's gauges and measures its clock
//     offset). This one also catches a process whose network thread runs
//     but whose actors do not, and it works without the middleman's
//     heartbeat.
// A removed worker's requests are the router's to re-run or fail
// (replica_router_actor.hpp). A worker that comes back joins again.
//
// Refused with worker_errc::refused and the reason: another wire_version,
// another model (model_fingerprint: the front end tokenizes and decodes
// for its workers), a shorter context than the front end's, or no free
// slot (workers.max_workers).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "actors/interfaces.hpp"

namespace metronome {

struct engine_status;
class engine_metrics;

/// Settings of the registry (workers.* in metronome.yaml).
struct worker_registry_config {
  /// The router's first worker slot (the local replicas come first) and how
  /// many there are.
  int32_t first_slot = 1;
  int32_t slots = 8;
  std::chrono::milliseconds heartbeat{500};
  std::chrono::milliseconds timeout{3000};
  /// What a worker must match: the front end's model fingerprint and
  /// context (a worker's may be longer).
  uint64_t model_fingerprint = 0;
  std::string model_name;
  int32_t max_model_len = 0;
};

/// Spawns the registry. It attaches workers to `router` (its worker slots:
/// config.first_slot .. + config.slots), publishes their load to `status`
/// (replica gauges sized for them) and counts joins, losses and refusals
/// in `metrics` (may be null). Any thread; spawn_engine calls it when
/// workers.listen is set.
worker_registry_actor spawn_worker_registry(caf::actor_system& sys,
                                            worker_registry_config config,
                                            replica_router_actor router,
                                            std::shared_ptr<engine_status> status,
                                            std::shared_ptr<engine_metrics> metrics);

/// A fingerprint of what a worker and its front end must agree on: the
/// tokenizer's file and the model's shape (vocabulary, layers, heads,
/// sizes, context, end-of-sequence ids). Any thread.
uint64_t model_fingerprint(const std::string& tokenizer_file_bytes, const std::string& shape);

} // namespace metronome
