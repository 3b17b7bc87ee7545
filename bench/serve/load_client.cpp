#include "bench/serve/load_client.hpp"

#include <algorithm>

#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <deque>
#include <stdexcept>
#include <unordered_map>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace metronome::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using clock_type = std::chrono::steady_clock;

// -- addresses ------------------------------------------------------------------

server_address parse_url(std::string_view url) {
  constexpr std::string_view scheme = "http://";
  if (url.starts_with("https://"))
    throw std::invalid_argument("'" + std::string(url) + "': https is not supported (use http://)");
  if (!url.starts_with(scheme))
    throw std::invalid_argument("'" + std::string(url) + "' is not http://HOST[:PORT][/PATH]");
  auto rest = url.substr(scheme.size());
  const auto slash = rest.find('/');
  auto authority = rest.substr(0, slash);
  std::string path = slash == rest.npos ? "" : std::string(rest.substr(slash));
  server_address a;
  a.port = 80;
  std::string_view port_text;
  if (authority.starts_with('[')) {
    const auto close = authority.find(']');
    if (close == authority.npos)
      throw std::invalid_argument("'" + std::string(url) + "': unclosed '[' in the host");
    a.host = std::string(authority.substr(1, close - 1));
    auto after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':')
        throw std::invalid_argument("'" + std::string(url) + "': junk after the host");
      port_text = after.substr(1);
    }
  } else {
    const auto colon = authority.find(':');
    a.host = std::string(authority.substr(0, colon));
    if (colon != authority.npos)
      port_text = authority.substr(colon + 1);
  }
  if (a.host.empty())
    throw std::invalid_argument("'" + std::string(url) + "': no host");
  if (!port_text.empty() || authority.ends_with(':')) {
    int port = 0;
    for (char c : port_text) {
      if (c < '0' || c > '9' || port > 65535) {
        port = -1;
        break;
      }
      port = port * 10 + (c - '0');
    }
    if (port < 1 || port > 65535)
      throw std::invalid_argument("'" + std::string(url) + "': '" + std::string(port_text)
                                  + "' is not a port (1..65535)");
    a.port = uint16_t(port);
  }
  while (!path.empty() && path.back() == '/')
    path.pop_back();
  if (path.ends_with("/v1"))
    path.resize(path.size() - 3);
  a.base_path = path;
  return a;
}

bool is_loopback_host(std::string_view host) {
  if (host == "localhost" || host == "::1" || host == "0:0:0:0:0:0:0:1")
    return true;
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(std::string(host), ec);
  return !ec && addr.is_loopback();
}

