#include "net/request_sink.hpp"

#include <algorithm>

#include "actors/scoped_monitors.hpp"

namespace metronome::net {

// -- port_registry --------------------------------------------------------------

void port_registry::add(const std::shared_ptr<strand_port>& port) {
  std::unique_lock<std::mutex> guard{mtx_};
  if (closed_) {
    guard.unlock();
    port->close();
    return;
  }
  if (ports_.size() >= prune_at_) {
    std::erase_if(ports_, [](const auto& w) { return w.expired(); });
    prune_at_ = std::max<size_t>(64, ports_.size() * 2);
  }
  ports_.push_back(port);
}

std::vector<std::shared_ptr<strand_port>> port_registry::live() const {
  std::vector<std::shared_ptr<strand_port>> result;
  std::lock_guard<std::mutex> guard{mtx_};
  for (const auto& w : ports_)
    if (auto p = w.lock())
      result.push_back(std::move(p));
  return result;
}

void port_registry::close_all() {
  std::vector<std::weak_ptr<strand_port>> ports;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    closed_ = true;
    ports.swap(ports_);
  }
  for (const auto& w : ports)
    if (auto p = w.lock())
      p->close();
}

// -- the sink actor -------------------------------------------------------------

namespace {

struct sink_state {
  /// The engine's actor that answers (the request actor), once known.
  caf::actor_addr source;
  /// The frontend and the source, watched while the sink lives; removed
  /// when the state is destroyed, on every way the sink ends, so the
  /// long-lived frontend keeps no record of finished requests
  /// (actors/scoped_monitors.hpp).
  scoped_monitors monitors;
  static inline const char* name = "request-sink";
};

request_sink_actor::behavior_type
request_sink(request_sink_actor::stateful_pointer<sink_state> self, frontend_actor frontend,
             generate_request req, std::shared_ptr<strand_port> port, uint64_t tag) {
  auto id = req.request_id;
  auto fail = [=](std::string why) {
    port->post([tag, e = generation_error{id, request_errc::unavailable, std::move(why), ""}](
                 sink_listener& l) mutable { l.on_error(tag, e); });
    self->quit();
  };
  // Whoever answers is watched too: a final event always comes, or a DOWN.
  auto note_source = [=] {
    if (self->state.source)
      return;
    self->state.source = self->current_sender() ? self->current_sender()->address()
                                                : caf::actor_addr{};
    if (auto src = caf::actor_cast<caf::actor>(self->state.source);
        src && src.address() != frontend.address())
      self->state.monitors.add(self, src);
  };
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source == frontend.address())
      fail("the engine stopped");
    else if (dm.source == self->state.source)
      fail("the engine's request actor ended without an answer");
  });
  self->state.monitors.add(self, frontend);
  self->send(frontend, std::move(req));
  return {
    [=](text_delta& d) {
      note_source();
      port->post([tag, d = std::move(d)](sink_listener& l) mutable { l.on_delta(tag, d); });
    },
    [=](generation_done& d) {
      port->post([tag, d = std::move(d)](sink_listener& l) mutable { l.on_done(tag, d); });
      self->quit();
    },
    [=](generation_error& e) {
      port->post([tag, e = std::move(e)](sink_listener& l) mutable { l.on_error(tag, e); });
      self->quit();
    },
  };
}

} // namespace

request_sink_actor spawn_request_sink(caf::actor_system& sys, const frontend_actor& frontend,
                                      generate_request req, std::shared_ptr<strand_port> port,
                                      uint64_t tag) {
  return sys.spawn(request_sink, frontend, std::move(req), std::move(port), tag);
}

void cancel_request_sink(const request_sink_actor& sink) {
  if (sink)
    caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
}

} // namespace metronome::net
