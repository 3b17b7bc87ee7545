#pragma once
// One model over N GPUs (--tensor-parallel N): N rank runners driven in
// step behind the model_runner interface.
//
// Design note. Each rank is a whole CUDA runner (gpu/cuda_runner.cpp) over
// its shard of the model (shard_model, model/tensor_parallel.hpp): its
// heads of attention with their KV cache, its slice of the MLP, the full
// embeddings, norms and LM head. Every rank gets every step plan, so the
// ranks keep identical sequence tables, slots and page tables without
// exchanging any of them; the only traffic is on the devices, the
// collectives the forward pass enqueues (two all-reduces a layer and the
// broadcast of rank 0's ids, gpu/collective.hpp). Rank 0 runs on the
// caller's thread (the executor's), each other rank on a thread of its own
// that owns its runner from construction to destruction, as a CUDA runner
// requires. submit() and collect() hand the call to every rank at once and
// return when all have done it; the output is rank 0's (the others' ids
// are the same by the broadcast, which collect() checks).
//
// A failure of one rank leaves the others unable to finish their
// collectives: it is rethrown to the caller, and the group refuses every
// later call, so the executor's supervisor restarts the whole group.

#include <memory>
#include <string>
#include <vector>

#include "gpu/cuda_runner.hpp"
#include "model/model_config.hpp"
#include "model/model_runner.hpp"

namespace metronome {

class rank_thread;

class tensor_parallel_runner final : public model_runner {
public:
  /// Starts options.tensor_parallel ranks (see cuda_runner_options) in
  /// parallel and returns once every one has captured its graphs. Called on
  /// the thread that will drive the runner. Throws model_error for a model
  /// that does not split (tensor_parallel_plan), std::invalid_argument for
  /// bad devices or options, std::runtime_error when a rank fails to start
  /// (the ranks started are torn down first).
  tensor_parallel_runner(std::shared_ptr<const model_folder> model,
                         const cuda_runner_options& options);
  ~tensor_parallel_runner() override;

  step_output execute(const step_plan& plan) override;
  void submit(const step_plan& plan) override;
  size_t in_flight() const override;
  bool ready() override;
  step_output collect() override;
  void set_step_listener(std::function<void()> on_step_done) override;
  bool device_stuck() override;
  bool arm_device_fault() override;

  /// The whole model's configuration (not a rank's share).
  const model_config& config() const override {
    return config_;
  }

  /// The fewest pages any rank holds (each rank's pool holds its kv heads
  /// of every page; the scheduler hands out page ids below this).
  int32_t num_pages() const override {
    return num_pages_;
  }

  int32_t page_size() const override;

  /// "cuda:0+cuda:1" (one entry per rank).
  std::string device() const override;

  /// Every rank's plan, each entry named "rankR_NAME" (rank0_weights, ...).
  std::vector<memory_plan_entry> memory_plan() const override;

  int32_t ranks() const {
    return int32_t(runners_.size());
  }

  /// Rank r's runner. Rank 0's may be used on the caller's thread between
  /// steps (tests read its logits); the others belong to their threads.
  model_runner& rank(int32_t r) {
    return *runners_.at(size_t(r));
  }

  /// Runs `f(runner)` for every rank on its own thread, all at once, and
  /// waits; the first exception is rethrown (the group is then broken).
  void for_each_rank(const std::function<void(model_runner&)>& f);

  /// "tensor parallel 2 (peer): 16 of 32 query heads, ..."
  std::string describe() const {
    return describe_;
  }

private:
  void check_usable() const;

  model_config config_;
  std::vector<std::unique_ptr<model_runner>> runners_;
  // [r] runs rank r's calls (index 0 unused: the caller's thread).
  std::vector<std::unique_ptr<rank_thread>> threads_;
  std::vector<int> devices_;
  int32_t num_pages_ = 0;
  std::string describe_;
  bool broken_ = false;
};

} // namespace metronome
