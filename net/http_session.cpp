#include "net/http_session.hpp"

#include <chrono>
#include <iterator>
#include <sstream>

#include <boost/asio/write.hpp>
#include <boost/beast/core/read_size.hpp>
#include <boost/beast/websocket/rfc6455.hpp>
#include <spdlog/spdlog.h>

#include "net/chat_page.hpp"
#include "net/http_routes.hpp"
#include "net/log_text.hpp"
#include "net/tokenize_route.hpp"
#include "net/ws_session.hpp"

namespace metronome::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using error_code = boost::system::error_code;

namespace {

constexpr std::string_view server_name = "metronome/" METRONOME_VERSION;

/// How long a closing connection keeps discarding what the client sends.
constexpr auto linger_time = std::chrono::seconds(2);

/// Writes gathered into one async_write.
constexpr size_t max_gather = 64;

/// How long a connection over max_connections may take to send the request
/// it gets answered (it holds one of the few overflow slots meanwhile).
constexpr auto over_limit_read_timeout = std::chrono::seconds(5);

/// The most a TLS connection's first read of a request takes in (the rest
/// goes through the parser).
constexpr size_t first_read_bytes = 16 * 1024;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

template <class Fields>
std::string header_text(const http::header<false, Fields>& h) {
  std::ostringstream os;
  os << h;
  return std::move(os).str();
}

bool expects_continue(const http_session::request_type& req) {
  return beast::iequals(req[http::field::expect], "100-continue");
}

} // namespace

// -- construction -------------------------------------------------------------------

http_session::http_session(connection_stream socket, strand_type strand,
                           std::shared_ptr<server_context> ctx, gauge_slot slot,
                           bool over_limit)
  : socket_(std::move(socket)),
    strand_(std::move(strand)),
    ctx_(std::move(ctx)),
    slot_(std::move(slot)),
    over_limit_(over_limit),
    idle_timer_(strand_),
    write_timer_(strand_),
    outbox_(ctx_->opts.max_pending_write_bytes) {
  error_code ec;
  auto peer = socket_.socket().remote_endpoint(ec);
  client_ = ec ? std::string("-") : peer.address().to_string();
}

http_session::~http_session() {
  if (active_ && active_->sink)
    cancel_request_sink(active_->sink);
  if (port_)
    port_->close();
}

void http_session::start() {
  asio::dispatch(strand_, [self = shared_from_this()] {
    self->port_ = std::make_shared<strand_port>(self->strand_, self->weak_from_this());
    self->ctx_->ports.add(self->port_);
    if (self->socket_.is_tls())
      self->handshake();
    else
      self->read_header();
  });
}

void http_session::handshake() {
  // Bounded like a request that has begun (header_timeout): a client that
  // trickles its handshake holds the connection no longer than one that
  // trickles its headers.
  phase_ = read_phase::handshake;
  arm_read_timer();
  socket_.async_handshake([self = shared_from_this()](error_code ec) {
    if (self->closed_)
      return;
    if (ec) {
      spdlog::debug("TLS handshake failed: {}", ec.message());
      self->close();
      return;
    }
    self->read_header();
  });
}

// -- reading ------------------------------------------------------------------------

void http_session::read_header() {
  if (closed_ || reading_)
    return;
  reading_ = true;
  parser_.emplace();
  parser_->header_limit(uint32_t(std::min<size_t>(ctx_->opts.max_header_bytes, UINT32_MAX)));
  parser_->body_limit(ctx_->opts.max_body_bytes);
  if (buffer_.size() > 0) {
    read_request(); // a pipelined request has begun
    return;
  }
  phase_ = read_phase::first_byte;
  if (!busy_)
    arm_read_timer();
  if (socket_.is_tls()) {
    // Through the TLS stream, not a wait on the socket: a record that came
    // in with the handshake or the previous request may already sit
    // decrypted in the stream, where the socket's readiness cannot show it,
    // and bytes on the socket may be records that carry no request.
    auto room = buffer_.prepare(beast::read_size(buffer_, first_read_bytes));
    socket_.async_read_some(room, [self = shared_from_this()](error_code ec, size_t n) {
      self->buffer_.commit(n);
      self->on_readable(ec);
    });
    return;
  }
  // Plain TCP: an idle connection waits without a read in progress.
  socket_.socket().async_wait(asio::ip::tcp::socket::wait_read,
                              [self = shared_from_this()](error_code ec) {
                                self->on_readable(ec);
                              });
}

