// libFuzzer target: the OpenAI request parser (net/openai_request.hpp), the
// path of every POST /v1/chat/completions and /v1/completions body and of the
// WebSocket `chat` message. Input: one byte choosing the endpoint and source,
// then the body. Properties: it never throws; an accepted request carries
// sampling parameters the engine accepts; a refusal is a 4xx/5xx with a JSON
// body; the body reader (net/json_reader.hpp, simdjson) accepts what
// nlohmann's parser accepts and builds the same document.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "net/json_reader.hpp"
#include "net/openai_request.hpp"
#include "tests/fuzz/fuzz_check.hpp"

using namespace metronome;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1)
    return 0;
  const auto mode = data[0];
  const std::string_view body{reinterpret_cast<const char*>(data + 1), size - 1};
  net::parse_defaults defaults;
  defaults.model_name = "m";
  const auto kind = (mode & 1) ? net::api_kind::completion : net::api_kind::chat;
  const auto source = (mode & 2) ? net::request_source::websocket : net::request_source::http;

  {
    const auto reference = nlohmann::json::parse(body, nullptr, false);
    const auto fast = net::read_json(body);
    FUZZ_CHECK(fast.has_value() == !reference.is_discarded(), "read_json and nlohmann disagree");
    // == compares numbers by value: "-0" is the one type difference.
    FUZZ_CHECK(!fast || *fast == reference, "read_json built another document");
  }
  auto json = net::parse_json(body);
  std::expected<net::openai_request, net::api_error> r;
  if (json)
    r = net::parse_openai_request(kind, *json, defaults, source);
  else
    r = std::unexpected(json.error());
  if (source == net::request_source::http) {
    // parse_openai_body is the same two steps.
    auto direct = net::parse_openai_body(kind, body, defaults);
    FUZZ_CHECK(direct.has_value() == r.has_value(), "parse_openai_body disagrees");
  }
  if (r) {
    // 0 max_tokens is the engine's "unset" (up to the context's end).
    auto p = r->request.params;
    FUZZ_CHECK(p.max_tokens >= 0, "negative max_tokens accepted");
    if (p.max_tokens == 0)
      p.max_tokens = 1;
    FUZZ_CHECK(p.validate().empty(), "accepted parameters the engine refuses");
    FUZZ_CHECK(r->kind == kind, "wrong kind");
  } else {
    FUZZ_CHECK(r.error().status >= 400 && r.error().status < 600, "refusal without an error status");
    FUZZ_CHECK(nlohmann::json::accept(r.error().body()), "error body is not JSON");
  }
  return 0;
}
