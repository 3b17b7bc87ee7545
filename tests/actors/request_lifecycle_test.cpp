// Tier 2: what a request leaves behind once it has ended, under CAF's
// deterministic test coordinator. The engine's real frontend, request actor
// and scheduler run with a scripted executor; the client side is either an
// actor of the test that outlives its requests (as an embedding program's
// actor does) or the network edge's real per-request sink.
//
// CAF 0.17 keeps a monitor as a record in the *monitored* actor, holding
// weak references to both sides, until the monitored actor dies or the
// monitor is removed. A per-request actor that ends without removing its
// monitors of long-lived actors (scheduler, frontend, a client that stays)
// leaves a record there for good, and the record's weak reference keeps the
// dead actor's storage (control block and actor object) allocated: the
// ~3 KB per request of issue 39. A delayed_send to the request actor (its
// deadline, 10 minutes by default) kept it allocated until it fired, too.
// So after every way a request can end, these tests ask the long-lived
// actors how many monitors the request's actors still hold on them, look
// for clock entries addressed to the dead request actor, and check that
// nothing but the test references the dead actors any more.
//
// (The scheduler's own clock entries are no concern here: CAF 0.17.6 never
// cancels a request's timeout when the answer arrives, so each step plan's
// timeout stays queued for the step timeout, holding the long-lived
// scheduler only.)

#include <optional>

#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <gtest/gtest.h>

#include "caf/default_attachable.hpp"

#include "actors/engine.hpp"
#include "actors/request_actor.hpp"
#include "actors/scheduler_actor.hpp"
#include "model/tokenizer/chat_template.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "net/request_sink.hpp"
#include "tests/actors/fake_runners.hpp"
#include "tests/actors/scripted_executor.hpp"
#include "tests/test_env.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;

/// How many monitors `observer` holds on `observed`. CAF 0.17 cannot list
/// an actor's attachables; detaching by observer (what demonitor does) is the
/// public way to find them, so counting also removes them: call it once per
/// pair, as the assertion.
template <class Handle>
size_t take_monitors(const Handle& observed, const caf::actor_addr& observer) {
  caf::default_attachable::observe_token tk{observer, caf::default_attachable::monitor};
  return caf::actor_cast<caf::abstract_actor*>(observed)->detach(tk);
}

/// Strong and weak references to the actor behind `addr`, not counting
/// `addr` itself. A dead actor nobody holds shows {0, 0}: its object was
/// destroyed and its storage is freed once `addr` goes.
std::pair<size_t, size_t> references(const caf::actor_addr& addr) {
  auto* ctrl = caf::actor_cast<caf::actor_control_block*>(addr);
  return {ctrl->strong_refs.load(), ctrl->weak_refs.load() - 1};
}

/// A client actor that outlives its requests: sends one generate_request
/// to the frontend (so it is the request's sink) and records what comes
/// back and who sent it (the request actor).
struct client_state {
  std::vector<text_delta> deltas;
  std::optional<generation_done> done;
  std::optional<generation_error> error;
  /// The request actor (weak: the test must not keep it alive).
  caf::actor_addr request_actor;
};

caf::behavior client(caf::stateful_actor<client_state>* self, frontend_actor frontend,
                     generate_request req) {
  self->send(frontend, std::move(req));
  auto note = [=] {
    if (self->current_sender())
      self->state.request_actor = self->current_sender()->address();
  };
  return {
    [=](text_delta& d) {
      note();
      self->state.deltas.push_back(std::move(d));
    },
    [=](generation_done& d) {
      note();
      self->state.done = std::move(d);
    },
    [=](generation_error& e) {
      note();
      self->state.error = std::move(e);
    },
  };
}

/// What the network edge's listener saw of one request.
struct recording_listener : net::sink_listener {
  int deltas = 0;
  std::optional<generation_done> done;
  std::optional<generation_error> error;
  void on_delta(uint64_t, text_delta&) override {
    ++deltas;
  }
  void on_done(uint64_t, generation_done& d) override {
    done = d;
  }
  void on_error(uint64_t, generation_error& e) override {
    error = e;
  }
  void close_now() override {}
};

