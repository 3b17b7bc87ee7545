#include "net/server_context.hpp"

#include "actors/engine_metrics.hpp"

#include <chrono>
#include <random>

#include <fmt/format.h>

#include "net/connection_stream.hpp"

namespace metronome::net {

namespace {

std::string pick_model_name(const engine& eng, const server_options& opts) {
  if (!opts.served_model_name.empty())
    return opts.served_model_name;
  if (eng.status && !eng.status->model_name.empty())
    return eng.status->model_name;
  return "metronome";
}

uint64_t random_salt() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

/// A 64-bit mix (splitmix64's finaliser): distinct inputs, distinct outputs.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

} // namespace

access_record::observer server_context::response_counter() const {
  if (!eng.metrics)
    return {};
  return [m = eng.metrics](std::string_view route, int status) {
    m->on_http_response(route, status);
  };
}

server_context::server_context(caf::actor_system& sys, engine eng, server_options opts)
  : sys(sys),
    eng(std::move(eng)),
    opts(std::move(opts)),
    model_name(pick_model_name(this->eng, this->opts)),
    started(std::chrono::duration_cast<std::chrono::seconds>(
              std::chrono::system_clock::now().time_since_epoch())
              .count()),
    tls(this->opts.tls_cert_file.empty()
          ? nullptr
          : make_tls_context(this->opts.tls_cert_file, this->opts.tls_key_file)),
    access(this->opts, tls != nullptr),
    salt_(random_salt()) {}

parse_defaults server_context::defaults() const {
  parse_defaults d;
  d.model_name = model_name;
  d.timeout = opts.request_timeout;
  return d;
}

std::string server_context::new_request_id(api_kind kind) {
  // mix() is a bijection, so a counter under a random salt never repeats
  // within a process and differs between processes.
  auto n = next_id_.fetch_add(1, std::memory_order_relaxed);
  return fmt::format("{}{:016x}{:08x}", kind == api_kind::chat ? "chatcmpl-" : "cmpl-",
                     mix(salt_ + n), uint32_t(n));
}

bool server_context::ready() const {
  return eng.status && eng.status->ready.load() && !eng.status->degraded.load();
}

std::string server_context::kv_cache_strategy() const {
  return eng.status ? eng.status->kv_cache_strategy : std::string{};
}

} // namespace metronome::net
