#include "model/fault_injection.hpp"

#include <stdexcept>

#include "model/device_error.hpp"
#include "model/model_runner.hpp"

namespace metronome {

namespace {

class faulty_runner final : public model_runner {
public:
  faulty_runner(std::unique_ptr<model_runner> inner, fault_injection faults)
    : inner_(std::move(inner)), faults_(faults) {
    // nop
  }

  step_output execute(const step_plan& plan) override {
    submit(plan);
    return collect();
  }

  void submit(const step_plan& plan) override {
    const int64_t n = ++submitted_;
    using kind = fault_injection::kind;
    if (held_ > 0 || (n == failing_step() && faults_.what == kind::hang)) {
      ++held_; // never ends, nor does anything queued behind it
      return;
    }
    if (n == failing_step() && faults_.what == kind::throw_error)
      throw std::runtime_error(describe(n, "threw"));
    if (n == failing_step() && faults_.what == kind::device_fault) {
      // The device fails the step itself; the inner runner reports it.
      if (!inner_->arm_device_fault())
        throw std::runtime_error(describe(n, "had no device to fault"));
      inner_->submit(plan);
      return;
    }
    inner_->submit(plan);
    if (n == failing_step())
      faulty_ = inner_->in_flight(); // the failing step's place in the inner queue
  }

  size_t in_flight() const override {
    return inner_->in_flight() + size_t(held_);
  }

  bool ready() override {
    // Held steps are queued behind every step the inner runner has.
    return inner_->in_flight() > 0 && inner_->ready();
  }

  step_output collect() override {
    if (inner_->in_flight() == 0) {
      if (held_ > 0)
        throw std::logic_error("fault injection: collect() of a step that never ends");
      return inner_->collect(); // throws: none in flight
    }
    auto out = inner_->collect();
    if (faulty_ > 0 && --faulty_ == 0) {
      const bool lost = faults_.what == fault_injection::kind::device_lost;
      throw device_error(describe(failing_step(), lost ? "lost the device" : "hit a device error"),
                         lost);
    }
    return out;
  }

  void set_step_listener(std::function<void()> on_step_done) override {
    inner_->set_step_listener(std::move(on_step_done));
  }

  bool device_stuck() override {
    return inner_->device_stuck(); // a held step never reached the device
  }

  const model_config& config() const override {
    return inner_->config();
  }

  int32_t num_pages() const override {
    return inner_->num_pages();
  }

  int32_t page_size() const override {
    return inner_->page_size();
  }

  std::string device() const override {
    return inner_->device();
  }

  std::vector<memory_plan_entry> memory_plan() const override {
    return inner_->memory_plan();
  }

private:
  int64_t failing_step() const {
    return faults_.after_steps + 1;
  }

  std::string describe(int64_t step, const char* what) const {
    return "injected fault: step " + std::to_string(step) + " of this executor " + what
           + " (engine.fault_injection " + faults_.to_string() + ")";
  }

  std::unique_ptr<model_runner> inner_;
  fault_injection faults_;
  int64_t submitted_ = 0;
  /// Steps held back by an injected hang (never submitted to inner_).
  int64_t held_ = 0;
  /// > 0: the failing step is the faulty_-th step in inner_'s queue.
  size_t faulty_ = 0;
};

} // namespace

std::unique_ptr<model_runner> with_faults(std::unique_ptr<model_runner> inner,
                                          fault_injection faults) {
  if (!faults || !inner)
    return inner;
  return std::make_unique<faulty_runner>(std::move(inner), faults);
}

} // namespace metronome
