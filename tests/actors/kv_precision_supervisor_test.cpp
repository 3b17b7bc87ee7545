// Tier 2: the fp8_e5m2 KV cache's overflow supervision under CAF's
// deterministic test coordinator (virtual time), with real fault injection:
// the engine supervisor's tree (scheduler, kv precision supervisor, and an
// executor running the real CPU runner at fp8_e5m2) serves a model made to
// overflow (test::overflowing_model), so the CPU engine's own counter fires.
// An overflowing request is re-materialised and ends with the output of a
// run in bf16 from the start; the overflow past the budget starts a
// cool-down in which new requests run bf16; the cool-down ends on the
// virtual clock; every page returns to the pool.

#include <gtest/gtest.h>

#include "actors/engine.hpp"
#include "actors/engine_metrics.hpp"
#include "actors/engine_supervisor.hpp"
#include "actors/kv_precision_supervisor.hpp"
#include "actors/scheduler_actor.hpp"
#include "model/model_weights.hpp"
#include "tests/actors/fake_runners.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;

/// What a greedy_request received.
struct greedy_request_state {
  std::vector<int32_t> tokens;
  /// Each token's log-probability under the model (sampling_params::
  /// logprobs): the tiny random model's greedy tokens barely depend on its
  /// KV, its distributions do, bit for bit.
  std::vector<float> logprobs;
  /// token_msg::kv_overflow of each token.
  std::vector<kv_fallback> fallbacks;
  std::vector<generation_error> errors;
  bool finished = false;
};

/// A request actor stand-in: admits `prompt` for `max_tokens` greedy tokens
/// (EOS ignored) and records what comes back.
caf::behavior greedy_request(caf::stateful_actor<greedy_request_state>* self,
                             scheduler_actor scheduler, uint64_t id, std::vector<int32_t> prompt,
                             int32_t max_tokens) {
  admit_msg m;
  m.seq_id = id;
  m.prompt = std::move(prompt);
  m.params.temperature = 0;
  m.params.max_tokens = max_tokens;
  m.params.ignore_eos = true;
  m.params.logprobs = 0;
  self->send(scheduler, std::move(m));
  return {
    [=](token_msg& t) {
      auto& st = self->state;
      for (auto tok : t.tokens) {
        st.tokens.push_back(tok);
        st.fallbacks.push_back(t.kv_overflow);
      }
      for (const auto& lps : t.logprobs)
        st.logprobs.push_back(lps.empty() ? 0.0f : lps.front().logprob);
      if (t.finish_reason != finish_kind::none)
        st.finished = true;
    },
    [=](generation_error& e) { self->state.errors.push_back(std::move(e)); },
  };
}

constexpr int32_t max_tokens = 6;

class kv_precision_supervisor_test : public test::deterministic_test<> {
protected:
  std::shared_ptr<const model_folder> model = model_folder::open(test::overflowing_model());
  engine_limits limits;
  std::shared_ptr<engine_metrics> metrics = std::make_shared<engine_metrics>("overflowing");
  scheduler_actor scheduler;
  kv_precision_supervisor_actor supervisor;
  engine_supervisor_actor tree;
  std::vector<caf::actor> spawned;

  kv_precision_supervisor_test() {
    limits.page_size = 16;
    limits.kv_cache_tokens = 32 * 16;
    limits.max_model_len = 256;
    limits.step_timeout = std::chrono::seconds(3600);
    scheduler_actor_config sc;
    sc.scheduler.limits = limits;
    sc.scheduler.cache_salt = 1;
    sc.policy = policy_kind::fcfs;
    scheduler = spawn_scheduler(sys, sc, status, metrics);
    kv_overflow_options o; // the defaults: 3 within 60 s, then 300 s of bf16
    supervisor = spawn_kv_precision_supervisor(sys, scheduler, o, metrics);
    engine_children kids;
    kids.scheduler = scheduler;
    kids.kv_precision_supervisor = supervisor;
    engine_supervision policy;
    policy.own_thread = false; // the executor runs on the test coordinator
    tree = spawn_engine_supervisor(
      sys, kids,
      [m = model, l = limits] { return make_cpu_runner(m, l, kv_cache_dtype_kind::fp8_e5m2); },
      policy, status);
    sched.run();
  }

  ~kv_precision_supervisor_test() override {
    for (auto& a : spawned)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(tree, caf::exit_reason::user_shutdown);
    sched.run();
  }