namespace {

// -- the edge: request bodies and error bodies ----------------------------------

std::string request_body(const load_options& o, const load_request& r) {
  nlohmann::json j;
  j["model"] = o.model;
  if (o.endpoint == api_endpoint::chat)
    j["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", r.prompt}}});
  else
    j["prompt"] = r.prompt;
  j["max_tokens"] = r.max_tokens;
  j["temperature"] = 0;
  j["ignore_eos"] = true; // vLLM's extension; Metronome has it too
  j["stream"] = true;
  j["stream_options"] = {{"include_usage", true}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// "HTTP 400: <message>" from an OpenAI-style error body, or its start.
std::string http_error_text(int status, const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  std::string what;
  if (j.is_object() && j.contains("error")) {
    const auto& e = j["error"];
    what = e.is_object() && e.contains("message") && e["message"].is_string()
             ? e["message"].get<std::string>()
             : e.dump();
  } else {
    what = body.substr(0, 200);
  }
  return fmt::format("HTTP {}: {}", status, what);
}

std::string target_of(const load_options& o) {
  return o.server.base_path
         + (o.endpoint == api_endpoint::chat ? "/v1/chat/completions" : "/v1/completions");
}

std::string host_header(const server_address& s) {
  const bool v6 = s.host.find(':') != std::string::npos;
  return (v6 ? "[" + s.host + "]" : s.host) + ":" + std::to_string(s.port);
}

std::chrono::steady_clock::duration seconds(double s) {
  // Clamped to a year: a larger timeout or arrival time would overflow the
  // clock's integer nanoseconds.
  constexpr double year = 365.0 * 24 * 3600;
  return std::chrono::duration_cast<clock_type::duration>(
    std::chrono::duration<double>(std::clamp(s, 0.0, year)));
}

double since(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

} // namespace

// -- the client -------------------------------------------------------------------

struct load_client::impl : std::enable_shared_from_this<load_client::impl> {
  // Design note. One io_context on the caller's thread. A timer walks the
  // arrivals in order and launches every request whose time has come (into
  // a FIFO when --max-concurrency is reached; an ending request launches the
  // next one waiting). Each request is a `call` with its own connection:
  // connect, write, read the header, then read the body in pieces into a
  // fixed buffer (Beast's buffer_body), feeding the SSE parser as bytes
  // arrive so each content chunk is stamped when it is read. The stream's
  // expiry is the request's whole deadline. Aborting (stop, drain
  // deadline) closes the sockets; the calls' handlers then record the end.
  struct call;

  load_options opt;
  asio::io_context ioc{1};
  asio::steady_timer arrival_timer{ioc};
  asio::steady_timer drain_timer{ioc};
  asio::signal_set signals{ioc};
  tcp::resolver::results_type endpoints;
  std::string target;
  const std::vector<load_request>* requests = nullptr;
  std::vector<request_result> results;
  clock_type::time_point t0;
  size_t next_arrival = 0;
  std::deque<size_t> waiting;
  std::unordered_map<size_t, std::weak_ptr<call>> live;
  load_progress progress;
  bool finished = false;
  std::atomic<bool> stopping{false};

  explicit impl(load_options o) : opt(std::move(o)) {}

  clock_type::time_point arrival_time(size_t i) const {
    return t0 + seconds((*requests)[i].arrival_s);
  }

  void report_progress() {
    if (!opt.on_progress)
      return;
    progress.elapsed_s = since(t0, clock_type::now());
    opt.on_progress(progress);
  }

  void schedule_arrivals() {
    if (stopping || next_arrival == requests->size())
      return;
    arrival_timer.expires_at(arrival_time(next_arrival));
    arrival_timer.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec)
        self->on_arrivals();
    });
  }

  void on_arrivals() {
    if (finished || stopping) // a wake-up that raced stop_now()
      return;
    const auto now = clock_type::now();
    while (next_arrival < requests->size() && arrival_time(next_arrival) <= now)
      waiting.push_back(next_arrival++);
    if (next_arrival == requests->size())
      arm_drain_deadline();
    launch_waiting();
    schedule_arrivals();
    maybe_finish();
  }

  void arm_drain_deadline() {
    drain_timer.expires_after(seconds(opt.drain_timeout_s));
    drain_timer.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) {
        self->waiting.clear();
        self->abort_all("drain deadline");
        self->maybe_finish();
      }
    });
  }

  void launch_waiting();
  void abort_all(const std::string& why);
  void call_ended(size_t i);

  void maybe_finish() {
    if (finished || next_arrival < requests->size() || !waiting.empty() || !live.empty())
      return;
    finished = true;
    arrival_timer.cancel();
    drain_timer.cancel();
    boost::system::error_code ignored;
    signals.cancel(ignored);
    signals.clear(ignored);
  }

  /// On the io thread.
  void stop_now() {
    if (finished)
      return;
    next_arrival = requests->size();
    waiting.clear();
    arrival_timer.cancel();
    abort_all("interrupted");
    maybe_finish();
  }
};

struct load_client::impl::call : std::enable_shared_from_this<call> {
  std::shared_ptr<impl> owner;
  size_t index;
  request_result& res;
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  http::request<http::string_body> req;
  http::response_parser<http::buffer_body> parser;
  std::array<char, 16384> piece{};
  sse_parser sse;
  std::string error_body;
  std::string stream_error;
  std::string abort_reason;
  clock_type::time_point arrival, last_chunk;
  bool saw_done = false;
  bool ended = false;