void http_session::on_readable(error_code ec) {
  if (closed_)
    return;
  if (ec) {
    on_read_error(ec);
    return;
  }
  if (lingering_) {
    reading_ = false;
    drain();
    return;
  }
  // Readable (TLS: the first bytes are in buffer_): a first byte, or an
  // end of stream or reset the header read reports.
  read_request();
}

void http_session::read_request() {
  phase_ = read_phase::request;
  if (!busy_ && !lingering_)
    arm_read_timer();
  http::async_read_header(socket_, buffer_, *parser_,
                          [self = shared_from_this()](error_code ec, size_t) {
                            self->on_header(ec);
                          });
}

void http_session::on_header(error_code ec) {
  if (closed_)
    return;
  if (ec) {
    on_read_error(ec);
    return;
  }
  if (!lingering_) {
    if (auto refused = ctx_->access.check(parser_->get())) {
      refuse_access(std::move(*refused));
      return;
    }
  }
  if (parser_->is_done()) {
    finish_read();
    return;
  }
  // The client waits for our go before sending the body; only when no
  // response is being written (a 100 inside a response would corrupt it).
  if (!busy_ && !lingering_ && expects_continue(parser_->get()))
    queue("HTTP/1.1 100 Continue\r\n\r\n", false);
  http::async_read(socket_, buffer_, *parser_,
                   [self = shared_from_this()](error_code ec, size_t) { self->on_body(ec); });
}

void http_session::on_body(error_code ec) {
  if (closed_)
    return;
  if (ec) {
    on_read_error(ec);
    return;
  }
  finish_read();
}

void http_session::finish_read() {
  reading_ = false;
  if (lingering_) {
    drain();
    return;
  }
  ++idle_generation_;
  idle_timer_.cancel();
  auto req = parser_->release();
  parser_.reset();
  if (busy_) {
    pending_ = std::move(req); // answered once the response in progress is out
    return;
  }
  dispatch(std::move(req));
}

void http_session::on_read_error(error_code ec) {
  reading_ = false;
  std::unique_ptr<access_record> access;
  if (parser_ && parser_->is_header_done())
    access = new_access(parser_->get().method_string(), parser_->get().target());
  else
    access = new_access("-", "-"); // unreadable: no method or route to name
  parser_.reset();
  if (closed_)
    return;
  if (lingering_) {
    close();
    return;
  }
  std::optional<api_error> answer;
  if (ec == http::error::body_limit)
    answer = api_error::payload_too_large(ctx_->opts.max_body_bytes);
  else if (ec == http::error::header_limit)
    answer = api_error{431, "request header fields too large", "invalid_request_error", "",
                       "header_too_large"};
  else if (ec.category() == http::make_error_code(http::error::bad_target).category()
           && ec != http::error::end_of_stream && ec != http::error::partial_message)
    answer = api_error::bad_request("malformed HTTP request: " + ec.message(), "",
                                    "invalid_http");
  if (!answer) {
    // End of stream, reset, timeout: the client is gone. Whatever it asked
    // for is cancelled.
    if (!access->has_request())
      access->discard(); // a keep-alive connection closing: no request, no line
    close();
    return;
  }
  if (busy_) {
    pending_error_ = std::move(answer);
    pending_access_ = std::move(access);
    return;
  }
  busy_ = true;
  access_ = std::move(access);
  send_error(*answer, 11, false, true);
}

void http_session::refuse_access(api_error err) {
  const auto& req = parser_->get();
  spdlog::debug("refused {} {}: {} {}", std::string_view(req.method_string()),
                log_text(req.target()), err.status, err.message);
  reading_ = false;
  ++idle_generation_;
  idle_timer_.cancel();
  auto access = new_access(req.method_string(), req.target());
  if (busy_) {
    // Answered (and the connection closed) once the response in progress is out.
    pending_error_ = std::move(err);
    pending_access_ = std::move(access);
    parser_.reset();
    return;
  }
  allow_origin_ = ctx_->access.allow_origin(req);
  busy_ = true;
  access_ = std::move(access);
  read_request_id(req["X-Request-Id"]);
  parser_.reset();
  send_error(err, 11, false, true);
}

