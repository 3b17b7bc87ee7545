#pragma once
// Failures a device reports, as the executor tells them apart: an error
// that ends one runner (a new runner may work) and one that leaves the
// device unusable for the rest of the process.

#include <stdexcept>
#include <string>

namespace metronome {

/// A device reported a failure: the runner that saw it is unusable. With
/// context_lost() no new runner on that device can work in this process
/// either (a sticky CUDA error such as an illegal address, or a kernel that
/// never ends): only a new process can use the device again.
class device_error : public std::runtime_error {
public:
  explicit device_error(const std::string& what, bool context_lost = false)
    : std::runtime_error(what), context_lost_(context_lost) {
    // nop
  }

  /// True when the process must exit for the device to work again.
  bool context_lost() const noexcept {
    return context_lost_;
  }

private:
  bool context_lost_;
};

} // namespace metronome