  call(std::shared_ptr<impl> o, size_t i)
    : owner(std::move(o)), index(i), res(owner->results[i]), stream(owner->ioc),
      sse(owner->opt.endpoint), arrival(owner->arrival_time(i)) {
    const auto& r = (*owner->requests)[i];
    req.method(http::verb::post);
    req.target(owner->target);
    req.version(11);
    req.set(http::field::host, host_header(owner->opt.server));
    req.set(http::field::user_agent, "metronome-bench-serve");
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "text/event-stream");
    if (!owner->opt.api_key.empty())
      req.set(http::field::authorization, "Bearer " + owner->opt.api_key);
    req.keep_alive(false);
    req.body() = request_body(owner->opt, r);
    req.prepare_payload();
    parser.body_limit(boost::none);
  }

  void start() {
    stream.expires_after(seconds(owner->opt.timeout_s));
    stream.async_connect(owner->endpoints,
                         [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
                           if (ec)
                             return self->fail("connect", ec);
                           self->write();
                         });
  }

  void write() {
    http::async_write(stream, req, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec)
        return self->fail("write", ec);
      http::async_read_header(self->stream, self->buffer, self->parser,
                              [self](beast::error_code ec, size_t) {
                                if (ec)
                                  return self->fail("read", ec);
                                self->res.http_status = int(self->parser.get().result_int());
                                self->read_body();
                              });
    });
  }

  void read_body() {
    if (parser.is_done())
      return end();
    parser.get().body().data = piece.data();
    parser.get().body().size = piece.size();
    // read_some: returns as soon as some body bytes are parsed (async_read
    // would wait until the piece is full, stamping chunks late).
    http::async_read_some(stream, buffer, parser,
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            self->on_body(ec);
                          });
  }

  void on_body(beast::error_code ec) {
    if (ec == http::error::need_buffer) // the piece is full: not an error
      ec = {};
    const size_t got = piece.size() - parser.get().body().size;
    if (got > 0)
      consume(std::string_view(piece.data(), got));
    if (ended)
      return;
    if (ec)
      return fail("read", ec);
    read_body();
  }

  void consume(std::string_view bytes) {
    if (res.http_status != 200) {
      if (error_body.size() < 4096)
        error_body.append(bytes.substr(0, 4096 - error_body.size()));
      return;
    }
    const auto now = clock_type::now();
    for (auto& c : sse.feed(bytes)) {
      if (!c.error.empty() && stream_error.empty())
        stream_error = c.error;
      if (!c.text.empty()) {
        if (res.content_chunks == 0)
          res.ttft_s = since(arrival, now);
        else
          res.itl_s.push_back(since(last_chunk, now));
        last_chunk = now;
        ++res.content_chunks;
      }
      if (!c.finish_reason.empty())
        res.finish_reason = c.finish_reason;
      if (c.prompt_tokens)
        res.server_prompt_tokens = *c.prompt_tokens;
      if (c.completion_tokens)
        res.output_tokens = *c.completion_tokens;
      saw_done = saw_done || c.done;
    }
    if (saw_done)
      end(); // the stream is complete; no need to wait for the close
  }

  void end() {
    if (ended)
      return;
    ended = true;
    res.e2e_s = since(arrival, clock_type::now());
    if (res.http_status != 200) {
      res.error = http_error_text(res.http_status, error_body);
    } else if (!stream_error.empty()) {
      res.error = stream_error;
    } else if (!saw_done && res.server_prompt_tokens < 0) {
      res.error = "the stream ended without [DONE] or usage";
    }
    if (res.server_prompt_tokens < 0 && res.output_tokens == 0)
      res.output_tokens = res.content_chunks;
    if (res.ttft_s < 0 && res.error.empty())
      res.ttft_s = res.e2e_s; // no content chunk (all text empty): first token at the end
    res.state = res.error.empty() ? request_result::outcome::ok : request_result::outcome::failed;
    close();
  }

  void fail(const char* what, beast::error_code ec) {
    if (ended)
      return;
    ended = true;
    if (!abort_reason.empty()) {
      res.error = abort_reason;
      res.state = abort_reason == "interrupted" ? request_result::outcome::interrupted
                                                : request_result::outcome::failed;
    } else {
      res.error = ec == beast::error::timeout
                    ? fmt::format("{}: timed out after {} s", what, owner->opt.timeout_s)
                    : fmt::format("{}: {}", what, ec.message());
      res.state = request_result::outcome::failed;
    }
    close();
  }

  /// Aborts from the owner (stop, drain deadline).
  void abort(const std::string& why) {
    if (ended)
      return;
    abort_reason = why;
    beast::error_code ignored;
    stream.socket().cancel(ignored);
    stream.socket().close(ignored);
  }

  void close() {
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream.socket().close(ignored);
    // The owner's bookkeeping after this handler returns (it may start the
    // next request).
    asio::post(owner->ioc, [o = owner, i = index] { o->call_ended(i); });
  }
};

void load_client::impl::launch_waiting() {
  while (!waiting.empty() && !stopping
         && (opt.max_concurrency <= 0 || int64_t(live.size()) < opt.max_concurrency)) {
    const size_t i = waiting.front();
    waiting.pop_front();
    auto& r = results[i];
    r.queue_s = since(arrival_time(i), clock_type::now());
    r.state = request_result::outcome::failed; // until it ends well
    auto c = std::make_shared<call>(shared_from_this(), i);
    live[i] = c;
    ++progress.sent;
    c->start();
  }
  report_progress();
}

void load_client::impl::abort_all(const std::string& why) {
  for (auto& [_, weak] : live)
    if (auto c = weak.lock())
      c->abort(why);
}

