// libFuzzer target: the HTTP request path in process. Two http_servers on
// 127.0.0.1 in front of the fake engine (tests/net/fake_engine.hpp), one
// open and one requiring an API key with an allowed origin; each input is
// one byte choosing the server, then the bytes a client sends on a fresh
// connection, which is then half-closed and read to its end. That drives
// the whole server side: Beast's parser under the server's limits, the access
// checks, routing, the body parsers, the request sink and the response and
// SSE writers, the WebSocket upgrade and its message loop. Properties:
// nothing crashes or trips a sanitizer; every answer starts with an HTTP
// status line; the server closes a half-closed connection within the
// timeouts, and still answers /health afterwards.

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include <arpa/inet.h>
#include <poll.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "caf/all.hpp"
#include <spdlog/spdlog.h>

#include "net/http_server.hpp"
#include "tests/fuzz/fuzz_check.hpp"
#include "tests/net/fake_engine.hpp"

using namespace metronome;

namespace {

struct servers {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::shared_ptr<test::fake_stats> stats = std::make_shared<test::fake_stats>();
  engine eng;
  std::unique_ptr<net::http_server> open;
  std::unique_ptr<net::http_server> keyed;

  servers() {
    // Bad requests are logged as warnings; millions of them are noise.
    spdlog::set_level(spdlog::level::off);
    cfg.set("scheduler.max-threads", 2);
    sys = std::make_unique<caf::actor_system>(cfg);
    eng = test::make_fake_engine(*sys, stats);
    net::server_options opts;
    opts.host = "127.0.0.1";
    opts.port = 0;
    opts.io_threads = 1;
    opts.max_body_bytes = 64 * 1024;
    opts.max_ws_message_bytes = 32 * 1024;
    opts.max_streams_per_connection = 4;
    // Short, so that a request the input leaves unfinished ends soon.
    opts.request_timeout = std::chrono::seconds(2);
    opts.header_timeout = std::chrono::seconds(2);
    opts.idle_timeout = std::chrono::seconds(2);
    opts.write_timeout = std::chrono::seconds(2);
    opts.max_connections = 64;
    open = std::make_unique<net::http_server>(*sys, eng, opts);
    open->start();
    opts.api_keys = {"fuzz-key"};
    opts.allowed_origins = {"http://allowed.example"};
    opts.allowed_hosts = {"allowed.example"};
    keyed = std::make_unique<net::http_server>(*sys, eng, opts);
    keyed->start();
  }
};

servers& the_servers() {
  // Never destroyed: libFuzzer exits without unwinding, and the io threads
  // must not outlive what they use.
  static auto* s = new servers;
  return *s;
}

/// A blocking loopback connection with a receive timeout; -1 on failure.
int connect_to(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  if (rc != 0 && errno == EINTR) {
    // A signal (libFuzzer's timers raise SIGALRM every second) interrupted
    // the connect, which goes on in the background: wait for it to end.
    pollfd p{fd, POLLOUT, 0};
    int ready = 0;
    while ((ready = ::poll(&p, 1, 5000)) < 0 && errno == EINTR) {
    }
    int err = ready > 0 ? 0 : ETIMEDOUT;
    socklen_t len = sizeof err;
    if (ready > 0)
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    rc = err == 0 ? 0 : -1;
    errno = err;
  }
  if (rc != 0) {
    const int why = errno;
    ::close(fd);
    errno = why; // for the caller: EADDRNOTAVAIL is worth a retry
    return -1;
  }
  return fd;
}

/// Sends `bytes`, half-closes, reads to the end; false when the server
/// neither answered nor closed within the receive timeout.
bool exchange(uint16_t port, const char* bytes, size_t n, std::string& answer) {
  int fd = connect_to(port);
  // Over a long run, thousands of connections a second leave the loopback's
  // ephemeral ports in TIME_WAIT (60 s each): connect() then fails with
  // EADDRNOTAVAIL, a limit of the machine, not a finding. Wait for ports to
  // come free (up to 60 s); any other failure is a finding.
  for (int tries = 0; fd < 0 && errno == EADDRNOTAVAIL && tries < 600; ++tries) {
    ::usleep(100'000);
    fd = connect_to(port);
  }
  if (fd < 0)
    std::fprintf(stderr, "connect: %s\n", std::strerror(errno));
  FUZZ_CHECK(fd >= 0, "cannot connect to the server");
  size_t sent = 0;
  while (sent < n) {
    auto k = ::send(fd, bytes + sent, n - sent, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR)
      continue; // a signal, not the server
    if (k <= 0)
      break; // the server closed first (an early refusal): read its answer
    sent += size_t(k);
  }
  ::shutdown(fd, SHUT_WR);
  bool ended = true;
  // The receive timeout restarts after each interrupted recv: bound the
  // whole read by it too.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  char buf[16384];
  for (;;) {
    auto k = ::recv(fd, buf, sizeof buf, 0);
    if (k < 0 && errno == EINTR && std::chrono::steady_clock::now() < deadline)
      continue; // a signal (read as the end, this cut answers short)
    if (k > 0) {
      if (answer.size() < (1u << 20))
        answer.append(buf, size_t(k));
      continue;
    }
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
      ended = false;
    break;
  }
  ::close(fd);
  return ended;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto& s = the_servers();
  if (size < 1)
    return 0;
  const uint16_t port = (data[0] & 1) ? s.keyed->port() : s.open->port();
  std::string answer;
  bool ended = exchange(port, reinterpret_cast<const char*>(data + 1), size - 1, answer);
  FUZZ_CHECK(ended, "the server kept a half-closed connection open past its timeouts");
  FUZZ_CHECK(answer.empty() || answer.starts_with("HTTP/1.1 ") || answer.starts_with("HTTP/1.0 "),
             "an answer without a status line");
  // The fake engine remembers every request; keep memory flat.
  {
    std::lock_guard<std::mutex> guard{s.stats->mtx};
    s.stats->seen.clear();
  }
  // Still serving (every 16th input: the check costs a connection).
  static unsigned n = 0;
  if (++n % 16 != 0)
    return 0;
  static const char health[] = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  std::string h;
  FUZZ_CHECK(exchange(port, health, sizeof health - 1, h), "/health did not end");
  // The servers' own count of open connections (the limit is 64 each):
  // at a failure, and now and then, so that a count that keeps growing
  // while the fuzzer holds one connection at a time shows.
  if (!h.starts_with("HTTP/1.1 200") || n % 65536 == 0)
    std::fprintf(stderr, "after %u inputs: connections open %zu and %zu, requests in flight "
                         "%zu and %zu\n",
                 n, s.open->connections(), s.keyed->connections(), s.open->requests_in_flight(),
                 s.keyed->requests_in_flight());
  if (!h.starts_with("HTTP/1.1 200"))
    std::fprintf(stderr, "/health answered: %s\n", h.substr(0, h.find("\r\n\r\n")).c_str());
  FUZZ_CHECK(h.starts_with("HTTP/1.1 200"), "/health does not answer 200");
  return 0;
}
