#pragma once
// One HTTP/1.1 connection: reads requests, routes them, answers the simple
// routes at once and bridges generation requests to the engine through a
// request sink actor; upgrades /v1/ws to a ws_session.
//
// Design note. Everything runs on the connection's strand and nothing
// blocks. Requests are answered strictly in order (pipelining-safe): while a
// response is in progress the session already reads the next request, which
// serves two purposes: a pipelined request is parsed and parked until the
// current response is written, and an end of stream or a reset tells that
// the client went away, which cancels the request in progress (the sink is
// killed, the engine frees its KV pages). A streaming response sends its
// status line and headers when the first delta (or the end, or an error)
// arrives, so X-Batch-Size can report the batch of the request's first
// token and an error before the first token still gets its real status.
// Output goes through one queue with one write in flight; a write that makes
// no progress for write_timeout, or a queue above max_pending_write_bytes,
// closes the connection.
//
// Logs: every request gets one access line (net/access_record.hpp), from
// the record of the response in progress, written when its last byte is
// out or the connection closes under it. A valid X-Request-Id from the
// client names the request in that line and is echoed on its answer.
//
// Access: every request's header passes access_control (Host, Origin, API
// key, Content-Type) before its body is read; a refused one is answered from
// the header and the connection closes after the answer, so a stranger's body
// is never read. On a TLS connection the handshake precedes the first read.
//
// Timeouts of the read side: a connection waits for the first byte of its
// next request for idle_timeout, then has header_timeout to deliver the
// whole request (headers and body), so a client that trickles its headers
// cannot hold the connection for the idle timeout again and again. A TLS
// connection first has header_timeout for its handshake; it then waits for
// the first bytes by reading through the TLS stream (a request may already
// be buffered there), a plain one by waiting for the socket to be readable.
//
// Limits and shutdown: a connection accepted over max_connections
// (`over_limit`) and every request while the server drains get one answer
// and a close, through the same stream (TLS or not) and after the access
// check: GET /health its usual answer (503 "draining" while draining),
// anything else 503 with Retry-After. When the drain times out,
// finish_drain() ends a generation still running with a shutting_down
// error (an SSE error event and [DONE] once the stream has started, a 503
// body otherwise) and closes.

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "net/write_queue.hpp"
#include "net/access_record.hpp"
#include "net/api_error.hpp"
#include "net/connection_stream.hpp"
#include "net/http_routes.hpp"
#include "net/openai_response.hpp"
#include "net/request_sink.hpp"
#include "net/server_context.hpp"

namespace metronome::net {

class http_session : public sink_listener, public std::enable_shared_from_this<http_session> {
public:
  using request_type = boost::beast::http::request<boost::beast::http::string_body>;
  using response_type = boost::beast::http::response<boost::beast::http::string_body>;

  /// `socket` must use `strand` as its executor; a TLS stream handshakes
  /// in start(). `slot` counts the connection (in connections, or
  /// overflow_connections when `over_limit`) until the session, or the
  /// WebSocket session it becomes, ends.
  http_session(connection_stream socket, strand_type strand, std::shared_ptr<server_context> ctx,
               gauge_slot slot, bool over_limit = false);

  ~http_session() override;

  /// Starts reading (after the TLS handshake, on a TLS stream). Called
  /// once, from any thread (hops to the strand).
  void start();

  // -- sink_listener (strand) ------------------------------------------------------

  void on_delta(uint64_t tag, text_delta& delta) override;

  void on_done(uint64_t tag, generation_done& done) override;

  void on_error(uint64_t tag, generation_error& error) override;

  void close_now() override;

  void finish_drain() override;

private:
  /// The generation request in progress.
  struct active_request {
    uint64_t tag = 0;
    request_sink_actor sink;
    response_meta meta;
    bool stream = false;
    /// The status line and headers are out (streaming).
    bool headers_sent = false;
    /// Chunked framing (HTTP/1.1) or raw until close (HTTP/1.0).
    bool chunked = true;
    /// The text so far (non-streaming).
    std::string text;
    /// The log-probabilities so far (non-streaming, meta.logprobs).
    std::vector<position_logprobs> logprobs;
    /// Where a stream's completion logprobs continue (text_offset).
    logprobs_cursor cursor;
    int32_t first_token_batch_size = 0;
    /// X-KV-Cache-Strategy: the server's, with the client's mode when it
    /// chose one.
    std::string kv_strategy;
    /// What the KV overflow supervision did to it so far
    /// (text_delta::kv_overflow), for X-KV-Cache-Strategy.
    std::string kv_overflow;
    unsigned version = 11;
    bool keep_alive = true;
    /// Counts the request in requests_in_flight while it lives.
    gauge_slot in_flight;
  };

  /// See phase_.
  enum class read_phase { handshake, first_byte, request };

