#pragma once
// One request's access line (docs/operations.md, "Logs"): what the edge
// learns of a request as it goes (route, status, tokens, time to first
// token, the end), written exactly once when the request ends, however it
// ends: answered, refused, failed, cancelled by its client or by the drain.
//
//   access method=POST route=/v1/chat/completions status=200 client=127.0.0.1
//     request_id=chatcmpl-7 prompt_tokens=12 output_tokens=40 ttft_ms=8.1
//     e2e_ms=95.3 finish_reason=length
//
// (one line; as JSON fields with --log-format json). Times are the edge's:
// from the request's arrival (its header read; a WebSocket chat: its message
// read) to its first generated text and to its last byte queued. A request
// the client abandoned before any status was sent reports 499 (nginx's
// "client closed request"). A request that carried a valid X-Request-Id
// is logged under that id (request_id), with the response's own id as
// response_id. The route is the path without its query (which
// may hold ?api_key=). Client text (paths, WebSocket ids) is escaped; the
// prompt and the output appear only with logging.log_prompts.
//
// Level: info; /health and successful /metrics (probes and scrapes,
// several a minute) at debug.
//
// Owned by one connection; its strand only.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "actors/messages.hpp"
#include "net/api_error.hpp"

namespace metronome::net {

class access_record {
public:
  using clock = std::chrono::steady_clock;

  /// Most prompt or output bytes an access line carries (log_prompts).
  static constexpr size_t max_text_bytes = 8 * 1024;

  /// A request that arrived at `arrival`: `method` (or "WS" for a WebSocket
  /// chat), `target` (its query is dropped), the client's address.
  access_record(std::string_view method, std::string_view target, std::string client,
                clock::time_point arrival = clock::now());

  /// Not copied or moved: exactly one line per record (hold it by pointer).
  access_record(const access_record&) = delete;
  access_record& operator=(const access_record&) = delete;

  /// Writes the line if nothing did yet, as on_client_gone().
  ~access_record();

  /// Called with the route and status as the line is written (the HTTP
  /// response counters); on the thread that writes it.
  using observer = std::function<void(std::string_view route, int status)>;
  void set_observer(observer o) {
    observer_ = std::move(o);
  }

  /// The request reached the engine as `id`: the line gets its tokens and
  /// times.
  void set_request_id(std::string id) {
    request_id_ = std::move(id);
    generation_ = true;
  }
  /// The client's X-Request-Id (checked by valid_request_id): the line's
  /// request_id; the engine's id, when there is one, becomes response_id.
  void set_client_request_id(std::string id) {
    client_request_id_ = std::move(id);
  }
  /// The client's id of a WebSocket chat.
  void set_ws_id(std::string_view id);
  /// The prompt, kept only when `log_prompts`.
  void set_prompt(std::string text);
  void keep_output() {
    keep_output_ = true;
  }

  /// The status line sent; the first one counts.
  void on_status(int status);
  void on_delta(const text_delta& d, clock::time_point now = clock::now());
  void on_done(const generation_done& d);
  /// The request failed with `e` (its status counts if none was sent).
  void on_error(const api_error& e);
  /// An error answer's body ({"error": {"code"}}) names the error, unless
  /// one is known already.
  void on_error_body(std::string_view body);
  /// The client cancelled or went away: status 499 when none was sent;
  /// a generation that had not ended ends as cancelled.
  void on_client_gone();

  /// Writes the line; later calls do nothing.
  void write(clock::time_point now = clock::now());

  bool written() const {
    return written_;
  }

  /// A real request: not the placeholder of a connection that closed
  /// before sending one ("-").
  bool has_request() const {
    return method_ != "-";
  }

  /// Drops the record without a line (a connection that sent no request).
  void discard() {
    written_ = true;
  }

private:
  bool written_ = false;
  observer observer_;
  /// Set by set_request_id, set_prompt and the sink's events.
  std::string method_;
  std::string route_;
  std::string client_;
  clock::time_point arrival_;
  std::optional<clock::time_point> first_token_;
  std::string request_id_;
  std::string client_request_id_;
  std::optional<std::string> ws_id_;
  int status_ = 0;
  bool generation_ = false;
  int32_t prompt_tokens_ = 0;
  int32_t output_tokens_ = 0;
  int32_t cached_tokens_ = 0;
  std::string finish_reason_;
  std::string error_code_;
  std::optional<std::string> prompt_;
  bool keep_output_ = false;
  std::string output_;
};

/// The prompt of `req` as an access line carries it (logging.log_prompts):
/// a chat's messages as a JSON array of {role, content}, a completion's
/// prompt text (or its token ids as a JSON array).
std::string prompt_text(const generate_request& req);

} // namespace metronome::net