// -- routing ------------------------------------------------------------------------

void http_session::dispatch(request_type req) {
  busy_ = true;
  access_ = new_access(req.method_string(), req.target());
  auto target = std::string_view(req.target());
  auto path = target.substr(0, target.find('?'));
  auto r = route_of(path);
  auto version = req.version();
  bool keep_alive = req.keep_alive();
  bool upgraded = false;
  allow_origin_ = ctx_->access.allow_origin(req);
  read_request_id(req["X-Request-Id"]);

  if (over_limit_ || ctx_->draining.load()) {
    refuse(r, req.method(), path, version);
  } else if (req.method() == http::verb::options && ctx_->access.is_preflight(req)) {
    auto res = ctx_->access.preflight_response(req);
    allow_origin_.clear(); // the preflight answer carries its own
    res.keep_alive(keep_alive);
    send_response(std::move(res));
  } else if (r == route::unknown || (r == route::page && !ctx_->opts.chat_page)) {
    send_error(api_error::not_found(fmt::format("no route for {}", path)), version, keep_alive);
  } else if (req.method() != method_of(r)) {
    auto res = method_not_allowed_response(r, req.method_string(), path, version);
    res.keep_alive(keep_alive);
    send_response(std::move(res));
  } else if (r == route::chat || r == route::completions) {
    start_generation(r == route::chat ? api_kind::chat : api_kind::completion, req);
  } else if (r == route::tokenize || r == route::detokenize) {
    answer_tokenizer_route(r, req);
  } else if (r == route::page) {
    auto res = chat_page::get().response(req[http::field::if_none_match], version);
    res.keep_alive(keep_alive);
    send_response(std::move(res));
  } else if (r == route::websocket && beast::websocket::is_upgrade(req)) {
    upgraded = true;
    upgrade(std::move(req));
  } else {
    auto res = r == route::websocket ? upgrade_required_response(version)
                                     : answer_info_route(r, path, version, *ctx_);
    res.keep_alive(keep_alive);
    send_response(std::move(res));
  }
  // Read on: a pipelined request is parked, and an end of stream while the
  // response is in progress means the client went away.
  if (!upgraded && !closed_ && !reading_ && !pending_ && !pending_error_ && !lingering_)
    read_header();
}

void http_session::start_generation(api_kind kind, request_type& req) {
  auto version = req.version();
  bool keep_alive = req.keep_alive();
  auto parsed = parse_openai_body(kind, req.body(), ctx_->defaults());
  if (!parsed) {
    send_error(parsed.error(), version, keep_alive);
    return;
  }
  if (!ctx_->eng.frontend) {
    send_error(api_error{503, "no engine is running", "service_unavailable_error", "",
                         "unavailable"},
               version, keep_alive);
    return;
  }
  auto& p = *parsed;
  // The server's strategy ("paged;page_size=16;..."), and the client's
  // choice among those it allows.
  const std::string strategy = ctx_->kv_cache_strategy();
  const std::string_view configured = std::string_view(strategy).substr(0, strategy.find(';'));
  if (auto err = read_kv_headers(req["X-KV-Cache-Mode"], req["X-No-Batch"],
                                 configured == "bucketed" ? kv_strategy::bucketed
                                                          : kv_strategy::paged,
                                 p.request)) {
    send_error(*err, version, keep_alive);
    return;
  }
  p.request.request_id = ctx_->new_request_id(kind);
  access_->set_request_id(p.request.request_id);
  if (ctx_->opts.log_prompts) {
    access_->set_prompt(prompt_text(p.request));
    access_->keep_output();
  }
  active_request a;
  a.tag = next_tag_++;
  a.meta.kind = kind;
  a.meta.id = p.request.request_id;
  a.meta.model = p.model;
  a.meta.created = unix_now();
  a.meta.include_usage = p.include_usage;
  a.meta.logprobs = p.request.params.logprobs >= 0;
  a.kv_strategy = p.request.kv_mode && strategy.find(';') != std::string::npos
                    ? to_string(*p.request.kv_mode) + strategy.substr(strategy.find(';'))
                    : strategy;
  a.stream = p.stream;
  a.version = version;
  a.chunked = version >= 11;
  a.keep_alive = keep_alive && version >= 11;
  a.in_flight = gauge_slot(ctx_->requests_in_flight);
  spdlog::debug("{} {} stream={} max_tokens={}", a.meta.id, log_text(req.target()), a.stream,
                p.request.params.max_tokens);
  active_ = std::move(a);
  // While the engine works, possibly no I/O is in flight (a pipelined
  // request is parked): the request keeps its session alive.
  self_ = shared_from_this();
  active_->sink = spawn_request_sink(ctx_->sys, ctx_->eng.frontend, std::move(p.request), port_,
                                     active_->tag);
}

