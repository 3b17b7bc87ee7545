#pragma once
// One WebSocket connection at /v1/ws (protocol: ws_protocol.hpp and
// docs/protocol.md): several concurrent chat requests with client-chosen
// ids, each bridged to the engine by its own request sink actor.
//
// Design note. Like http_session, everything runs on the connection's
// strand and nothing blocks: one read in flight (the next message), one
// write in flight (the event queue). A bad message is answered with an error
// event and the connection stays usable. `cancel` kills the request's sink
// and answers at once with a `done` event whose finish_reason is
// "cancelled"; events the sink had already posted for it are dropped (each
// request has a tag, and ids can be reused right after their done). Closing
// the socket, a protocol error, an oversized message (1009), a client that
// stops reading, or the server's stop cancel every request of the
// connection. While the server drains, a new chat gets an error event
// (503 shutting_down); when the drain times out, finish_drain() ends every
// request still running with that error and closes with 1001 (going away)
// once the queued events are written.
//
// Logs: each chat gets one access line (net/access_record.hpp, method "WS",
// status 200 for a done, the error's status otherwise, 499 for a chat its
// client abandoned by closing the connection); a rejected message too.

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket/stream.hpp>

#include "net/access_record.hpp"
#include "net/connection_stream.hpp"
#include "net/write_queue.hpp"
#include "net/request_sink.hpp"
#include "net/server_context.hpp"
#include "net/ws_protocol.hpp"

namespace metronome::net {

class ws_session : public sink_listener, public std::enable_shared_from_this<ws_session> {
public:
  using request_type = boost::beast::http::request<boost::beast::http::string_body>;

  /// `socket` must use `strand` as its executor; `slot` is the
  /// connection's count, taken over from its HTTP session; `client` its
  /// address, for access lines.
  ws_session(connection_stream socket, strand_type strand, std::shared_ptr<server_context> ctx,
             gauge_slot slot, std::string client);

  ~ws_session() override;

  /// Answers the upgrade request (access_control has passed it; the answer
  /// names the subprotocol access_control::ws_subprotocol picks) and starts
  /// reading. Strand only.
  void start(request_type upgrade);

  // -- sink_listener (strand) ------------------------------------------------------

  void on_delta(uint64_t tag, text_delta& delta) override;

  void on_done(uint64_t tag, generation_done& done) override;

  void on_error(uint64_t tag, generation_error& error) override;

  void close_now() override;

  void finish_drain() override;

private:
  struct live_request {
    uint64_t tag = 0;
    request_sink_actor sink;
    /// It asked for logprobs: every delta carries a logprobs object.
    bool logprobs = false;
    /// Counts the request in requests_in_flight while it lives.
    gauge_slot in_flight;
    /// Its access line, written when it ends.
    std::unique_ptr<access_record> access;
  };

  void read();
  void on_read(boost::system::error_code ec, size_t bytes);
  void handle(std::string_view text);
  void start_chat(ws_chat& chat, access_record::clock::time_point arrival);
  /// Logs the access line of a message refused with `error`.
  void log_refusal(const std::optional<std::string>& id, const api_error& error,
                   access_record::clock::time_point arrival) const;
  void cancel(const std::string& id);

  void send(std::string event);
  void write_next();

  /// The id of the request with `tag`, or nullptr.
  const std::string* id_of(uint64_t tag) const;
  void forget(uint64_t tag);

  /// Sends a close frame with 1001 (going away), then close().
  void close_going_away();

  /// Cancels every request and closes the socket.
  void close();

  boost::beast::websocket::stream<connection_stream> ws_;
  strand_type strand_;
  std::shared_ptr<server_context> ctx_;
  /// Declared after ctx_: given back before the context may go.
  gauge_slot slot_;
  std::shared_ptr<strand_port> port_;
  request_type upgrade_;
  boost::beast::flat_buffer buffer_;
  /// Bounded by max_pending_write_bytes; overflowed: close() is posted and
  /// send() drops events.
  write_queue<std::string> outbox_;
  bool writing_ = false;
  /// The handshake is done (a close frame may be sent).
  bool accepted_ = false;
  /// finish_drain(): close with 1001 once the outbox is written; events
  /// and messages after that are dropped.
  bool going_away_ = false;
  bool closed_ = false;
  std::unordered_map<std::string, live_request> live_;
  std::unordered_map<uint64_t, std::string> ids_;
  uint64_t next_tag_ = 1;
  std::string client_;
};

} // namespace metronome::net
