#pragma once
// The interface every device's engine offers to its executor actor, and the
// per-sequence bookkeeping the runners share.

#include <deque>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/dtype.hpp"
#include "model/engine_limits.hpp"
#include "model/model_config.hpp"
#include "model/step_plan.hpp"

namespace metronome {

struct model_folder;

/// Raised for a plan that contradicts the runner's state (unknown sequence,
/// more tokens than it has, a page table too short). A runner that throws it
/// has changed nothing.
class plan_error : public std::logic_error {
public:
  using std::logic_error::logic_error;
};

/// One line of a runner's device-memory plan: what holds the bytes.
struct memory_plan_entry {
  std::string name; // "weights", "activations", "graphs", "kv_pool", ...
  int64_t bytes = 0;
};

/// Executes step plans on one device. Called from one thread only, the
/// executor's; implementations may use more threads inside. Steps go either
/// through execute() or through submit() and collect(); execute() while
/// submitted steps are uncollected throws std::logic_error (CUDA runner).
/// A caller of submit() learns that a step has ended without asking: see
/// set_step_listener().
class model_runner {
public:
  virtual ~model_runner() = default;

  /// Runs one step: releases, admits, computes every chunk, samples where a
  /// chunk completes its sequence's known tokens. Waits for the step.
  virtual step_output execute(const step_plan& plan) = 0;

  /// Starts one step and returns without waiting for it where the device
  /// allows (the CUDA runner); the step's output comes from collect(), in
  /// submission order. While step n runs, submitting step n + 1 does its
  /// host work (checks, packing, launch) during n's device time, and a
  /// decode chunk of one token reads the token n samples on the device, so
  /// consecutive steps run back to back. At most two steps are in flight: a
  /// third submit first waits for the oldest. A step that needs the host to
  /// know n's tokens (penalties) waits for n first. Throws plan_error as
  /// execute() does: the plan changed nothing (steps it waited for before
  /// the check still come out of collect()). The default runs the step at
  /// once.
  virtual void submit(const step_plan& plan) {
    done_.push_back(execute(plan));
  }

  /// Steps submitted and not yet collected.
  virtual size_t in_flight() const {
    return done_.size();
  }

  /// True when collect() would not wait: the oldest submitted step has
  /// finished, or is past the step timeout (collect() then throws at once).
  /// False when none is in flight.
  virtual bool ready() {
    return !done_.empty();
  }

  /// Waits (bounded by the runner's step timeout) for the oldest submitted
  /// step and returns its output, at once when ready(). Throws
  /// std::logic_error when none is in flight.
  virtual step_output collect() {
    if (done_.empty())
      throw std::logic_error("model_runner::collect: no step in flight");
    step_output out = std::move(done_.front());
    done_.pop_front();
    return out;
  }

  /// Asks for `on_step_done` to be called when submitted steps end on the
  /// device, so that the caller waits for them without polling ready().
  /// Called on the executor's thread, as every other member, before the
  /// first submit(); an empty function stops the calls.
  ///
  /// For each submitted step that has not ended when submit() returns, the
  /// runner calls `on_step_done` at least once after the step has ended, from
  /// a thread of its own: never the caller's, never from inside one of the
  /// runner's members. Steps end in submission order, so ready() is then
  /// true until the steps ended so far are collected. A call may find
  /// nothing new (collect() or a submit() that had to wait for the step has
  /// collected or finished it meanwhile): the caller checks ready() and
  /// ignores the call otherwise. A step that ends within submit() (the
  /// default submit(), the CPU runner) is ready() when submit() returns, and
  /// a step with no device work is ready once the steps before it are:
  /// neither gets a call of its own. No call begins once the runner's
  /// destructor has begun. `on_step_done` must be quick and thread-safe (the
  /// executor's sends it a message). The default ignores the listener: its
  /// submit() ends every step.
  virtual void set_step_listener(std::function<void()> on_step_done) {
    (void)on_step_done;
  }

  /// True when a submitted step has not ended on the device and no new
  /// runner of this process could use the device while it runs (a CUDA
  /// kernel that never ends holds its context until the process exits).
  /// The executor asks when the scheduler gives up on a step (its step
  /// timeout): true has the process exit instead of restarting a runner.
  /// The default (the CPU runner, whose steps end within submit()): false.
  virtual bool device_stuck() {
    return false;
  }

  /// Tests and drills only (engine.fault_injection device_fault_after:N):
  /// the next step submitted is preceded on the device by a kernel that
  /// reads an unmapped address, so the device itself fails the step with a
  /// sticky error. Executor thread, between steps. False where the runner
  /// has no device to fault (the default, the CPU runner).
  virtual bool arm_device_fault() {
    return false;
  }

  /// The model's configuration.
  virtual const model_config& config() const = 0;

  /// KV pages this runner's memory holds, and tokens per page.
  virtual int32_t num_pages() const = 0;
  virtual int32_t page_size() const = 0;

  /// "cpu", "cuda:0", ...
  virtual std::string device() const = 0;

  /// Device memory by use (weights, activations, graphs, KV pool), as planned
  /// at start-up; empty for runners without such a plan. Any thread.
  virtual std::vector<memory_plan_entry> memory_plan() const {
    return {};
  }

private:
  std::deque<step_output> done_; // the default submit()'s outputs
};

/// A sequence as a runner tracks it.
struct runner_sequence {
  std::vector<int32_t> tokens; // prompt, then sampled tokens
  int32_t prompt_len = 0;
  int32_t num_computed = 0; // tokens whose KV is cached
  std::vector<int32_t> pages;
  std::unique_ptr<sequence_sampler> sampler;
  /// How its keys and values are written (new_sequence::precision).
  kv_precision precision = kv_precision::configured;
};

/// The sequences of a runner, with the plan checks both runners need.
class sequence_table {
public:
  /// Applies releases and admissions and validates the chunks against the
  /// table; throws plan_error (before changing anything) when they disagree.
  void apply(const step_plan& plan, int32_t page_size, int32_t num_pages);

  runner_sequence& at(uint64_t id);

  size_t size() const {
    return seqs_.size();
  }

private:
  std::unordered_map<uint64_t, runner_sequence> seqs_;
};

/// KV pages of a CPU runner under `limits`: limits.kv_cache_tokens, or with
/// 0 room for max_batch_size sequences of max_model_len (0: the model's
/// max_position_embeddings) at most 1 GiB of fp32 keys and values; rounded
/// up to whole pages of limits.page_size. Any thread.
int32_t cpu_kv_pages(const model_config& config, const engine_limits& limits);

/// A runner for the CPU reference engine with cpu_kv_pages(model->config,
/// limits) pages of limits.page_size tokens (the other limits are the
/// scheduler's to keep), rounding what it writes as `kv_dtype` would store
/// it (cpu_engine::set_kv_dtype; fp8_e5m2 is the format's reference, the
/// cache stays fp32) for sequences of kv_precision::configured, and
/// reporting what overflowed in step_output::kv_overflows. Call it on the
/// thread that will run its steps.
std::unique_ptr<model_runner> make_cpu_runner(std::shared_ptr<const model_folder> model,
                                              const engine_limits& limits,
                                              kv_cache_dtype_kind kv_dtype
                                              = kv_cache_dtype_kind::bf16);

} // namespace metronome