/// Clock entries (timeouts, delayed messages) addressed to the actor `id`:
/// each holds a strong reference to it until it fires.
size_t timers_of(caf::scheduler::test_coordinator& sched, caf::actor_id id) {
  using clock = caf::detail::simple_actor_clock;
  size_t n = 0;
  for (const auto& entry : sched.clock().schedule()) {
    const auto* ev = entry.second.get();
    caf::strong_actor_ptr target;
    if (auto* x = dynamic_cast<const clock::request_timeout*>(ev))
      target = x->self;
    else if (auto* x = dynamic_cast<const clock::ordinary_timeout*>(ev))
      target = x->self;
    else if (auto* x = dynamic_cast<const clock::multi_timeout*>(ev))
      target = x->self;
    else if (auto* x = dynamic_cast<const clock::actor_msg*>(ev))
      target = x->receiver;
    if (target && target->id() == id)
      ++n;
  }
  return n;
}

class request_lifecycle_test : public test::deterministic_test<> {
protected:
  std::shared_ptr<const tokenizer> tokens;
  scheduler_actor scheduler;
  caf::actor executor = sys.spawn(test::scripted_executor);
  frontend_actor frontend;
  std::vector<caf::actor> spawned;
  /// A token whose text is " hello", what every step samples.
  int32_t hello = 0;
  size_t baseline_running = 0;

  request_lifecycle_test() {
    const auto dir = std::filesystem::path(test::env("TESTDATA")) / "tokenizers" / "llama3";
    tokens = tokenizer::load(dir);
    const auto ids = tokens->encode(" hello", {false, false});
    EXPECT_EQ(ids.size(), 1u);
    hello = ids.at(0);
    scheduler = spawn_test_scheduler();
    auto ctx = std::make_shared<request_context>();
    ctx->scheduler = scheduler;
    ctx->tokens = tokens;
    ctx->chat = std::make_shared<const chat_template>(chat_template::from_folder(dir));
    ctx->status = status;
    ctx->max_model_len = 1024;
    ctx->vocab_size = tokens->vocab_size();
    ctx->default_timeout = 10s;
    frontend = spawn_frontend(sys, ctx);
    sched.run();
    caf::anon_send(scheduler,
                   executor_up_msg{caf::actor_cast<executor_actor>(executor), 64, 16, "test", {}});
    sched.run();
    baseline_running = sys.registry().running();
  }

