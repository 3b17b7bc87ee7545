#include "net/ws_session.hpp"

#include <boost/asio/post.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/websocket.hpp>
#include <spdlog/spdlog.h>

#include "net/http_routes.hpp"
#include "net/log_text.hpp"

namespace metronome::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using error_code = boost::system::error_code;

ws_session::ws_session(connection_stream socket, strand_type strand,
                       std::shared_ptr<server_context> ctx, gauge_slot slot,
                       std::string client)
  : ws_(std::move(socket)),
    strand_(std::move(strand)),
    ctx_(std::move(ctx)),
    slot_(std::move(slot)),
    outbox_(ctx_->opts.max_pending_write_bytes),
    client_(std::move(client)) {}

ws_session::~ws_session() {
  for (auto& [id, req] : live_)
    cancel_request_sink(req.sink);
  if (port_)
    port_->close();
}

void ws_session::start(request_type upgrade) {
  port_ = std::make_shared<strand_port>(strand_, weak_from_this());
  ctx_->ports.add(port_);
  upgrade_ = std::move(upgrade);
  ws_.read_message_max(ctx_->opts.max_ws_message_bytes);
  ws_.auto_fragment(false);
  // Idle clients are pinged; one that answers nothing for idle_timeout is
  // dropped (and its requests cancelled).
  websocket::stream_base::timeout timeouts;
  timeouts.handshake_timeout = ctx_->opts.header_timeout;
  timeouts.idle_timeout = ctx_->opts.idle_timeout;
  timeouts.keep_alive_pings = true;
  ws_.set_option(timeouts);
  // The client's X-Request-Id is echoed on the 101 as on every HTTP answer
  // (http_session logs the upgrade under it).
  const std::string_view client_id = upgrade_["X-Request-Id"];
  ws_.set_option(websocket::stream_base::decorator(
    [subprotocol = ctx_->access.ws_subprotocol(upgrade_),
     request_id = valid_request_id(client_id) ? std::string(client_id) : std::string()](
      websocket::response_type& res) {
      res.set(http::field::server, "metronome/" METRONOME_VERSION);
      if (!subprotocol.empty())
        res.set(http::field::sec_websocket_protocol, subprotocol);
      if (!request_id.empty())
        res.set("X-Request-Id", request_id);
    }));
  ws_.async_accept(upgrade_, [self = shared_from_this()](error_code ec) {
    if (self->closed_)
      return;
    if (ec) {
      spdlog::debug("websocket handshake failed: {}", ec.message());
      self->close();
      return;
    }
    self->upgrade_ = {};
    self->accepted_ = true;
    self->read();
  });
}

// -- reading ------------------------------------------------------------------------

void ws_session::read() {
  ws_.async_read(buffer_, [self = shared_from_this()](error_code ec, size_t n) {
    self->on_read(ec, n);
  });
}

void ws_session::on_read(error_code ec, size_t) {
  if (closed_)
    return;
  if (ec) {
    // websocket::error::closed: the client closed; message_too_big: Beast
    // has already failed the connection with 1009. Either way: cancel all.
    if (ec != websocket::error::closed)
      spdlog::debug("websocket read failed: {}", ec.message());
    close();
    return;
  }
  if (!ws_.got_text()) {
    send(ws_error_event(std::nullopt,
                        api_error::bad_request("binary messages are not supported; send JSON text",
                                               "", "invalid_type")));
  } else {
    auto text = beast::buffers_to_string(buffer_.data());
    handle(text);
  }
  buffer_.consume(buffer_.size());
  if (!closed_)
    read();
}

void ws_session::handle(std::string_view text) {
  if (going_away_)
    return;
  const auto arrival = access_record::clock::now();
  auto msg = parse_ws_message(text, ctx_->defaults());
  if (auto* chat = std::get_if<ws_chat>(&msg)) {
    start_chat(*chat, arrival);
  } else if (auto* c = std::get_if<ws_cancel>(&msg)) {
    cancel(c->id);
  } else if (auto* ping = std::get_if<ws_ping>(&msg)) {
    send(ws_pong_event(ping->id));
  } else {
    auto& bad = std::get<ws_bad>(msg);
    log_refusal(bad.id, bad.error, arrival);
    send(ws_error_event(bad.id, bad.error));
  }
}

void ws_session::log_refusal(const std::optional<std::string>& id, const api_error& error,
                             access_record::clock::time_point arrival) const {
  access_record access("WS", "/v1/ws", client_, arrival);
  access.set_observer(ctx_->response_counter());
  if (id)
    access.set_ws_id(*id);
  access.on_error(error);
  access.write();
}