  /// Runs one request to its end; its state.
  greedy_request_state run(uint64_t id, std::vector<int32_t> prompt) {
    auto a = sys.spawn(greedy_request, scheduler, id, std::move(prompt), max_tokens);
    spawned.push_back(a);
    sched.run();
    return deref<greedy_request_state>(a);
  }

  /// Greedy tokens and their log-probabilities.
  struct continuation {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    bool operator==(const continuation&) const = default;
  };

  static continuation of(const greedy_request_state& r) {
    return {r.tokens, r.logprobs};
  }

  /// The greedy continuation of `prompt` by the CPU runner alone, at `dtype`.
  continuation alone(const std::vector<int32_t>& prompt, kv_cache_dtype_kind dtype) {
    auto runner = make_cpu_runner(model, limits, dtype);
    step_plan plan;
    sampling_params greedy;
    greedy.temperature = 0;
    greedy.logprobs = 0;
    plan.added.push_back({1, prompt, greedy, 0});
    plan.chunks.push_back({1, int32_t(prompt.size()), {0, 1}});
    continuation out;
    for (int i = 0; i < max_tokens; ++i) {
      const auto t = runner->execute(plan).tokens.at(0);
      out.tokens.push_back(t.token);
      out.logprobs.push_back(t.logprobs.at(0).logprob);
      plan = {};
      plan.chunks.push_back({1, 1, {}});
    }
    return out;
  }

  kv_precision_status stats() {
    kv_precision_status out;
    auto probe = sys.spawn([&](caf::event_based_actor* self) {
      self->request(supervisor, 1s, stats_atom::value)
        .then([&](const kv_precision_status& s) { out = s; });
    });
    sched.run();
    return out;
  }

  double metric(const std::string& line) {
    const auto text = metrics->render(*status);
    const auto at = text.find("\n" + line + " ");
    if (at == std::string::npos)
      return -1;
    return std::stod(text.substr(at + line.size() + 2));
  }

  static std::vector<int32_t> overflowing_prompt(int32_t first) {
    // The window's first row is an ordinary token; overflow_token comes
    // mid-window, in the prompt.
    return {first, test::overflow_token, 200, 300, 400};
  }
};

TEST_F(kv_precision_supervisor_test, an_overflowing_request_is_rematerialized_in_bf16) {
  const auto prompt = overflowing_prompt(100);
  const auto bf16 = alone(prompt, kv_cache_dtype_kind::bf16);
  const auto saturated = alone(prompt, kv_cache_dtype_kind::fp8_e5m2);
  ASSERT_NE(bf16.logprobs, saturated.logprobs) << "the injected fault must show in the output";

  auto r = run(1, prompt);
  EXPECT_TRUE(r.finished);
  EXPECT_TRUE(r.errors.empty());
  EXPECT_EQ(of(r), bf16) << "recomputed in bf16, nothing computed on saturated values kept";
  ASSERT_FALSE(r.fallbacks.empty());
  for (auto f : r.fallbacks)
    EXPECT_EQ(f, kv_fallback::rematerialized);

  auto s = stats();
  EXPECT_EQ(s.overflows, 1);
  EXPECT_EQ(s.rematerialized, 1);
  EXPECT_FALSE(s.cooling_down);
  ASSERT_EQ(s.events.size(), 1u);
  EXPECT_EQ(s.events[0].event, "rematerialized");
  EXPECT_EQ(s.events[0].seq_id, 1u);
  EXPECT_EQ(metric("metronome:kv_precision_events_total{event=\"rematerialized\"}"), 1);
  EXPECT_EQ(metric("metronome:kv_precision_mode{mode=\"fp8_e5m2\"}"), 1);
  EXPECT_GT(metric("metronome:kv_overflow_values_total"), 0)
    << "the saturated values are counted";
  EXPECT_EQ(status->kv_used_pages, 0) << "every page back in the pool";
  EXPECT_EQ(status->running, 0);
}

TEST_F(kv_precision_supervisor_test, a_request_that_does_not_overflow_stays_fp8_e5m2) {
  const std::vector<int32_t> prompt = {100, 200, 300, 400, 500};
  auto r = run(1, prompt);
  EXPECT_EQ(of(r), alone(prompt, kv_cache_dtype_kind::fp8_e5m2));
  for (auto f : r.fallbacks)
    EXPECT_EQ(f, kv_fallback::none);
  EXPECT_EQ(stats().overflows, 0);
}

