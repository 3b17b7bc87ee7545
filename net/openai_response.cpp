#include "net/openai_response.hpp"

#include <fmt/format.h>

#include "net/api_error.hpp"

namespace metronome::net {

using json = nlohmann::json;

namespace {

const char* object_name(api_kind kind, bool chunk) {
  if (kind == api_kind::chat)
    return chunk ? "chat.completion.chunk" : "chat.completion";
  return "text_completion";
}

json envelope(const response_meta& meta, bool chunk) {
  return {{"id", meta.id},
          {"object", object_name(meta.kind, chunk)},
          {"created", meta.created},
          {"model", meta.model},
          {"system_fingerprint", nullptr}};
}

json choice(const response_meta& meta, json delta_or_text, const json& finish_reason) {
  json c = {{"index", 0}};
  if (meta.kind == api_kind::chat)
    c["delta"] = std::move(delta_or_text);
  else
    c["text"] = std::move(delta_or_text);
  c["logprobs"] = nullptr;
  c["finish_reason"] = finish_reason;
  return c;
}

json chunk(const response_meta& meta, json delta_or_text, const json& finish_reason) {
  auto j = envelope(meta, true);
  j["choices"] = json::array({choice(meta, std::move(delta_or_text), finish_reason)});
  if (meta.include_usage)
    j["usage"] = nullptr;
  return j;
}

} // namespace

json usage_json(const generation_done& done) {
  return {{"prompt_tokens", done.prompt_tokens},
          {"completion_tokens", done.completion_tokens},
          {"total_tokens", int64_t{done.prompt_tokens} + done.completion_tokens}};
}

json completion_body(const response_meta& meta, const std::string& text,
                     const generation_done& done) {
  auto j = envelope(meta, false);
  json c = {{"index", 0}};
  if (meta.kind == api_kind::chat)
    c["message"] = {{"role", "assistant"}, {"content", text}, {"refusal", nullptr}};
  else
    c["text"] = text;
  c["logprobs"] = nullptr;
  c["finish_reason"] = done.finish_reason;
  j["choices"] = json::array({std::move(c)});
  j["usage"] = usage_json(done);
  return j;
}

json role_chunk(const response_meta& meta) {
  return chunk(meta, {{"role", "assistant"}, {"content", ""}}, nullptr);
}

json delta_chunk(const response_meta& meta, std::string_view text) {
  if (meta.kind == api_kind::chat)
    return chunk(meta, {{"content", text}}, nullptr);
  return chunk(meta, text, nullptr);
}

json finish_chunk(const response_meta& meta, const std::string& finish_reason) {
  if (meta.kind == api_kind::chat)
    return chunk(meta, json::object(), finish_reason);
  return chunk(meta, "", finish_reason);
}

json usage_chunk(const response_meta& meta, const generation_done& done) {
  auto j = envelope(meta, true);
  j["choices"] = json::array();
  j["usage"] = usage_json(done);
  return j;
}

std::string sse_event(const json& j) {
  std::string out = "data: ";
  out += dump_json(j);
  out += "\n\n";
  return out;
}

std::string http_chunk(std::string_view data) {
  if (data.empty())
    return {};
  return fmt::format("{:x}\r\n{}\r\n", data.size(), data);
}

json model_body(const std::string& model, int64_t created, int32_t max_model_len) {
  json m = {{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "metronome"}};
  if (max_model_len > 0)
    m["max_model_len"] = max_model_len;
  return m;
}

json models_body(const std::string& model, int64_t created, int32_t max_model_len) {
  return {{"object", "list"}, {"data", json::array({model_body(model, created, max_model_len)})}};
}

} // namespace metronome::net
