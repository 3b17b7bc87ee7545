#include "net/openai_response.hpp"

#include <cmath>

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

json choice(const response_meta& meta, json delta_or_text, const json& finish_reason,
            json logprobs) {
  json c = {{"index", 0}};
  if (meta.kind == api_kind::chat)
    c["delta"] = std::move(delta_or_text);
  else
    c["text"] = std::move(delta_or_text);
  c["logprobs"] = std::move(logprobs);
  c["finish_reason"] = finish_reason;
  return c;
}

json chunk(const response_meta& meta, json delta_or_text, const json& finish_reason,
           json logprobs = nullptr) {
  auto j = envelope(meta, true);
  j["choices"] =
    json::array({choice(meta, std::move(delta_or_text), finish_reason, std::move(logprobs))});
  if (meta.include_usage)
    j["usage"] = nullptr;
  return j;
}

double finite(float logprob) {
  return std::isfinite(logprob) ? double(logprob) : -9999.0;
}

json byte_list(const std::string& bytes) {
  json a = json::array();
  for (char c : bytes)
    a.push_back(int(static_cast<unsigned char>(c)));
  return a;
}

json chat_entry(const token_text_logprob& t) {
  return {{"token", t.text}, {"logprob", finite(t.logprob)}, {"bytes", byte_list(t.bytes)}};
}

int64_t code_points(const std::string& text) {
  int64_t n = 0;
  for (char c : text)
    n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

} // namespace

json logprobs_json(api_kind kind, const std::vector<position_logprobs>& positions,
                   logprobs_cursor& cursor) {
  if (kind == api_kind::chat) {
    json content = json::array();
    for (const auto& p : positions) {
      json e = chat_entry(p.sampled);
      json top = json::array();
      for (const auto& t : p.top)
        top.push_back(chat_entry(t));
      e["top_logprobs"] = std::move(top);
      content.push_back(std::move(e));
    }
    return {{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const auto& p : positions) {
    tokens.push_back(p.sampled.text);
    token_logprobs.push_back(finite(p.sampled.logprob));
    json alternatives = json::object();
    for (const auto& t : p.top)
      if (!alternatives.contains(t.text)) // two tokens of one text: the likelier
        alternatives[t.text] = finite(t.logprob);
    top.push_back(std::move(alternatives));
    offsets.push_back(cursor.text_offset);
    cursor.text_offset += code_points(p.sampled.text);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

json usage_json(const generation_done& done) {
  return {{"prompt_tokens", done.prompt_tokens},
          {"completion_tokens", done.completion_tokens},
          {"total_tokens", int64_t{done.prompt_tokens} + done.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", done.cached_tokens}}}};
}

json completion_body(const response_meta& meta, const std::string& text,
                     const generation_done& done, const std::vector<position_logprobs>& logprobs) {
  auto j = envelope(meta, false);
  json c = {{"index", 0}};
  if (meta.kind == api_kind::chat)
    c["message"] = {{"role", "assistant"}, {"content", text}, {"refusal", nullptr}};
  else
    c["text"] = text;
  logprobs_cursor cursor;
  c["logprobs"] = meta.logprobs ? logprobs_json(meta.kind, logprobs, cursor) : json(nullptr);
  c["finish_reason"] = std::string(to_string(done.finish_reason));
  j["choices"] = json::array({std::move(c)});
  j["usage"] = usage_json(done);
  return j;
}

json role_chunk(const response_meta& meta) {
  return chunk(meta, {{"role", "assistant"}, {"content", ""}}, nullptr);
}

json delta_chunk(const response_meta& meta, std::string_view text,
                 const std::vector<position_logprobs>& logprobs, logprobs_cursor* cursor) {
  json lp = nullptr;
  if (meta.logprobs) {
    logprobs_cursor local;
    lp = logprobs_json(meta.kind, logprobs, cursor ? *cursor : local);
  }
  if (meta.kind == api_kind::chat)
    return chunk(meta, {{"content", text}}, nullptr, std::move(lp));
  return chunk(meta, text, nullptr, std::move(lp));
}

json finish_chunk(const response_meta& meta, finish_kind finish_reason) {
  const json reason = std::string(to_string(finish_reason));
  if (meta.kind == api_kind::chat)
    return chunk(meta, json::object(), reason);
  return chunk(meta, "", reason);
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

json model_body(const std::string& model, int64_t created, int32_t max_model_len,
                const std::string& description) {
  json m = {{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "metronome"}};
  if (max_model_len > 0)
    m["max_model_len"] = max_model_len;
  if (!description.empty())
    m["description"] = description;
  return m;
}

json models_body(const std::string& model, int64_t created, int32_t max_model_len,
                 const std::string& description) {
  return {{"object", "list"},
          {"data", json::array({model_body(model, created, max_model_len, description)})}};
}

} // namespace metronome::net