void http_session::answer_tokenizer_route(route r, const request_type& req) {
  const auto version = req.version();
  const bool keep_alive = req.keep_alive();
  const auto& eng = ctx_->eng;
  if (!eng.tokens) {
    send_error(api_error{503, "no model is loaded", "service_unavailable_error", "",
                         "unavailable"},
               version, keep_alive);
    return;
  }
  const int32_t max_model_len = eng.status ? eng.status->max_model_len : 0;
  std::expected<nlohmann::json, api_error> answer;
  if (r == route::tokenize) {
    auto parsed = parse_tokenize_body(req.body(), ctx_->defaults());
    answer = parsed ? tokenize_answer(*parsed, *eng.tokens, eng.chat.get(), max_model_len)
                    : std::unexpected(std::move(parsed.error()));
  } else {
    auto parsed = parse_detokenize_body(req.body(), ctx_->defaults());
    answer = parsed ? detokenize_answer(*parsed, *eng.tokens)
                    : std::unexpected(std::move(parsed.error()));
  }
  if (!answer) {
    send_error(answer.error(), version, keep_alive);
    return;
  }
  response_type res{http::status::ok, version};
  res.set(http::field::content_type, "application/json");
  res.body() = dump_json(*answer);
  res.keep_alive(keep_alive);
  send_response(std::move(res));
}

void http_session::read_request_id(std::string_view header) {
  request_id_header_.clear();
  if (header.empty())
    return;
  if (!valid_request_id(header)) {
    spdlog::debug("ignoring an X-Request-Id that is not 1-{} visible ASCII characters: {}",
                  max_request_id_bytes, log_text(header, 200));
    return;
  }
  request_id_header_ = std::string(header);
  if (access_)
    access_->set_client_request_id(request_id_header_);
}

void http_session::refuse(route r, http::verb method, std::string_view path, unsigned version) {
  if (r == route::health && method == http::verb::get) {
    // Answered even over the limit: a health check must not fail only
    // because clients hold every connection.
    send_response(answer_info_route(r, path, version, *ctx_), true);
    return;
  }
  if (ctx_->draining.load())
    send_error(api_error::shutting_down("the server is shutting down and takes no new requests"),
               version, false, true);
  else
    send_error(api_error::too_many_connections(ctx_->opts.max_connections), version, false, true);
}

void http_session::upgrade(request_type req) {
  if (writing_ || !outbox_.empty()) {
    send_error(api_error::bad_request("cannot upgrade while a response is being written", "",
                                      "invalid_http"),
               req.version(), false, true);
    return;
  }
  // From here on the socket belongs to the WebSocket session; its chats
  // get their own access lines.
  access_->on_status(101);
  access_->write();
  access_.reset();
  closed_ = true;
  ++idle_generation_;
  ++write_generation_;
  idle_timer_.cancel();
  write_timer_.cancel();
  if (port_)
    port_->close();
  auto ws = std::make_shared<ws_session>(std::move(socket_), strand_, ctx_, std::move(slot_),
                                         client_);
  ws->start(std::move(req));
}

// -- sink events --------------------------------------------------------------------