  /// One queued write.
  struct out_entry {
    std::string data;
    /// The last bytes of a response.
    bool ends_response = false;
  };

  // -- reading ---------------------------------------------------------------------

  /// The TLS handshake (header_timeout), then read_header().
  void handshake();
  /// Waits for the next request's first byte (idle_timeout), unless the
  /// buffer already holds it, then reads its header. Plain TCP waits for
  /// the socket to be readable; TLS reads the first bytes through the
  /// stream, which may hold some already.
  void read_header();
  void on_readable(boost::system::error_code ec);
  /// Reads the header of a request whose first byte is here (header_timeout).
  void read_request();
  void on_header(boost::system::error_code ec);
  /// Answers a request that access_control refused, from its header alone,
  /// and closes after the answer (its body is not read).
  void refuse_access(api_error err);
  void on_body(boost::system::error_code ec);
  void finish_read();
  void on_read_error(boost::system::error_code ec);

  // -- routing ---------------------------------------------------------------------

  void dispatch(request_type req);
  void start_generation(api_kind kind, request_type& req);
  /// POST /tokenize and /detokenize: answered here, with the engine's
  /// tokenizer (no engine round trip; the body is at most max_body_bytes).
  void answer_tokenizer_route(route r, const request_type& req);
  /// Takes the client's X-Request-Id for the response in progress when it
  /// is valid (valid_request_id); ignores it otherwise.
  void read_request_id(std::string_view header);
  /// Over the limit or draining: one answer (see the top), then close.
  void refuse(route r, boost::beast::http::verb method, std::string_view path, unsigned version);
  void upgrade(request_type req);

  // -- answers ---------------------------------------------------------------------

  /// A complete response; `close` adds Connection: close and closes after it.
  void send_response(response_type res, bool close = false);
  void send_error(const api_error& err, unsigned version, bool keep_alive,
                  bool close_after = false);
  void send_stream_headers(int32_t batch_size);
  /// Adds the generation headers (X-Batch-Size if > 0, X-Inference-Version,
  /// X-KV-Cache-Strategy, X-Request-Id).
  template <class Message>
  void add_generation_headers(Message& res, int32_t batch_size) const;
  void send_stream_event(std::string event, bool ends_response);

  // -- writing ---------------------------------------------------------------------

  void queue(std::string data, bool ends_response);
  void write_next();
  void on_response_complete();
  /// Starts the access record of a request (`method`, `target`) now.
  std::unique_ptr<access_record> new_access(std::string_view method,
                                            std::string_view target) const;

  // -- closing ---------------------------------------------------------------------

  /// Cancels the request in progress and closes the socket now.
  void close();
  /// After a final response with Connection: close: stop sending, discard
  /// what the client still sends for a moment (so it reads our answer
  /// instead of a reset), then close.
  void linger_close();
  void drain();
  /// Arms the read timer for the phase the read is in (idle or request).
  void arm_read_timer();

  connection_stream socket_;
  strand_type strand_;
  std::shared_ptr<server_context> ctx_;
  /// Declared after ctx_: given back before the context may go.
  gauge_slot slot_;
  const bool over_limit_;
  std::shared_ptr<strand_port> port_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  boost::asio::steady_timer idle_timer_;
  boost::asio::steady_timer write_timer_;
  uint64_t idle_generation_ = 0;
  uint64_t write_generation_ = 0;
  /// Bounded by max_pending_write_bytes; overflowed: close() is posted and
  /// queue() drops output.
  write_queue<out_entry> outbox_;
  bool writing_ = false;
  bool reading_ = false;
  /// What the read in progress waits for: the TLS handshake
  /// (header_timeout), a request's first byte (idle_timeout), or the rest of
  /// a request that has begun (header_timeout).
  read_phase phase_ = read_phase::first_byte;
  /// A response is in progress (from dispatch until its last byte is out).
  bool busy_ = false;
  /// Close once the response in progress is written.
  bool close_after_ = false;
  bool closed_ = false;
  bool lingering_ = false;
  /// A pipelined request, or the error answering an unreadable one.
  std::optional<request_type> pending_;
  std::optional<api_error> pending_error_;
  std::optional<active_request> active_;
  /// Set while a generation request is in progress (see start_generation).
  std::shared_ptr<http_session> self_;
  uint64_t next_tag_ = 1;
  std::string drain_buffer_;
  /// Access-Control-Allow-Origin of the response in progress (empty: none).
  std::string allow_origin_;
  /// The client's X-Request-Id of the response in progress, echoed on it
  /// (empty: none, or not valid; generation answers then carry their own id).
  std::string request_id_header_;
  /// The client's address, for access lines.
  std::string client_;
  /// The access record of the response in progress, and of the refusal
  /// parked in pending_error_.
  std::unique_ptr<access_record> access_;
  std::unique_ptr<access_record> pending_access_;
};

} // namespace metronome::net
