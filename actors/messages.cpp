#include "actors/messages.hpp"

namespace metronome {

int http_status(request_errc code) {
  switch (code) {
    case request_errc::invalid_request:
    case request_errc::context_length:
      return 400;
    case request_errc::queue_full:
      return 429;
    case request_errc::engine_failure:
      return 500;
    case request_errc::timeout:
      return 504;
    case request_errc::unavailable:
      return 503;
  }
  return 500;
}

const char* error_type(request_errc code) {
  switch (code) {
    case request_errc::invalid_request:
    case request_errc::context_length:
      return "invalid_request_error";
    case request_errc::queue_full:
      return "rate_limit_error";
    case request_errc::timeout:
      return "timeout_error";
    case request_errc::unavailable:
      return "service_unavailable";
    case request_errc::engine_failure:
      return "server_error";
  }
  return "server_error";
}

std::string to_string(request_errc code) {
  switch (code) {
    case request_errc::invalid_request: return "invalid_request";
    case request_errc::context_length: return "context_length_exceeded";
    case request_errc::queue_full: return "queue_full";
    case request_errc::engine_failure: return "engine_failure";
    case request_errc::timeout: return "timeout";
    case request_errc::unavailable: return "unavailable";
  }
  return "unknown";
}

void register_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_types<caf::id_block::metronome>();
  cfg.add_error_category(caf::atom("request"),
                         [](uint8_t code, caf::atom_value, const caf::message&) {
                           return "request: " + to_string(static_cast<request_errc>(code));
                         });
  cfg.add_error_category(caf::atom("executor"),
                         [](uint8_t code, caf::atom_value, const caf::message& context) {
                           std::string out = code == uint8_t(executor_errc::device_lost)
                                               ? "device lost"
                                               : "executor error " + std::to_string(code);
                           if (context.match_elements<std::string>())
                             out += ": " + context.get_as<std::string>(0);
                           return out;
                         });
  cfg.add_error_category(caf::atom("worker"),
                         [](uint8_t, caf::atom_value, const caf::message& context) {
                           std::string out = "worker refused";
                           if (context.match_elements<std::string>())
                             out += ": " + context.get_as<std::string>(0);
                           return out;
                         });
  // The middleman's handshake compares these: a worker of another wire
  // version cannot even connect (its join would be refused anyway).
  cfg.set("middleman.app-identifiers",
          std::vector<std::string>{"metronome-wire-" + std::to_string(wire_version)});
}

} // namespace metronome