void http_session::on_delta(uint64_t tag, text_delta& d) {
  // A request answered already (done, failed, or ended by the drain,
  // which detaches its sink) takes no more events: a second answer would
  // follow a response that said Connection: close.
  if (closed_ || !active_ || active_->tag != tag || !active_->sink)
    return;
  auto& a = *active_;
  if (access_)
    access_->on_delta(d);
  if (a.first_token_batch_size == 0)
    a.first_token_batch_size = d.first_token_batch_size;
  a.kv_overflow = d.kv_overflow;
  if (!a.stream) {
    a.text += d.text;
    std::move(d.logprobs.begin(), d.logprobs.end(), std::back_inserter(a.logprobs));
    return;
  }
  if (!a.headers_sent)
    send_stream_headers(a.first_token_batch_size);
  if (!d.text.empty() || !d.logprobs.empty())
    send_stream_event(sse_event(delta_chunk(a.meta, d.text, d.logprobs, &a.cursor)), false);
}

void http_session::on_done(uint64_t tag, generation_done& done) {
  if (closed_ || !active_ || active_->tag != tag || !active_->sink)
    return;
  auto& a = *active_;
  a.sink = nullptr; // it quits on its own
  if (access_)
    access_->on_done(done);
  if (a.first_token_batch_size == 0)
    a.first_token_batch_size = done.first_token_batch_size;
  a.kv_overflow = done.kv_overflow;
  spdlog::debug("{} done: {} prompt={} completion={} e2e={:.3f}s", a.meta.id,
                to_string(done.finish_reason), done.prompt_tokens, done.completion_tokens,
                done.e2e_s);
  if (!a.stream) {
    response_type res{http::status::ok, a.version};
    res.set(http::field::content_type, "application/json");
    add_generation_headers(res, a.first_token_batch_size);
    res.body() = dump_json(completion_body(a.meta, a.text, done, a.logprobs));
    res.keep_alive(a.keep_alive);
    send_response(std::move(res));
    return;
  }
  if (!a.headers_sent)
    send_stream_headers(a.first_token_batch_size);
  std::string tail = sse_event(finish_chunk(a.meta, done.finish_reason));
  if (a.meta.include_usage)
    tail += sse_event(usage_chunk(a.meta, done));
  tail += sse_done;
  send_stream_event(std::move(tail), true);
}

void http_session::on_error(uint64_t tag, generation_error& e) {
  if (closed_ || !active_ || active_->tag != tag || !active_->sink)
    return;
  auto& a = *active_;
  a.sink = nullptr;
  auto err = api_error::from(e);
  spdlog::debug("{} failed: {} ({})", a.meta.id, log_text(err.message), err.status);
  if (access_)
    access_->on_error(err);
  if (a.stream && a.headers_sent) {
    // Too late for a status code: an error event, as OpenAI's streams do.
    send_stream_event(sse_event(err.to_json()) + std::string(sse_done), true);
    return;
  }
  send_error(err, a.version, a.keep_alive);
}

void http_session::close_now() {
  close();
}

void http_session::finish_drain() {
  if (closed_ || lingering_)
    return;
  if (!busy_) {
    close(); // idle, or a request still arriving
    return;
  }
  // Close once the response in progress is out.
  close_after_ = true;
  if (!active_ || !active_->sink)
    return; // its last bytes are queued already
  auto& a = *active_;
  cancel_request_sink(a.sink);
  a.sink = nullptr;
  auto err = api_error::shutting_down(
    fmt::format("the server shut down before the request finished (drain timeout {} ms)",
                ctx_->opts.drain_timeout.count()));
  spdlog::debug("{} ended by the drain timeout", a.meta.id);
  if (access_)
    access_->on_error(err);
  if (a.stream && a.headers_sent) {
    // As on_error: an error event, then [DONE], so clients see a clean end.
    send_stream_event(sse_event(err.to_json()) + std::string(sse_done), true);
    return;
  }
  send_error(err, a.version, false, true);
}

// -- answers ------------------------------------------------------------------------

template <class Message>
void http_session::add_generation_headers(Message& res, int32_t batch_size) const {
  if (batch_size > 0)
    res.set("X-Batch-Size", std::to_string(batch_size));
  res.set("X-Inference-Version", METRONOME_VERSION);
  res.set("X-KV-Cache-Strategy", active_ ? kv_strategy_header(active_->kv_strategy,
                                                               active_->kv_overflow)
                                          : ctx_->kv_cache_strategy());
  if (!request_id_header_.empty())
    res.set("X-Request-Id", request_id_header_);
  else if (active_)
    res.set("X-Request-Id", active_->meta.id);
}

