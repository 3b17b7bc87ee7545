#include "net/access_record.hpp"

#include <nlohmann/json.hpp>

#include "metrics/log_event.hpp"

namespace metronome::net {

namespace {

double ms(access_record::clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

} // namespace

access_record::access_record(std::string_view method, std::string_view target,
                             std::string client, clock::time_point arrival)
  : method_(method),
    route_(target.substr(0, target.find('?'))),
    client_(std::move(client)),
    arrival_(arrival) {}

access_record::~access_record() {
  if (!written_) {
    on_client_gone();
    write();
  }
}

void access_record::set_ws_id(std::string_view id) {
  ws_id_ = std::string(id);
}

void access_record::set_prompt(std::string text) {
  prompt_ = std::move(text);
  generation_ = true;
}

void access_record::on_status(int status) {
  if (status_ == 0)
    status_ = status;
}

void access_record::on_delta(const text_delta& d, clock::time_point now) {
  generation_ = true;
  if (!first_token_ && (d.completion_tokens > 0 || !d.text.empty()))
    first_token_ = now;
  if (d.prompt_tokens > 0)
    prompt_tokens_ = d.prompt_tokens;
  output_tokens_ = std::max(output_tokens_, d.completion_tokens);
  if (keep_output_ && output_.size() < max_text_bytes)
    output_ += d.text;
}

void access_record::on_done(const generation_done& d) {
  generation_ = true;
  prompt_tokens_ = d.prompt_tokens;
  output_tokens_ = d.completion_tokens;
  cached_tokens_ = d.cached_tokens;
  finish_reason_ = to_string(d.finish_reason);
}

void access_record::on_error(const api_error& e) {
  on_status(e.status);
  error_code_ = e.code.empty() ? e.type : e.code;
}

void access_record::on_error_body(std::string_view body) {
  if (!error_code_.empty())
    return;
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object()
      && j["error"].value("code", nlohmann::json()).is_string())
    error_code_ = j["error"]["code"].get<std::string>();
}

void access_record::on_client_gone() {
  on_status(499);
  if (generation_ && finish_reason_.empty() && error_code_.empty())
    finish_reason_ = to_string(finish_kind::cancelled);
}

void access_record::write(clock::time_point now) {
  if (written_)
    return;
  written_ = true;
  log_event line("access");
  line.add("method", method_).add("route", route_).add("status", int64_t(status_));
  line.add("client", client_);
  if (!client_request_id_.empty()) {
    line.add("request_id", client_request_id_);
    if (!request_id_.empty())
      line.add("response_id", request_id_);
  } else if (!request_id_.empty()) {
    line.add("request_id", request_id_);
  }
  if (ws_id_)
    line.add("ws_id", *ws_id_);
  if (generation_) {
    line.add("prompt_tokens", prompt_tokens_).add("output_tokens", output_tokens_);
    if (cached_tokens_ > 0)
      line.add("cached_tokens", cached_tokens_);
    if (first_token_)
      line.add("ttft_ms", ms(*first_token_ - arrival_), 1);
    else
      line.add_null("ttft_ms");
  }
  line.add("e2e_ms", ms(now - arrival_), 1);
  if (!error_code_.empty())
    line.add("error", error_code_);
  else if (!finish_reason_.empty())
    line.add("finish_reason", finish_reason_);
  if (prompt_)
    line.add("prompt", *prompt_, max_text_bytes);
  if (keep_output_)
    line.add("output", output_, max_text_bytes);
  // Probes and scrapes come several times a minute; /health's changes of
  // state are logged where they happen (ready, degraded, draining).
  const bool probe = route_ == "/health" || (route_ == "/metrics" && status_ < 400);
  line.write(probe ? spdlog::level::debug : spdlog::level::info);
  if (observer_)
    observer_(route_, status_);
}

std::string prompt_text(const generate_request& req) {
  if (req.chat) {
    auto turns = nlohmann::json::array();
    for (const auto& t : req.messages)
      turns.push_back({{"role", t.role}, {"content", t.content}});
    return turns.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  if (!req.prompt_ids.empty())
    return nlohmann::json(req.prompt_ids).dump();
  return req.prompt;
}

} // namespace metronome::net
