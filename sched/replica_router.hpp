#pragma once
// Which replica runs a request, when the engine runs several (data
// parallel: one scheduler, executor and KV cache per replica, one front
// end). Plain C++, no CAF: the router actor (actors/replica_router_actor.hpp)
// and the trace replay run the same object.
//
// NOTE on the routing rule. A request goes where the work ahead of it plus
// its own uncached prompt is smallest, counted in tokens:
//
//   cost(r) = load(r) - affinity_weight * cached(r)
//
// load(r) is the tokens the router has placed on replica r and not seen end
// (each request counts its prompt plus its expected output: max_tokens, or
// default_output_tokens when it gives none); cached(r) is the length of the
// request's longest whole-page prompt prefix that r was given recently, so
// that its prefix cache probably still holds it. With the default weight 1
// a cache hit is worth exactly the prefill it saves, so affinity can never
// pull a request onto a replica that has more than its prompt's length of
// extra work queued. Ties go to the replica with fewer requests, then to
// the lowest index: the same inputs always give the same replica.
//
// The prefix memory is the router's own record of what it sent where (an
// LRU of page-prefix hashes per replica), not the replicas' caches, which
// live on other threads: a replica may have evicted what the router still
// remembers (the request then just computes its prompt), and a replica
// whose executor restarted (mark_down) is forgotten at once. A hook for a
// truer signal is cached_tokens(): a replica could report its cache's
// contents and the router would use them instead.

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace metronome {

/// Settings of replica_router.
struct replica_router_config {
  /// Replicas behind the router (at least 1).
  int32_t replicas = 1;
  /// Tokens per KV page: prefixes are remembered in whole pages, as the
  /// replicas' prefix caches hold them.
  int32_t page_size = 16;
  /// Prefix affinity (engine.prefix_caching): off, only load counts.
  bool prefix_affinity = true;
  /// What a remembered cached token is worth against a token of load.
  double affinity_weight = 1.0;
  /// Page prefixes remembered per replica (least recently used dropped).
  int32_t remembered_pages = 8192;
  /// A request's expected output when it sets no max_tokens.
  int32_t default_output_tokens = 256;
};

/// Routes requests over replicas that can be removed (down) and re-join
/// (up). Not thread-safe: one owner (the router actor's thread).
class replica_router {
public:
  explicit replica_router(replica_router_config config);

  // -- routing ---------------------------------------------------------------------

  /// The replica a request should run on (the design note's rule), or
  /// nullopt when every replica is down. Records nothing.
  std::optional<int32_t> choose(std::span<const int32_t> prompt, int32_t max_tokens) const;

  /// Records request `id` as placed on `replica`: its tokens count as that
  /// replica's load until finish(id), and its prompt's pages are remembered
  /// there. A second place() of an id moves it.
  void place(uint64_t id, int32_t replica, std::span<const int32_t> prompt, int32_t max_tokens);

  /// Request `id` ended (however): its load leaves its replica. Its
  /// replica, or nullopt for an id not placed (or already finished).
  std::optional<int32_t> finish(uint64_t id);

  /// The replica `id` was placed on, if it has not finished.
  std::optional<int32_t> replica_of(uint64_t id) const;

  // -- membership ------------------------------------------------------------------

  /// `replica` takes no new requests (its executor is down) and its
  /// remembered prefixes are dropped (its KV cache is gone). Requests placed
  /// on it keep counting until they finish (its scheduler fails them).
  void mark_down(int32_t replica);

  /// `replica` takes requests again (its executor is back).
  void mark_up(int32_t replica);

  bool is_up(int32_t replica) const;
  int32_t num_up() const;
  int32_t num_replicas() const {
    return int32_t(replicas_.size());
  }

  // -- figures ---------------------------------------------------------------------

  /// Tokens placed on `replica` and not finished.
  int64_t load(int32_t replica) const;
  /// Requests placed on `replica` and not finished.
  int32_t requests(int32_t replica) const;
  /// Tokens of the longest whole-page prefix of `prompt` remembered for
  /// `replica` (0 without prefix affinity).
  int32_t cached_tokens(int32_t replica, std::span<const int32_t> prompt) const;

private:
  struct replica {
    bool up = true;
    int64_t load = 0;
    int32_t requests = 0;
    /// Page-prefix hashes, most recently used first, and where each is.
    std::list<uint64_t> lru;
    std::unordered_map<uint64_t, std::list<uint64_t>::iterator> pages;
  };
  struct placement {
    int32_t replica = 0;
    int64_t tokens = 0;
  };

  int64_t cost_of(std::span<const int32_t> prompt, int32_t max_tokens) const;
  /// The hash of each whole page prefix of `prompt`: [0] covers page 0, [1]
  /// pages 0 and 1, ...
  std::vector<uint64_t> prefix_hashes(std::span<const int32_t> prompt) const;
  void remember(replica& r, std::span<const int32_t> prompt);

  replica_router_config config_;
  std::vector<replica> replicas_;
  std::unordered_map<uint64_t, placement> placed_;
};

} // namespace metronome