void http_session::send_response(response_type res, bool close) {
  if (closed_)
    return;
  if (close)
    res.keep_alive(false);
  if (!res.keep_alive())
    close_after_ = true;
  res.set(http::field::server, server_name);
  if (!allow_origin_.empty()) {
    res.set(http::field::access_control_allow_origin, allow_origin_);
    res.set(http::field::vary, "Origin");
  }
  if (!request_id_header_.empty())
    res.set("X-Request-Id", request_id_header_);
  if (access_) {
    access_->on_status(int(res.result_int()));
    if (res.result_int() >= 400)
      access_->on_error_body(res.body()); // the routes' own error answers
  }
  res.prepare_payload();
  std::string out = header_text(res.base());
  out += res.body();
  queue(std::move(out), true);
}

void http_session::send_error(const api_error& err, unsigned version, bool keep_alive,
                              bool close_after) {
  if (access_)
    access_->on_error(err);
  response_type res{static_cast<http::status>(err.status), version};
  res.set(http::field::content_type, "application/json");
  if (err.retry_later())
    res.set(http::field::retry_after, std::to_string(ctx_->opts.retry_after.count()));
  if (err.status == 401)
    res.set(http::field::www_authenticate, "Bearer");
  if (active_)
    add_generation_headers(res, 0);
  res.body() = err.body();
  res.keep_alive(keep_alive && !close_after);
  send_response(std::move(res), close_after);
}

void http_session::send_stream_headers(int32_t batch_size) {
  auto& a = *active_;
  http::response<http::empty_body> res{http::status::ok, a.version};
  res.set(http::field::server, server_name);
  res.set(http::field::content_type, "text/event-stream");
  res.set(http::field::cache_control, "no-cache");
  if (!allow_origin_.empty()) {
    res.set(http::field::access_control_allow_origin, allow_origin_);
    res.set(http::field::vary, "Origin");
  }
  add_generation_headers(res, batch_size);
  if (access_)
    access_->on_status(200);
  if (a.chunked)
    res.chunked(true);
  res.keep_alive(a.keep_alive);
  if (!a.keep_alive)
    close_after_ = true;
  a.headers_sent = true;
  queue(header_text(res.base()), false);
  if (a.meta.kind == api_kind::chat)
    send_stream_event(sse_event(role_chunk(a.meta)), false);
}

void http_session::send_stream_event(std::string event, bool ends_response) {
  const auto& a = *active_;
  if (!a.chunked) {
    queue(std::move(event), ends_response);
    return;
  }
  auto framed = http_chunk(event);
  if (ends_response)
    framed += http_last_chunk;
  queue(std::move(framed), ends_response);
}

// -- writing ------------------------------------------------------------------------

void http_session::queue(std::string data, bool ends_response) {
  if (closed_ || outbox_.overflowed())
    return;
  const size_t bytes = data.size();
  if (!outbox_.push({std::move(data), ends_response}, bytes)) {
    // Closed from a fresh handler: callers still hold references into
    // active_.
    spdlog::warn("closing a connection whose client does not read ({} bytes queued)",
                 outbox_.bytes());
    asio::post(strand_, [self = shared_from_this()] { self->close(); });
    return;
  }
  if (!writing_)
    write_next();
}

void http_session::write_next() {
  writing_ = true;
  std::vector<asio::const_buffer> buffers;
  auto n = std::min(outbox_.size(), max_gather);
  buffers.reserve(n);
  for (size_t i = 0; i < n; ++i)
    buffers.emplace_back(asio::buffer(outbox_[i].data));
  auto gen = ++write_generation_;
  write_timer_.expires_after(ctx_->opts.write_timeout);
  write_timer_.async_wait([self = shared_from_this(), gen](error_code ec) {
    if (!ec && gen == self->write_generation_ && !self->closed_) {
      spdlog::warn("closing a connection: a write made no progress for {} ms",
                   self->ctx_->opts.write_timeout.count());
      self->close();
    }
  });
  asio::async_write(socket_, buffers,
                    [self = shared_from_this(), n](error_code ec, size_t) {
                      self->writing_ = false;
                      ++self->write_generation_;
                      self->write_timer_.cancel();
                      if (self->closed_)
                        return;
                      if (ec) {
                        self->close();
                        return;
                      }
                      size_t responses = 0;
                      for (size_t i = 0; i < n; ++i) {
                        responses += self->outbox_.front().ends_response ? 1 : 0;
                        self->outbox_.pop();
                      }
                      if (!self->outbox_.empty())
                        self->write_next();
                      for (size_t i = 0; i < responses && !self->closed_; ++i)
                        self->on_response_complete();
                    });
}

