#include "net/api_error.hpp"

#include <fmt/format.h>

namespace metronome::net {

namespace {

nlohmann::json null_if_empty(const std::string& s) {
  return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s);
}

} // namespace

nlohmann::json api_error::inner_json() const {
  return {{"message", message},
          {"type", type},
          {"param", null_if_empty(param)},
          {"code", null_if_empty(code)}};
}

nlohmann::json api_error::to_json() const {
  return {{"error", inner_json()}};
}

std::string api_error::body() const {
  return dump_json(to_json());
}

api_error api_error::bad_request(std::string message, std::string param, std::string code) {
  return {400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

api_error api_error::not_found(std::string message, std::string code) {
  return {404, std::move(message), "invalid_request_error", {}, std::move(code)};
}

api_error api_error::method_not_allowed(std::string_view method, std::string_view target) {
  return {405, fmt::format("method {} is not allowed on {}", method, target),
          "invalid_request_error", {}, "method_not_allowed"};
}

api_error api_error::payload_too_large(size_t limit) {
  return {413, fmt::format("request body is larger than the limit of {} bytes", limit),
          "invalid_request_error", {}, "request_too_large"};
}

api_error api_error::from(const generation_error& err) {
  api_error result;
  result.status = http_status(err.code);
  result.message = err.message.empty() ? to_string(err.code) : err.message;
  result.type = error_type(err.code);
  result.param = err.param;
  result.code = error_code_string(err.code);
  return result;
}

api_error api_error::shutting_down(std::string message) {
  return {503, std::move(message), "service_unavailable_error", {}, "shutting_down"};
}

api_error api_error::too_many_connections(size_t limit) {
  return {503,
          fmt::format("the server has {} connections open, its limit; try again later", limit),
          "service_unavailable_error", {}, "too_many_connections"};
}

bool api_error::retry_later() const {
  return status == 429 || (status == 503 && (code == "shutting_down" || code == "too_many_connections"));
}

std::string error_code_string(request_errc code) {
  switch (code) {
    case request_errc::invalid_request:
      return "invalid_value";
    case request_errc::context_length:
      return "context_length_exceeded";
    case request_errc::queue_full:
      return "queue_full";
    case request_errc::engine_failure:
      return "engine_failure";
    case request_errc::timeout:
      return "timeout";
    case request_errc::unavailable:
      return "unavailable";
  }
  return "engine_failure";
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

} // namespace metronome::net