  ~request_lifecycle_test() override {
    for (auto& a : spawned)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(frontend, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(scheduler, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(executor, caf::exit_reason::user_shutdown);
    sched.run();
  }

  static generate_request completion(int32_t max_tokens) {
    generate_request r;
    r.request_id = "cmpl-1";
    r.prompt = "The quick brown fox";
    r.params.temperature = 0;
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    return r;
  }

  caf::actor start_client(generate_request req) {
    auto c = sys.spawn(client, frontend, std::move(req));
    spawned.push_back(c);
    sched.run();
    return c;
  }

  client_state& state_of(const caf::actor& c) {
    auto* ptr = caf::actor_cast<caf::abstract_actor*>(c);
    return dynamic_cast<caf::stateful_actor<client_state>&>(*ptr).state;
  }

  test::scripted_executor_state& exec() {
    auto* ptr = caf::actor_cast<caf::abstract_actor*>(executor);
    return dynamic_cast<caf::stateful_actor<test::scripted_executor_state>&>(*ptr).state;
  }

  size_t timers_of(caf::actor_id id) {
    return metronome::timers_of(sched, id);
  }

  /// Ends one engine step, every chunk sampling " hello".
  void step() {
    caf::anon_send(executor, tick_atom::value, hello);
    sched.run();
  }

  /// Answers every plan still queued at the executor (the scheduler keeps
  /// one ahead), so that no plan refers to a finished request any more.
  void drain() {
    for (int i = 0; i < 100 && !exec().pending.empty(); ++i)
      step();
    ASSERT_TRUE(exec().pending.empty());
  }

  /// The request actor behind `c` has ended and left nothing behind: no
  /// monitor on the scheduler, the frontend or the client, no reference to
  /// its storage but the test's.
  void expect_nothing_left(const caf::actor& c) {
    drain();
    // Taken out of the client, so that the test holds the only address.
    const auto r = std::exchange(state_of(c).request_actor, caf::actor_addr{});
    ASSERT_TRUE(r) << "the request actor never answered";
    EXPECT_EQ(take_monitors(scheduler, r), 0u) << "monitors left on the scheduler";
    EXPECT_EQ(take_monitors(c, r), 0u) << "monitors left on the client";
    EXPECT_EQ(take_monitors(frontend, r), 0u) << "monitors left on the frontend";
    EXPECT_EQ(references(r), std::make_pair(size_t{0}, size_t{0}))
      << "{strong, weak} references to the dead request actor";
    EXPECT_EQ(status->live_requests, 0);
    EXPECT_EQ(status->kv_used_pages, 0);
    EXPECT_EQ(sys.registry().running(), baseline_running + 1) << "only the client is left";
  }
};

// -- a client that outlives its requests ------------------------------------------

TEST_F(request_lifecycle_test, a_request_that_reaches_its_length_leaves_nothing_behind) {
  auto c = start_client(completion(3));
  for (int i = 0; i < 3; ++i)
    step();
  ASSERT_TRUE(state_of(c).done);
  EXPECT_EQ(state_of(c).done->finish_reason, finish_kind::length);
  EXPECT_EQ(state_of(c).done->completion_tokens, 3);
  expect_nothing_left(c);
}

TEST_F(request_lifecycle_test, a_request_ended_by_a_stop_string_leaves_nothing_behind) {
  auto req = completion(50);
  req.stop = {" hello"};
  auto c = start_client(std::move(req));
  step();
  ASSERT_TRUE(state_of(c).done);
  EXPECT_EQ(state_of(c).done->finish_reason, finish_kind::stop);
  expect_nothing_left(c);
}

TEST_F(request_lifecycle_test, an_invalid_request_leaves_nothing_behind) {
  auto req = completion(4);
  req.params.temperature = 7; // out of range: refused before admission
  auto c = start_client(std::move(req));
  ASSERT_TRUE(state_of(c).error);
  EXPECT_EQ(state_of(c).error->code, request_errc::invalid_request);
  EXPECT_TRUE(exec().seen.empty());
  expect_nothing_left(c);
}

TEST_F(request_lifecycle_test, a_request_refused_by_the_scheduler_leaves_nothing_behind) {
  // An engine that lost its executor for good refuses every admission. The
  // engine turns degraded (as its supervisor would decide it) after the
  // frontend let the request through, before the scheduler admits it.
  auto c = sys.spawn(client, frontend, completion(4));
  spawned.push_back(c);
  while (status->live_requests == 0 && sched.try_run_once()) {
    // until the frontend has spawned the request actor
  }
  ASSERT_EQ(status->live_requests, 1);
  status->set_degraded("gone");
  caf::anon_send(scheduler, executor_down_msg{"gone", true});
  sched.run();
  ASSERT_TRUE(state_of(c).error);
  EXPECT_EQ(state_of(c).error->code, request_errc::unavailable);
  expect_nothing_left(c);
}

TEST_F(request_lifecycle_test, a_request_failed_by_an_executor_crash_leaves_nothing_behind) {
  auto c = start_client(completion(50));
  step();
  caf::anon_send(scheduler, executor_down_msg{"boom", false});
  sched.run();
  ASSERT_TRUE(state_of(c).error);
  EXPECT_EQ(state_of(c).error->code, request_errc::engine_failure);
  expect_nothing_left(c);
}

TEST_F(request_lifecycle_test, a_request_that_times_out_leaves_nothing_behind) {
  auto req = completion(50);
  req.timeout = 100ms;
  auto c = start_client(std::move(req));
  step();
  EXPECT_EQ(timers_of(state_of(c).request_actor.id()), 1u) << "its deadline";
  sched.advance_time(99ms);
  sched.run();
  EXPECT_FALSE(state_of(c).error);
  sched.advance_time(2ms);
  sched.run();
  ASSERT_TRUE(state_of(c).error);
  EXPECT_EQ(state_of(c).error->code, request_errc::timeout);
  expect_nothing_left(c);
}

TEST_F(request_lifecycle_test, a_finished_request_leaves_no_timer_that_fires_later) {
  auto c = start_client(completion(1));
  const auto& r = state_of(c).request_actor; // set by the first delta
  EXPECT_FALSE(r);
  step();
  ASSERT_TRUE(state_of(c).done);
  ASSERT_TRUE(r);
  // Its 10 s deadline went with it: no clock entry keeps the dead actor.
  EXPECT_EQ(timers_of(r.id()), 0u) << "a timer outlives its request";
  expect_nothing_left(c);
}

TEST_F(request_lifecycle_test, a_running_request_has_one_deadline) {
  auto c = start_client(completion(50));
  step();
  ASSERT_TRUE(state_of(c).request_actor);
  // The positive control of the test above: the clock holds the deadline
  // while the request runs.
  EXPECT_EQ(timers_of(state_of(c).request_actor.id()), 1u);
}

TEST_F(request_lifecycle_test, a_request_whose_client_leaves_is_cancelled_and_leaves_nothing) {
  auto c = start_client(completion(50));
  step();
  ASSERT_EQ(state_of(c).deltas.size(), 1u);
  const auto r = state_of(c).request_actor;
  const auto client_addr = c.address();
  caf::anon_send_exit(c, caf::exit_reason::user_shutdown);
  spawned.clear();
  c = nullptr;
  sched.run();
  drain();
  EXPECT_EQ(status->running, 0);
  EXPECT_EQ(take_monitors(scheduler, r), 0u) << "monitors left on the scheduler";
  EXPECT_EQ(take_monitors(frontend, r), 0u) << "monitors left on the frontend";
  EXPECT_EQ(references(r), std::make_pair(size_t{0}, size_t{0}))
    << "{strong, weak} references to the dead request actor";
  EXPECT_EQ(references(client_addr), std::make_pair(size_t{0}, size_t{0}))
    << "{strong, weak} references to the dead client";
  EXPECT_EQ(sys.registry().running(), baseline_running);
}

TEST_F(request_lifecycle_test, many_finished_requests_leave_no_monitor_on_the_scheduler) {
  // The same client sends request after request; each request actor
  // monitors it and the scheduler. None of those monitors may pile up.
  std::vector<caf::actor_addr> request_actors;
  for (int i = 0; i < 20; ++i) {
    auto c = start_client(completion(1));
    step();
    drain();
    ASSERT_TRUE(state_of(c).done);
    request_actors.push_back(state_of(c).request_actor);
  }
  size_t left = 0;
  for (const auto& r : request_actors)
    left += take_monitors(scheduler, r);
  EXPECT_EQ(left, 0u);
  EXPECT_EQ(status->live_requests, 0);
}

// -- the network edge's sink ---------------------------------------------------------

class request_sink_lifecycle_test : public request_lifecycle_test {
protected:
  boost::asio::io_context io;
  std::shared_ptr<recording_listener> listener = std::make_shared<recording_listener>();
  std::shared_ptr<net::strand_port> port
    = std::make_shared<net::strand_port>(boost::asio::make_strand(io), listener);

  /// Delivers what the sinks posted to the connection's strand.
  void poll() {
    io.poll();
    io.restart();
  }

  caf::actor_addr start_sink(generate_request req) {
    auto s = net::spawn_request_sink(sys, frontend, std::move(req), port, 1);
    sched.run();
    return s.address();
  }

  /// The sink `s` has ended and left nothing behind.
  void expect_sink_gone(const caf::actor_addr& s) {
    drain();
    EXPECT_EQ(take_monitors(frontend, s), 0u) << "monitors left on the frontend";
    EXPECT_EQ(take_monitors(scheduler, s), 0u) << "monitors left on the scheduler";
    EXPECT_EQ(references(s), std::make_pair(size_t{0}, size_t{0}))
      << "{strong, weak} references to the dead sink";
    EXPECT_EQ(status->live_requests, 0);
    EXPECT_EQ(status->kv_used_pages, 0);
    EXPECT_EQ(sys.registry().running(), baseline_running) << "a request's actor is still running";
  }
};

TEST_F(request_sink_lifecycle_test, a_finished_request_leaves_no_sink_behind) {
  auto s = start_sink(completion(2));
  step();
  step();
  poll();
  ASSERT_TRUE(listener->done);
  EXPECT_EQ(listener->deltas, 2);
  expect_sink_gone(s);
}

TEST_F(request_sink_lifecycle_test, a_failed_request_leaves_no_sink_behind) {
  auto req = completion(2);
  req.prompt.clear(); // the prompt is empty
  auto s = start_sink(std::move(req));
  poll();
  ASSERT_TRUE(listener->error);
  EXPECT_EQ(listener->error->code, request_errc::invalid_request);
  expect_sink_gone(s);
}

TEST_F(request_sink_lifecycle_test, a_cancelled_request_leaves_no_sink_behind) {
  auto req = completion(50);
  const auto s = start_sink(std::move(req));
  step();
  poll();
  EXPECT_EQ(listener->deltas, 1);
  net::cancel_request_sink(caf::actor_cast<request_sink_actor>(s));
  sched.run();
  EXPECT_EQ(status->running, 0) << "the request was not cancelled";
  expect_sink_gone(s);
}

} // namespace
} // namespace metronome