void load_client::impl::call_ended(size_t i) {
  live.erase(i);
  ++progress.finished;
  if (results[i].state != request_result::outcome::ok)
    ++progress.failed;
  launch_waiting();
  maybe_finish();
}

load_client::load_client(load_options options)
  : impl_(std::make_shared<impl>(std::move(options))) {}

load_client::~load_client() = default;

std::vector<request_result> load_client::run(const std::vector<load_request>& requests) {
  auto& m = *impl_;
  m.requests = &requests;
  m.results.assign(requests.size(), {});
  for (size_t i = 0; i < requests.size(); ++i) {
    m.results[i].arrival_s = requests[i].arrival_s;
    m.results[i].prompt_tokens = requests[i].prompt_tokens;
    m.results[i].max_tokens = requests[i].max_tokens;
  }
  m.progress.total = int64_t(requests.size());
  m.target = target_of(m.opt);
  try {
    tcp::resolver resolver(m.ioc);
    m.endpoints = resolver.resolve(m.opt.server.host, std::to_string(m.opt.server.port));
  } catch (const boost::system::system_error& e) {
    throw std::runtime_error("cannot resolve " + m.opt.server.host + ": " + e.code().message());
  }
  if (m.opt.stop_on_signals) {
    m.signals.add(SIGINT);
    m.signals.add(SIGTERM);
    m.signals.async_wait([self = impl_](beast::error_code ec, int) {
      if (!ec) {
        self->stopping = true;
        self->stop_now();
      }
    });
  }
  m.t0 = clock_type::now();
  if (m.stopping || requests.empty()) {
    m.next_arrival = requests.size();
    m.maybe_finish();
  } else {
    m.schedule_arrivals();
  }
  m.ioc.run();
  return std::move(m.results);
}

void load_client::stop() {
  impl_->stopping = true;
  // A weak reference: after run() the context never runs this handler, and
  // a strong one would then keep impl (which owns the context) alive.
  asio::post(impl_->ioc, [weak = std::weak_ptr<impl>(impl_)] {
    if (auto self = weak.lock(); self && self->requests)
      self->stop_now();
  });
}

bool load_client::stopped() const {
  return impl_->stopping;
}

// -- one-off requests -------------------------------------------------------------

http_reply http_get(const server_address& server, const std::string& target, double timeout_s,
                    const std::string& api_key) {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  beast::flat_buffer buffer;
  http::request<http::empty_body> req{http::verb::get, server.base_path + target, 11};
  req.set(http::field::host, host_header(server));
  req.set(http::field::user_agent, "metronome-bench-serve");
  if (!api_key.empty())
    req.set(http::field::authorization, "Bearer " + api_key);
  req.keep_alive(false);
  http::response<http::string_body> res;
  beast::error_code failure;
  const char* step = "resolve";
  tcp::resolver resolver(ioc);
  tcp::resolver::results_type endpoints;
  try {
    endpoints = resolver.resolve(server.host, std::to_string(server.port));
  } catch (const boost::system::system_error& e) {
    throw std::runtime_error("cannot resolve " + server.host + ": " + e.code().message());
  }
  stream.expires_after(seconds(timeout_s));
  step = "connect";
  stream.async_connect(endpoints, [&](beast::error_code ec, const tcp::endpoint&) {
    if (ec) {
      failure = ec;
      return;
    }
    step = "write";
    http::async_write(stream, req, [&](beast::error_code ec, size_t) {
      if (ec) {
        failure = ec;
        return;
      }
      step = "read";
      http::async_read(stream, buffer, res, [&](beast::error_code ec, size_t) { failure = ec; });
    });
  });
  ioc.run();
  if (failure)
    throw std::runtime_error(fmt::format("GET http://{}{}{}: {}: {}", host_header(server),
                                         server.base_path, target, step,
                                         failure == beast::error::timeout ? "timed out"
                                                                          : failure.message()));
  return {int(res.result_int()), std::move(res.body())};
}

std::string first_model(const server_address& server, double timeout_s,
                        const std::string& api_key) {
  auto reply = http_get(server, "/v1/models", timeout_s, api_key);
  auto j = nlohmann::json::parse(reply.body, nullptr, false);
  if (reply.status == 200 && j.is_object() && j.contains("data") && j["data"].is_array()
      && !j["data"].empty() && j["data"][0].is_object() && j["data"][0].contains("id")
      && j["data"][0]["id"].is_string())
    return j["data"][0]["id"].get<std::string>();
  throw std::runtime_error(fmt::format("GET /v1/models gave no model (HTTP {}: {})", reply.status,
                                       reply.body.substr(0, 200)));
}

} // namespace metronome::bench