void ws_session::start_chat(ws_chat& chat, access_record::clock::time_point arrival) {
  std::optional<api_error> refusal;
  if (live_.contains(chat.id))
    refusal = api_error::bad_request("a request with this id is still running", "id",
                                     "duplicate_id");
  else if (live_.size() >= size_t(ctx_->opts.max_streams_per_connection))
    refusal = api_error{429,
                        fmt::format("this connection already runs {} requests, the limit",
                                    live_.size()),
                        "rate_limit_error", "", "too_many_requests"};
  else if (ctx_->draining.load())
    refusal = api_error::shutting_down("the server is shutting down and takes no new requests");
  else if (!ctx_->eng.frontend)
    refusal = api_error{503, "no engine is running", "service_unavailable_error", "",
                        "unavailable"};
  if (refusal) {
    log_refusal(chat.id, *refusal, arrival);
    send(ws_error_event(chat.id, *refusal));
    return;
  }
  auto tag = next_tag_++;
  auto& req = chat.request.request;
  req.request_id = ctx_->new_request_id(api_kind::chat);
  auto access = std::make_unique<access_record>("WS", "/v1/ws", client_, arrival);
  access->set_observer(ctx_->response_counter());
  access->set_ws_id(chat.id);
  access->set_request_id(req.request_id);
  if (ctx_->opts.log_prompts) {
    access->set_prompt(prompt_text(req));
    access->keep_output();
  }
  spdlog::debug("{} websocket id={} max_tokens={}", req.request_id, log_text(chat.id),
                req.params.max_tokens);
  const bool logprobs = req.params.logprobs >= 0;
  auto sink = spawn_request_sink(ctx_->sys, ctx_->eng.frontend, std::move(req), port_, tag);
  ids_.emplace(tag, chat.id);
  live_.emplace(std::move(chat.id), live_request{tag, std::move(sink), logprobs,
                                                gauge_slot(ctx_->requests_in_flight),
                                                std::move(access)});
}

void ws_session::cancel(const std::string& id) {
  auto i = live_.find(id);
  if (i == live_.end()) {
    send(ws_error_event(id, api_error::bad_request("no running request has this id", "id",
                                                   "unknown_id")));
    return;
  }
  cancel_request_sink(i->second.sink);
  i->second.access->on_status(200);
  i->second.access->on_client_gone();
  i->second.access->write();
  ids_.erase(i->second.tag);
  live_.erase(i);
  send(ws_cancelled_event(id));
}

// -- sink events --------------------------------------------------------------------

const std::string* ws_session::id_of(uint64_t tag) const {
  auto i = ids_.find(tag);
  return i == ids_.end() ? nullptr : &i->second;
}

void ws_session::forget(uint64_t tag) {
  auto i = ids_.find(tag);
  if (i == ids_.end())
    return;
  live_.erase(i->second);
  ids_.erase(i);
}

void ws_session::on_delta(uint64_t tag, text_delta& d) {
  if (closed_ || (d.text.empty() && d.logprobs.empty()))
    return;
  if (auto id = id_of(tag)) {
    auto live = live_.find(*id);
    const bool logprobs = live != live_.end() && live->second.logprobs;
    if (live != live_.end())
      live->second.access->on_delta(d);
    send(ws_delta_event(*id, d.text, logprobs ? &d.logprobs : nullptr));
  }
}

void ws_session::on_done(uint64_t tag, generation_done& done) {
  if (closed_)
    return;
  if (auto id = id_of(tag)) {
    if (auto live = live_.find(*id); live != live_.end()) {
      live->second.access->on_status(200);
      live->second.access->on_done(done);
      live->second.access->write();
    }
    send(ws_done_event(*id, done));
    forget(tag);
  }
}

void ws_session::on_error(uint64_t tag, generation_error& e) {
  if (closed_)
    return;
  if (auto id = id_of(tag)) {
    auto err = api_error::from(e);
    if (auto live = live_.find(*id); live != live_.end()) {
      live->second.access->on_error(err);
      live->second.access->write();
    }
    send(ws_error_event(*id, err));
    forget(tag);
  }
}

void ws_session::close_now() {
  close();
}

void ws_session::finish_drain() {
  if (closed_ || going_away_)
    return;
  auto err = api_error::shutting_down(
    fmt::format("the server shut down before the request finished (drain timeout {} ms)",
                ctx_->opts.drain_timeout.count()));
  for (auto& [id, req] : live_) {
    cancel_request_sink(req.sink);
    req.access->on_error(err);
    req.access->write();
    send(ws_error_event(id, err));
  }
  live_.clear();
  ids_.clear();
  going_away_ = true;
  if (!accepted_)
    close(); // mid-handshake: nothing to say goodbye on
  else if (!writing_)
    close_going_away();
}

void ws_session::close_going_away() {
  if (closed_)
    return;
  ws_.async_close(websocket::close_reason(websocket::close_code::going_away, "server shutdown"),
                  [self = shared_from_this()](error_code) { self->close(); });
}

// -- writing ------------------------------------------------------------------------

void ws_session::send(std::string event) {
  if (closed_ || going_away_ || outbox_.overflowed())
    return;
  const size_t bytes = event.size();
  if (!outbox_.push(std::move(event), bytes)) {
    spdlog::warn("closing a websocket whose client does not read ({} bytes queued)",
                 outbox_.bytes());
    asio::post(strand_, [self = shared_from_this()] { self->close(); });
    return;
  }
  if (!writing_)
    write_next();
}

void ws_session::write_next() {
  writing_ = true;
  ws_.text(true);
  ws_.async_write(asio::buffer(outbox_.front()),
                  [self = shared_from_this()](error_code ec, size_t) {
                    self->writing_ = false;
                    if (self->closed_)
                      return;
                    if (ec) {
                      self->close();
                      return;
                    }
                    self->outbox_.pop();
                    if (!self->outbox_.empty())
                      self->write_next();
                    else if (self->going_away_)
                      self->close_going_away();
                  });
}

// -- closing ------------------------------------------------------------------------

void ws_session::close() {
  if (closed_)
    return;
  closed_ = true;
  if (!live_.empty())
    spdlog::debug("websocket closed: cancelling {} requests", live_.size());
  for (auto& [id, req] : live_)
    cancel_request_sink(req.sink);
  live_.clear();
  ids_.clear();
  error_code ignored;
  auto& sock = beast::get_lowest_layer(ws_);
  sock.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  sock.close(ignored);
  if (port_)
    port_->close();
}

} // namespace metronome::net
