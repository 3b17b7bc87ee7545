#pragma once
// What the deterministic actor tests share: the CAF configuration that puts
// an actor system on CAF's test coordinator (no threads, virtual time), a
// fixture holding that system and an engine_status, the base of their fake
// model runners, and a stand-in request actor that admits one request to a
// scheduler and records what comes back.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "caf/all.hpp"

#include "actors/engine.hpp"
#include "actors/messages.hpp"
#include "actors/scheduler_actor.hpp"
#include "model/model_runner.hpp"

namespace metronome::test {

/// An actor system on CAF's deterministic test coordinator.
struct deterministic_config : caf::actor_system_config {
  deterministic_config() {
    register_message_types(*this);
    set("scheduler.policy", caf::atom("testing"));
  }
};

/// A fixture with an actor system on the test coordinator (`sched` runs its
/// messages and advances its clock) and an engine_status for the actors
/// under test to publish to. Actors still alive at the end are not waited
/// for.
template <class Config = deterministic_config>
class deterministic_test : public ::testing::Test {
protected:
  Config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched
    = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  std::shared_ptr<engine_status> status = std::make_shared<engine_status>();

  deterministic_test() {
    sys.await_actors_before_shutdown(false);
  }

  /// A scheduler actor (no metrics) for a context of 1024 tokens whose
  /// steps time out after 1 s, started.
  scheduler_actor spawn_test_scheduler() {
    scheduler_actor_config sc;
    sc.scheduler.limits.max_model_len = 1024;
    sc.scheduler.limits.step_timeout = std::chrono::seconds(1);
    auto s = spawn_scheduler(sys, sc, status, nullptr);
    sched.run();
    return s;
  }

  /// The state of a stateful actor `a` spawned by the test.
  template <class State>
  State& deref(const caf::actor& a) {
    auto* ptr = caf::actor_cast<caf::abstract_actor*>(a);
    return dynamic_cast<caf::stateful_actor<State>&>(*ptr).state;
  }
};

/// The base of the tests' fake runners: a model of 100 tokens, a KV pool of
/// `num_pages` pages of `page_size` tokens, on a device named `device`.
class fake_runner : public model_runner {
public:
  fake_runner(int32_t num_pages, int32_t page_size, std::string device)
    : num_pages_(num_pages), page_size_(page_size), device_(std::move(device)) {
    config_.vocab_size = 100;
  }

  const model_config& config() const override {
    return config_;
  }
  int32_t num_pages() const override {
    return num_pages_;
  }
  int32_t page_size() const override {
    return page_size_;
  }
  std::string device() const override {
    return device_;
  }

private:
  model_config config_;
  int32_t num_pages_;
  int32_t page_size_;
  std::string device_;
};

/// A fake runner of 64 pages of 16 tokens that keeps the real sequence
/// table (so bad plans fail as the real runners' do) and samples token 9
/// wherever a chunk completes its sequence's known tokens. Each step ends
/// within submit(), as the CPU runner's.
class table_runner : public fake_runner {
public:
  table_runner() : fake_runner(64, 16, "table") {
    // nop
  }

  step_output execute(const step_plan& plan) override {
    table_.apply(plan, page_size(), num_pages());
    step_output out;
    out.step = plan.step;
    out.num_seqs = int32_t(plan.chunks.size());
    for (const auto& c : plan.chunks) {
      auto& s = table_.at(c.id);
      s.num_computed += c.num_tokens;
      out.num_tokens += c.num_tokens;
      if (s.num_computed < int32_t(s.tokens.size()))
        continue;
      s.tokens.push_back(9);
      out.tokens.push_back({c.id, 9, 0.0f});
    }
    return out;
  }

private:
  sequence_table table_;
};

/// What a fake_request received.
struct fake_request_state {
  std::vector<token_msg> tokens;
  std::vector<generation_error> errors;
  /// A token_msg with a finish reason came.
  bool finished = false;
};

/// A request actor stand-in: admits one request of `prompt_len` tokens
/// asking for `max_tokens` (EOS ignored) to `scheduler` (a scheduler, or
/// anything that takes admit_msg), records what comes back.
template <class Scheduler>
caf::behavior fake_request(caf::stateful_actor<fake_request_state>* self, Scheduler scheduler,
                           uint64_t id, int32_t prompt_len, int32_t max_tokens) {
  admit_msg m;
  m.seq_id = id;
  m.prompt.assign(size_t(prompt_len), 5);
  m.params.max_tokens = max_tokens;
  m.params.ignore_eos = true;
  self->send(scheduler, std::move(m));
  return {
    [=](token_msg& t) {
      if (t.finish_reason != finish_kind::none)
        self->state.finished = true;
      self->state.tokens.push_back(std::move(t));
    },
    [=](generation_error& e) { self->state.errors.push_back(std::move(e)); },
  };
}

} // namespace metronome::test
