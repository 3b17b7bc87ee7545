// The live server's drift supervision end to end: an engine with the tiny
// Llama-3 model on the CPU runs ladb; requests first stop after a few
// tokens, then (same prompt, same max_tokens, so the predictor cannot tell)
// run ten times longer. The drift supervisor must switch the scheduler to
// fcfs (recalibrating the predictor), count it in /metrics, and switch back
// to ladb after the cool-down. Windows are short (config), so it takes
// seconds.

#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "actors/engine.hpp"
#include "actors/engine_metrics.hpp"
#include "model/model_runner.hpp"
#include "model/model_weights.hpp"
#include "tests/actors/actor_test_config.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;

using test::chat_model;
using test_config = test::actor_test_config;

const std::vector<int32_t> prompt = {9906, 1917, 11, 420, 374, 264, 1296, 13};

generate_request request(std::vector<int32_t> stop_ids) {
  generate_request r;
  r.request_id = "drift";
  r.prompt_ids = prompt;
  r.params.temperature = 0;
  r.params.max_tokens = 40;
  r.params.ignore_eos = true;
  r.params.stop_token_ids = std::move(stop_ids);
  return r;
}

class live_drift_test : public ::testing::Test {
protected:
  test_config cfg;
  caf::actor_system sys{cfg};
  std::optional<engine> eng;

  ~live_drift_test() override {
    if (eng)
      eng->shutdown();
  }

  /// Runs one request to its end; returns the generated ids.
  std::vector<int32_t> run(generate_request req) {
    caf::scoped_actor self{sys};
    self->send(eng->frontend, std::move(req));
    std::vector<int32_t> ids;
    for (bool done = false; !done;)
      self->receive([&](text_delta& d) { ids.insert(ids.end(), d.token_ids.begin(), d.token_ids.end()); },
                    [&](generation_done&) { done = true; },
                    [&](generation_error& e) {
                      ADD_FAILURE() << e.message;
                      done = true;
                    },
                    caf::after(30s) >> [&] {
                      ADD_FAILURE() << "no answer within 30 s";
                      done = true;
                    });
    return ids;
  }

  drift_status drift() {
    caf::scoped_actor self{sys};
    drift_status out;
    self->request(eng->drift_supervisor, 5s, stats_atom::value)
      .receive([&](drift_status& s) { out = s; }, [&](caf::error& e) { ADD_FAILURE() << sys.render(e); });
    return out;
  }

  std::string policy() {
    caf::scoped_actor self{sys};
    std::string out;
    self->request(eng->scheduler, 5s, stats_atom::value)
      .receive([&](scheduler_stats& s) { out = s.policy; },
               [&](caf::error& e) { ADD_FAILURE() << sys.render(e); });
    return out;
  }
};

TEST_F(live_drift_test, a_jump_in_lengths_disables_ladb_and_the_cool_down_restores_it) {
  engine_options o;
  o.model_dir = chat_model();
  o.policy = policy_kind::ladb;
  o.limits.max_batch_size = 8;
  o.predictor.warmup_steps = 5;
  o.predictor.update_interval = 10ms;
  o.drift.window = 3s;
  o.drift.sustain = 300ms;
  o.drift.disable_for = 1500ms;
  o.drift.min_samples = 5;
  eng = spawn_engine(sys, o);
  ASSERT_TRUE(eng->drift_supervisor);
  EXPECT_EQ(policy(), "ladb");

  // The greedy continuation (from the runner alone, so the predictor sees
  // only the two phases), to stop phase-1 requests after a few tokens.
  const std::vector<int32_t> full = test::greedy_alone(prompt, 40, {0, 1, 2, 3});
  size_t k = 3;
  while (std::find(full.begin(), full.begin() + long(k), full[k]) != full.begin() + long(k))
    ++k; // the first position whose token did not occur before
  const std::vector<int32_t> stop_early = {full[k]};
  for (int i = 0; i < 12; ++i) {
    const auto ids = run(request(stop_early));
    ASSERT_LE(ids.size(), k + 1) << "phase 1 stops at the " << k + 1 << "th token";
    ASSERT_GE(ids.size(), k);
  }
  EXPECT_TRUE(drift().events.empty()) << "predictions match: no drift";

  // Phase 2: the same requests now run 40 steps. Four clients keep the engine busy.
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c)
    clients.emplace_back([&] {
      while (!stop)
        run(request({}));
    });
  auto deadline = std::chrono::steady_clock::now() + 60s;
  bool saw_fcfs = false;
  drift_status st;
  while (std::chrono::steady_clock::now() < deadline) {
    st = drift();
    if (!st.events.empty() && st.events.back().action == "disable" && policy() == "fcfs")
      saw_fcfs = true;
    if (st.events.size() >= 2)
      break;
    std::this_thread::sleep_for(50ms);
  }
  stop = true;
  for (auto& t : clients)
    t.join();
  ASSERT_GE(st.events.size(), 2u) << "no disable and re-enable within 60 s";
  EXPECT_EQ(st.events[0].action, "disable");
  EXPECT_EQ(st.events[0].policy, "fcfs");
  EXPECT_EQ(st.events[0].cause, "drift");
  EXPECT_GT(st.events[0].error, st.events[0].limit);
  EXPECT_EQ(st.events[1].action, "enable");
  EXPECT_EQ(st.events[1].policy, "ladb");
  const double cool_down = double(st.events[1].at_ns - st.events[0].at_ns) / 1e9;
  EXPECT_GE(cool_down, 1.5);
  EXPECT_LT(cool_down, 1.5 + 2.0) << "re-enabled within a tick or two of the cool-down";
  EXPECT_TRUE(saw_fcfs) << "the scheduler ran fcfs while disabled";
  const auto metrics = render_metrics(*eng);
  EXPECT_NE(metrics.find("metronome:policy_switches_total{policy=\"fcfs\",cause=\"drift\"} 1"),
            std::string::npos)
    << metrics;
  EXPECT_NE(metrics.find("metronome:policy_switches_total{policy=\"ladb\",cause=\"recovered\"}"),
            std::string::npos);
}

} // namespace
} // namespace metronome