TEST_F(kv_precision_supervisor_test, the_fourth_overflow_in_a_minute_starts_a_cooldown) {
  // Three overflows within the window: each re-materialised.
  for (uint64_t id = 1; id <= 3; ++id) {
    const auto prompt = overflowing_prompt(int32_t(100 + id));
    auto r = run(id, prompt);
    EXPECT_EQ(of(r), alone(prompt, kv_cache_dtype_kind::bf16)) << id;
    EXPECT_EQ(r.fallbacks.back(), kv_fallback::rematerialized) << id;
    sched.advance_time(10s);
    sched.run();
  }
  // The fourth: kept with its saturated values, and a cool-down starts.
  const auto fourth = overflowing_prompt(104);
  auto r = run(4, fourth);
  EXPECT_EQ(of(r), alone(fourth, kv_cache_dtype_kind::fp8_e5m2));
  EXPECT_EQ(r.fallbacks.back(), kv_fallback::saturated);
  auto s = stats();
  EXPECT_EQ(s.rematerialized, 3);
  EXPECT_EQ(s.kept, 1);
  EXPECT_TRUE(s.cooling_down);
  ASSERT_GE(s.events.size(), 5u);
  EXPECT_EQ(s.events[4].event, "cooldown_started");
  EXPECT_EQ(metric("metronome:kv_precision_events_total{event=\"cooldown_started\"}"), 1);
  EXPECT_EQ(metric("metronome:kv_precision_mode{mode=\"bf16\"}"), 1);
  EXPECT_EQ(metric("metronome:kv_precision_mode{mode=\"fp8_e5m2\"}"), 0);

  // New requests run bf16: one with the overflowing token overflows no
  // more, and computes what bf16 computes.
  const auto fifth = overflowing_prompt(105);
  r = run(5, fifth);
  EXPECT_EQ(of(r), alone(fifth, kv_cache_dtype_kind::bf16));
  EXPECT_EQ(r.fallbacks.front(), kv_fallback::cooldown);
  EXPECT_EQ(stats().overflows, 4) << "bf16 overflows nothing";

  // 300 s after it started (virtual time), the cool-down ends: fp8_e5m2
  // again.
  sched.advance_time(299s);
  sched.run();
  EXPECT_TRUE(stats().cooling_down);
  sched.advance_time(1s);
  sched.run();
  s = stats();
  EXPECT_FALSE(s.cooling_down);
  EXPECT_EQ(s.events.back().event, "cooldown_ended");
  EXPECT_EQ(metric("metronome:kv_precision_events_total{event=\"cooldown_ended\"}"), 1);
  EXPECT_EQ(metric("metronome:kv_precision_mode{mode=\"fp8_e5m2\"}"), 1);
  const std::vector<int32_t> plain = {100, 200, 300, 400, 500};
  r = run(6, plain);
  EXPECT_EQ(of(r), alone(plain, kv_cache_dtype_kind::fp8_e5m2));
  EXPECT_EQ(r.fallbacks.front(), kv_fallback::none);
  // The window has passed too: an overflow is re-materialised again.
  const auto seventh = overflowing_prompt(107);
  r = run(7, seventh);
  EXPECT_EQ(of(r), alone(seventh, kv_cache_dtype_kind::bf16));
  EXPECT_EQ(r.fallbacks.back(), kv_fallback::rematerialized);
  EXPECT_EQ(status->kv_used_pages, 0) << "every page back in the pool";
}

TEST_F(kv_precision_supervisor_test, without_its_supervisor_the_scheduler_releases_parked_work) {
  // The supervisor dies (a failure in the tree: logged and forgotten):
  // overflows are only counted, nothing stays parked.
  caf::anon_send_exit(supervisor, caf::exit_reason::unhandled_exception);
  sched.run();
  const auto prompt = overflowing_prompt(100);
  auto r = run(1, prompt);
  EXPECT_TRUE(r.finished);
  EXPECT_EQ(of(r), alone(prompt, kv_cache_dtype_kind::fp8_e5m2));
  EXPECT_EQ(status->kv_used_pages, 0);
  EXPECT_FALSE(status->degraded);
}

} // namespace
} // namespace metronome
