// libFuzzer target: the WebSocket message parser (net/ws_protocol.hpp), every
// text message a client sends on /v1/ws. Properties: it never throws; ids
// are within max_ws_id_bytes; a refused message's error event is JSON; the
// events the server formats from what it parsed are JSON whatever the id.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "net/ws_protocol.hpp"
#include "tests/fuzz/fuzz_check.hpp"

using namespace metronome;

namespace {

bool is_json(const std::string& s) {
  return nlohmann::json::accept(s);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text{reinterpret_cast<const char*>(data), size};
  net::parse_defaults defaults;
  defaults.model_name = "m";
  auto msg = net::parse_ws_message(text, defaults);
  if (auto* chat = std::get_if<net::ws_chat>(&msg)) {
    FUZZ_CHECK(!chat->id.empty() && chat->id.size() <= net::max_ws_id_bytes, "chat id length");
    // 0 max_tokens is the engine's "unset" (up to the context's end).
    auto p = chat->request.request.params;
    if (p.max_tokens == 0)
      p.max_tokens = 1;
    FUZZ_CHECK(p.validate().empty(), "accepted parameters the engine refuses");
    FUZZ_CHECK(is_json(net::ws_delta_event(chat->id, "x")), "delta event is not JSON");
    FUZZ_CHECK(is_json(net::ws_cancelled_event(chat->id)), "cancelled event is not JSON");
  } else if (auto* cancel = std::get_if<net::ws_cancel>(&msg)) {
    FUZZ_CHECK(cancel->id.size() <= net::max_ws_id_bytes, "cancel id length");
    FUZZ_CHECK(is_json(net::ws_cancelled_event(cancel->id)), "cancelled event is not JSON");
  } else if (auto* ping = std::get_if<net::ws_ping>(&msg)) {
    FUZZ_CHECK(is_json(net::ws_pong_event(ping->id)), "pong event is not JSON");
  } else {
    auto& bad = std::get<net::ws_bad>(msg);
    FUZZ_CHECK(bad.error.status >= 400 && bad.error.status < 600, "refusal without an error status");
    FUZZ_CHECK(is_json(net::ws_error_event(bad.id, bad.error)), "error event is not JSON");
  }
  return 0;
}