void http_session::on_response_complete() {
  busy_ = false;
  if (access_)
    access_->write();
  access_.reset();
  active_.reset();
  allow_origin_.clear();
  request_id_header_.clear();
  auto self = std::move(self_);
  if (close_after_) {
    linger_close();
    return;
  }
  if (pending_error_) {
    auto err = std::move(*pending_error_);
    pending_error_.reset();
    access_ = std::move(pending_access_);
    busy_ = true;
    send_error(err, 11, false, true);
    return;
  }
  if (pending_) {
    auto req = std::move(*pending_);
    pending_.reset();
    dispatch(std::move(req));
    return;
  }
  if (reading_)
    arm_read_timer();
  else
    read_header();
}

// -- access lines -------------------------------------------------------------------

std::unique_ptr<access_record> http_session::new_access(std::string_view method,
                                                        std::string_view target) const {
  auto record = std::make_unique<access_record>(method, target, client_);
  record->set_observer(ctx_->response_counter());
  return record;
}

// -- closing ------------------------------------------------------------------------

void http_session::close() {
  if (closed_)
    return;
  closed_ = true;
  auto self = std::move(self_); // destroyed at the end of this function at the earliest
  if (active_ && active_->sink) {
    spdlog::debug("{} cancelled: the client went away", active_->meta.id);
    cancel_request_sink(active_->sink);
  }
  if (access_) {
    access_->on_client_gone();
    access_->write();
    access_.reset();
  }
  pending_access_.reset(); // its answer was never sent: written as 499
  active_.reset();
  pending_.reset();
  ++idle_generation_;
  ++write_generation_;
  idle_timer_.cancel();
  write_timer_.cancel();
  error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  if (port_)
    port_->close();
}

void http_session::linger_close() {
  if (closed_ || lingering_)
    return;
  lingering_ = true;
  error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
  auto gen = ++idle_generation_;
  idle_timer_.expires_after(linger_time);
  idle_timer_.async_wait([self = shared_from_this(), gen](error_code ec) {
    if (!ec && gen == self->idle_generation_)
      self->close();
  });
  if (!reading_)
    drain();
}

void http_session::drain() {
  if (closed_)
    return;
  reading_ = true;
  drain_buffer_.resize(16 * 1024);
  // What the parser already buffered is dropped with the connection.
  buffer_.consume(buffer_.size());
  socket_.async_read_some(asio::buffer(drain_buffer_),
                          [self = shared_from_this()](error_code ec, size_t) {
                            self->reading_ = false;
                            if (self->closed_)
                              return;
                            if (ec) {
                              self->close();
                              return;
                            }
                            self->drain();
                          });
}

void http_session::arm_read_timer() {
  const auto& o = ctx_->opts;
  std::chrono::milliseconds limit =
    phase_ == read_phase::first_byte ? o.idle_timeout : o.header_timeout;
  if (over_limit_)
    limit = std::min<std::chrono::milliseconds>(limit, over_limit_read_timeout);
  auto gen = ++idle_generation_;
  idle_timer_.expires_after(limit);
  idle_timer_.async_wait([self = shared_from_this(), gen](error_code ec) {
    if (ec || gen != self->idle_generation_ || self->busy_ || self->closed_)
      return;
    if (self->phase_ == read_phase::request)
      spdlog::debug("closing a connection: its request took longer than {} ms to arrive",
                    self->ctx_->opts.header_timeout.count());
    else if (self->phase_ == read_phase::handshake)
      spdlog::debug("closing a connection: its TLS handshake took longer than {} ms",
                    self->ctx_->opts.header_timeout.count());
    self->close();
  });
}

} // namespace metronome::net
