#pragma once
// Executor fault injection, for tests and drills only: a runner wrapper
// that makes one step of every runner it wraps fail in a chosen way, so the
// executor's supervision can be proven end to end (docs/reliability.md,
// "Executor faults"). Set by the test-only key engine.fault_injection;
// `none`, the default, wraps nothing.
//
// Spelling: none | throw_after:N | hang_after:N | device_error_after:N |
// device_lost_after:N | device_fault_after:N. Each runner (each executor
// start) runs N steps as usual; its step N + 1
//   throw_after         throws from submit(), as a host-side bug would;
//   hang_after          never ends (nor do the steps queued behind it):
//                       the scheduler's step timeout has the executor
//                       replaced, as for a kernel that never returns;
//   device_error_after  runs, and its collect() throws a device_error, as
//                       an asynchronous device fault surfaces;
//   device_lost_after   the same, with context_lost(): the process must
//                       exit for the device to work again;
//   device_fault_after  is preceded on the device by a kernel that reads an
//                       unmapped address (CUDA runners only: a real sticky
//                       error, classified by the runner's own error path,
//                       where device_lost_after only says it is lost).
// Parsing is header-only so that the configuration can check the value
// without linking the model library.

#include <charconv>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace metronome {

class model_runner;

/// Which step of each runner fails, and how.
struct fault_injection {
  enum class kind : uint8_t { none, throw_error, hang, device_error, device_lost, device_fault };

  kind what = kind::none;
  /// Steps each runner runs as usual before the failing one.
  int64_t after_steps = 0;

  explicit operator bool() const {
    return what != kind::none;
  }

  /// The spelling of the kind in the configuration ("throw", "hang", ...).
  static std::string_view name(kind k) {
    switch (k) {
      case kind::throw_error: return "throw";
      case kind::hang: return "hang";
      case kind::device_error: return "device_error";
      case kind::device_lost: return "device_lost";
      case kind::device_fault: return "device_fault";
      case kind::none: break;
    }
    return "none";
  }

  /// Reads "none" or "<kind>_after:<N>" (N in [0, 10^12]); nullopt otherwise.
  static std::optional<fault_injection> parse(std::string_view text) {
    if (text == "none" || text.empty())
      return fault_injection{};
    const auto colon = text.find(':');
    if (colon == std::string_view::npos)
      return std::nullopt;
    const auto head = text.substr(0, colon), count = text.substr(colon + 1);
    constexpr std::string_view suffix = "_after";
    if (!head.ends_with(suffix))
      return std::nullopt;
    const auto kind_name = head.substr(0, head.size() - suffix.size());
    fault_injection f;
    for (auto k : {kind::throw_error, kind::hang, kind::device_error, kind::device_lost,
                   kind::device_fault})
      if (name(k) == kind_name)
        f.what = k;
    if (f.what == kind::none || count.empty())
      return std::nullopt;
    const auto* end = count.data() + count.size();
    auto [ptr, ec] = std::from_chars(count.data(), end, f.after_steps);
    if (ec != std::errc{} || ptr != end || f.after_steps < 0 || f.after_steps > 1'000'000'000'000)
      return std::nullopt;
    return f;
  }

  /// The configuration's spelling: parse(to_string()) gives this back.
  std::string to_string() const {
    if (what == kind::none)
      return "none";
    return std::string(name(what)) + "_after:" + std::to_string(after_steps);
  }
};

/// Wraps `inner` so that its step `faults.after_steps + 1` fails as
/// `faults` says; every other call goes to `inner`. `inner` itself when
/// `faults` is none.
std::unique_ptr<model_runner> with_faults(std::unique_ptr<model_runner> inner,
                                          fault_injection faults);

} // namespace metronome
