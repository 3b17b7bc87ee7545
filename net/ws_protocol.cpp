#include "net/ws_protocol.hpp"

#include "net/json_reader.hpp"

#include <fmt/format.h>

#include "net/openai_response.hpp"

namespace metronome::net {

using json = nlohmann::json;

namespace {

/// The message's "id": nullopt when absent, an error when not a usable
/// string.
std::variant<std::optional<std::string>, api_error> read_id(const json& msg) {
  auto i = msg.find("id");
  if (i == msg.end() || i->is_null())
    return std::optional<std::string>{};
  if (!i->is_string())
    return api_error::bad_request("'id' must be a string", "id", "invalid_type");
  const auto& id = i->get_ref<const std::string&>();
  if (id.empty() || id.size() > max_ws_id_bytes)
    return api_error::bad_request(
      fmt::format("'id' must hold 1 to {} bytes, got {}", max_ws_id_bytes, id.size()), "id");
  return std::optional<std::string>{id};
}

double ms(double seconds) {
  return seconds * 1000.0;
}

} // namespace

ws_message parse_ws_message(std::string_view text, const parse_defaults& defaults) {
  auto parsed = parse_json(text);
  if (!parsed)
    return ws_bad{std::nullopt, std::move(parsed.error())};
  json_disposer dispose{*parsed};
  const auto& msg = *parsed;
  if (!msg.is_object())
    return ws_bad{std::nullopt,
                  api_error::bad_request("a message must be a JSON object", "", "invalid_type")};
  auto id_or_error = read_id(msg);
  if (auto* err = std::get_if<api_error>(&id_or_error))
    return ws_bad{std::nullopt, std::move(*err)};
  auto id = std::get<std::optional<std::string>>(std::move(id_or_error));
  auto t = msg.find("type");
  if (t == msg.end() || !t->is_string())
    return ws_bad{id, api_error::bad_request("'type' must be one of chat, cancel, ping", "type",
                                             t == msg.end() ? "missing_required_parameter"
                                                            : "invalid_type")};
  const auto& type = t->get_ref<const std::string&>();
  if (type == "ping")
    return ws_ping{std::move(id)};
  if (type == "cancel") {
    if (!id)
      return ws_bad{std::nullopt, api_error::bad_request("'cancel' needs the request's 'id'",
                                                         "id", "missing_required_parameter")};
    return ws_cancel{std::move(*id)};
  }
  if (type == "chat") {
    if (!id)
      return ws_bad{std::nullopt,
                    api_error::bad_request("'chat' needs an 'id' chosen by the client", "id",
                                           "missing_required_parameter")};
    auto req = parse_openai_request(api_kind::chat, msg, defaults, request_source::websocket);
    if (!req)
      return ws_bad{std::move(id), std::move(req.error())};
    return ws_chat{std::move(*id), std::move(*req)};
  }
  return ws_bad{std::move(id),
                api_error::bad_request(
                  fmt::format("unknown message type '{}'; expected chat, cancel or ping", type),
                  "type")};
}

std::string ws_delta_event(const std::string& id, std::string_view text,
                           const std::vector<position_logprobs>* logprobs) {
  nlohmann::json e = {{"type", "delta"}, {"id", id}, {"text", text}};
  if (logprobs) {
    logprobs_cursor unused;
    e["logprobs"] = logprobs_json(api_kind::chat, *logprobs, unused);
  }
  return dump_json(e);
}

std::string ws_done_event(const std::string& id, const generation_done& done) {
  return dump_json({{"type", "done"},
                    {"id", id},
                    {"finish_reason", std::string(to_string(done.finish_reason))},
                    {"usage", usage_json(done)},
                    {"timings",
                     {{"queue_ms", ms(done.queue_s)},
                      {"ttft_ms", ms(done.ttft_s)},
                      {"e2e_ms", ms(done.e2e_s)}}},
                    {"batch_size", done.first_token_batch_size}});
}

std::string ws_cancelled_event(const std::string& id) {
  return dump_json({{"type", "done"},
                    {"id", id},
                    {"finish_reason", std::string(to_string(finish_kind::cancelled))}});
}

std::string ws_error_event(const std::optional<std::string>& id, const api_error& error) {
  json j = {{"type", "error"}};
  if (id)
    j["id"] = *id;
  j["error"] = error.inner_json();
  j["error"]["status"] = error.status;
  return dump_json(j);
}

std::string ws_pong_event(const std::optional<std::string>& id) {
  json j = {{"type", "pong"}};
  if (id)
    j["id"] = *id;
  return dump_json(j);
}

} // namespace metronome::net
