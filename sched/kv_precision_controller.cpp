#include "sched/kv_precision_controller.hpp"

namespace metronome {

kv_precision_controller::kv_precision_controller(kv_overflow_options options)
  : options_(options) {
  // nop
}

void kv_precision_controller::prune(sched_time now) {
  // A re-materialisation made `window` ago or earlier no longer counts.
  while (!rematerializations_.empty() && now - rematerializations_.front() >= options_.window)
    rematerializations_.pop_front();
}

int32_t kv_precision_controller::in_window(sched_time now) {
  prune(now);
  return int32_t(rematerializations_.size());
}

kv_overflow_decision kv_precision_controller::on_overflow(uint64_t seq, sched_time now) {
  (void)seq; // the decision depends on the budget only; the id is for the caller's log
  kv_overflow_decision d;
  d.cooldown_ended = on_tick(now); // a cool-down past its end ends first
  prune(now);
  if (cooldown_until_) {
    // Admitted before the cool-down: kept, and the cool-down stays as it is.
    d.action = kv_overflow_action::keep;
    d.cooldown_until = cooldown_until_;
    d.in_window = int32_t(rematerializations_.size());
    return d;
  }
  if (int32_t(rematerializations_.size()) < options_.max_rematerializations) {
    rematerializations_.push_back(now);
    d.action = kv_overflow_action::rematerialize;
    d.in_window = int32_t(rematerializations_.size());
    return d;
  }
  d.action = kv_overflow_action::keep;
  d.cooldown_started = true;
  cooldown_until_ = now + options_.cooldown;
  d.cooldown_until = cooldown_until_;
  d.in_window = int32_t(rematerializations_.size());
  return d;
}

bool kv_precision_controller::on_tick(sched_time now) {
  if (!cooldown_until_ || now < *cooldown_until_)
    return false;
  cooldown_until_.reset();
  return true;
}

} // namespace metronome
