#pragma once
// Why a request ended, as the scheduler, the actors and an embedding program
// hold it. Only the network edge turns it into text (to_string): OpenAI's
// finish_reason, the WebSocket protocol's, the access line's.

#include <cstdint>
#include <string_view>

namespace metronome {

enum class finish_kind : uint8_t {
  /// Not finished: the request still runs.
  none,
  /// An EOS or stop token, or a stop string.
  stop,
  /// max_tokens, or the longest sequence the engine allows.
  length,
  /// Its client went away or cancelled it.
  cancelled,
  /// It ran past its timeout (its client gets an error, not a finish).
  timeout,
  /// It failed: an error in its request actor, or an engine that cannot
  /// run it any more (its client gets an error, not a finish).
  failed,
};

/// The wire's spelling: "" for none, then "stop", "length", "cancelled",
/// "timeout", "failed".
constexpr std::string_view to_string(finish_kind x) {
  switch (x) {
    case finish_kind::none: return "";
    case finish_kind::stop: return "stop";
    case finish_kind::length: return "length";
    case finish_kind::cancelled: return "cancelled";
    case finish_kind::timeout: return "timeout";
    case finish_kind::failed: return "failed";
  }
  return "?";
}

} // namespace metronome
