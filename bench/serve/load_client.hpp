#pragma once
// An open-loop load client for OpenAI-compatible servers (Metronome, vLLM,
// ...): each request goes out at its arrival time whether or not earlier
// ones have been answered, streams its answer over SSE, and has its
// timings recorded (TTFT, every inter-chunk gap, end to end). The engine
// behind `metronome bench-serve`.
//
// Threading: load_client::run() runs an io_context on the calling thread
// and returns when every request has ended; all callbacks run there.
// stop() may be called from any thread (and SIGINT / SIGTERM call it when
// load_options::stop_on_signals is set).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bench/serve/sse_parser.hpp"

namespace metronome::bench {

/// Where the server is: http://HOST[:PORT][/PATH].
struct server_address {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;
  /// A path prefix before /v1/... ("" or "/prefix", no trailing slash).
  std::string base_path;
};

/// Parses "http://HOST[:PORT][/PATH]" (IPv6 hosts in brackets; a trailing
/// "/v1" is dropped). Throws std::invalid_argument saying what is wrong.
server_address parse_url(std::string_view url);

/// True for localhost, 127.0.0.0/8 and ::1.
bool is_loopback_host(std::string_view host);

/// One request to send.
struct load_request {
  /// Seconds after the start of the run.
  double arrival_s = 0;
  std::string prompt;
  /// Its token count as built (prompt_builder).
  int32_t prompt_tokens = 0;
  /// max_tokens (with ignore_eos, the output length).
  int32_t max_tokens = 1;
};

/// What happened to one request. Times are seconds from its arrival (the
/// scheduled send time), so a wait for --max-concurrency counts in them.
struct request_result {
  enum class outcome { not_sent, ok, failed, interrupted };
  outcome state = outcome::not_sent;
  double arrival_s = 0;
  /// Scheduled arrival to the moment it was sent.
  double queue_s = -1;
  /// To the first content chunk; -1 if none came.
  double ttft_s = -1;
  /// To the end of the stream; -1 if it never ended.
  double e2e_s = -1;
  /// Gaps between consecutive content chunks (a chunk may carry more than
  /// one token; Metronome and vLLM send one per token).
  std::vector<double> itl_s;
  int32_t content_chunks = 0;
  /// usage.completion_tokens, or the content chunks when no usage came.
  int32_t output_tokens = 0;
  /// usage.prompt_tokens; -1 without usage.
  int32_t server_prompt_tokens = -1;
  /// As the client built it.
  int32_t prompt_tokens = 0;
  int32_t max_tokens = 0;
  int http_status = 0;
  std::string finish_reason;
  /// Why it failed ("" when ok).
  std::string error;
};

/// Counters for a progress display.
struct load_progress {
  int64_t total = 0;
  int64_t sent = 0;
  int64_t finished = 0;
  int64_t failed = 0;
  double elapsed_s = 0;
};

struct load_options {
  server_address server;
  api_endpoint endpoint = api_endpoint::completions;
  std::string model;
  /// Sent as "Authorization: Bearer ..." when not empty.
  std::string api_key;
  /// Per request, from connect to the end of the stream.
  double timeout_s = 600;
  /// At most this many requests in flight (0 = no cap); later arrivals wait.
  int32_t max_concurrency = 0;
  /// After the last arrival, requests still running after this long are
  /// aborted (error "drain deadline") and waiting ones are not sent.
  double drain_timeout_s = 600;
  /// SIGINT / SIGTERM call stop() while run() runs.
  bool stop_on_signals = true;
  /// Called on the io thread when a request is sent or ends.
  std::function<void(const load_progress&)> on_progress;
};

class load_client {
public:
  explicit load_client(load_options options);
  ~load_client();
  load_client(const load_client&) = delete;
  load_client& operator=(const load_client&) = delete;

  /// Sends `requests` (sorted by arrival) open-loop and waits until each
  /// has ended, on the calling thread. One result per request, in order;
  /// after stop() those never sent stay not_sent. Throws
  /// std::runtime_error when the host cannot be resolved. Call once.
  std::vector<request_result> run(const std::vector<load_request>& requests);

  /// Stops sending and aborts the requests in flight (outcome
  /// interrupted); run() then returns. Any thread.
  void stop();

  /// Whether stop() was called (by a signal or otherwise). Any thread.
  bool stopped() const;

private:
  struct impl;
  std::shared_ptr<impl> impl_;
};

/// A blocking HTTP GET on the caller's thread. Throws std::runtime_error on
/// a network error or after `timeout_s`.
struct http_reply {
  int status = 0;
  std::string body;
};
http_reply http_get(const server_address& server, const std::string& target, double timeout_s,
                    const std::string& api_key = {});

/// The first model id of GET /v1/models. Throws std::runtime_error saying
/// what the server answered when there is none.
std::string first_model(const server_address& server, double timeout_s,
                        const std::string& api_key = {});

} // namespace metronome::bench
