// Tier 2: workers (replicas in other processes) under CAF's deterministic
// test coordinator, in virtual time. The front end's real worker registry,
// router and request actors run; the workers are stand-ins in the same
// process: a stub scheduler that records the admissions the router
// forwards (and can answer tokens) and a stub agent that answers the
// heartbeat, or stays silent. What crosses a process boundary in
// production (the connection's DOWN, the heartbeat's timeout) is produced
// here by killing the agent or by letting virtual time pass. The two-process
// tests over loopback are tests/e2e/workers.test.mjs.

#include <optional>

#include <gtest/gtest.h>

#include "actors/engine.hpp"
#include "actors/engine_metrics.hpp"
#include "actors/replica_router_actor.hpp"
#include "actors/request_actor.hpp"
#include "actors/worker_registry.hpp"
#include "model/tokenizer/chat_template.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "tests/actors/fake_runners.hpp"
#include "tests/test_env.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t fingerprint = 42;

/// What a stub scheduler was given.
struct stub_scheduler_state {
  struct admission {
    admit_msg msg;
    caf::actor request;
  };
  std::vector<admission> admitted;
  std::vector<uint64_t> cancelled;
};

/// Stands in for a replica's scheduler: records admissions (and who sent
/// them) and cancellations.
caf::behavior stub_scheduler(caf::stateful_actor<stub_scheduler_state>* self) {
  return {
    [=](admit_msg& m) {
      self->state.admitted.push_back(
        {std::move(m), caf::actor_cast<caf::actor>(self->current_sender())});
    },
    [=](cancel_atom, uint64_t id, finish_kind) { self->state.cancelled.push_back(id); },
  };
}

/// Stands in for a worker's agent: answers each heartbeat with `health`
/// (its clock `offset` ahead of the front end's), or never when `silent`.
struct stub_agent_state {
  worker_health health;
  int64_t offset_ns = 0;
  bool silent = false;
  int pings = 0;
  std::vector<caf::response_promise> held;
};

caf::behavior stub_agent(caf::stateful_actor<stub_agent_state>* self) {
  return {
    [=](ping_atom, int64_t front_now) -> caf::result<worker_health> {
      auto& s = self->state;
      ++s.pings;
      if (s.silent) {
        s.held.push_back(self->make_response_promise());
        return s.held.back();
      }
      auto h = s.health;
      h.now_ns = front_now + s.offset_ns;
      return h;
    },
  };
}

/// The worker's side of a join: sends it, records the answer.
struct joiner_state {
  std::optional<worker_welcome> welcome;
  std::optional<caf::error> error;
};

caf::behavior joiner(caf::stateful_actor<joiner_state>* self, worker_registry_actor registry,
                     worker_join j) {
  self->request(registry, caf::infinite, std::move(j))
    .then([=](worker_welcome& w) { self->state.welcome = w; },
          [=](caf::error& e) { self->state.error = e; });
  return {[](int) {}};
}

/// A client of one request: records its deltas and its end.
struct client_state {
  std::string text;
  int32_t deltas = 0;
  std::optional<generation_done> done;
  std::optional<generation_error> error;
};

caf::behavior client(caf::stateful_actor<client_state>* self) {
  return {
    [=](text_delta& d) {
      ++self->state.deltas;
      self->state.text += d.text;
    },
    [=](generation_done& d) { self->state.done = std::move(d); },
    [=](generation_error& e) { self->state.error = std::move(e); },
  };
}

class workers_test : public test::deterministic_test<> {
protected:
  std::shared_ptr<const tokenizer> tokens;
  std::shared_ptr<engine_metrics> metrics = std::make_shared<engine_metrics>("t");
  caf::actor local = sys.spawn(stub_scheduler);
  replica_router_actor router;
  worker_registry_actor registry;
  std::shared_ptr<request_context> ctx = std::make_shared<request_context>();
  std::vector<caf::actor> spawned;
  int32_t hello = 0;

  workers_test() {
    const auto dir = std::filesystem::path(test::env("TESTDATA")) / "tokenizers" / "llama3";
    tokens = tokenizer::load(dir);
    hello = tokens->encode(" hello", {false, false}).at(0);
    // One local replica (0) and two worker slots (1, 2).
    status->set_replicas(3);
    metrics->enable_replicas(3);
    replica_router_config rc;
    rc.replicas = 3;
    rc.prefix_affinity = false;
    router = spawn_replica_router(sys, rc, {caf::actor_cast<scheduler_actor>(local)}, status,
                                  metrics, 2);
    worker_registry_config wc;
    wc.first_slot = 1;
    wc.slots = 2;
    wc.heartbeat = 500ms;
    wc.timeout = 2s;
    wc.model_fingerprint = fingerprint;
    wc.model_name = "tiny";
    wc.max_model_len = 1024;
    registry = spawn_worker_registry(sys, wc, router, status, metrics);
    ctx->scheduler = router;
    ctx->tokens = tokens;
    ctx->chat = std::make_shared<const chat_template>(chat_template::from_folder(dir));
    ctx->status = status;
    ctx->metrics = metrics;
    ctx->max_model_len = 1024;
    ctx->vocab_size = tokens->vocab_size();
    ctx->default_timeout = 1h;
    sched.run();
  }

  ~workers_test() override {
    for (auto& a : spawned)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    for (const caf::actor& a : {caf::actor_cast<caf::actor>(registry),
                                caf::actor_cast<caf::actor>(router), local})
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    sched.run();
  }

  struct worker {
    caf::actor scheduler;
    caf::actor agent;
  };

  worker_join join_of(const worker& w, std::string name) {
    worker_join j;
    j.version = wire_version;
    j.name = std::move(name);
    j.model_fingerprint = fingerprint;
    j.model_name = "tiny";
    j.max_model_len = 2048;
    j.device = "cpu";
    j.kv_pages = 64;
    j.page_size = 16;
    j.scheduler = w.scheduler;
    j.agent = w.agent;
    j.now_ns = now_ns();
    return j;
  }

  int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
             sys.clock().now().time_since_epoch())
      .count();
  }

  worker make_worker() {
    worker w{sys.spawn(stub_scheduler), sys.spawn(stub_agent)};
    deref<stub_agent_state>(w.agent).health.ready = true;
    spawned.push_back(w.scheduler);
    spawned.push_back(w.agent);
    return w;
  }

  joiner_state& join(worker_join j) {
    auto a = sys.spawn(joiner, registry, std::move(j));
    spawned.push_back(a);
    sched.run();
    return deref<joiner_state>(a);
  }

  /// A completion request of `max_tokens` through the router; its client.
  caf::actor request(int32_t max_tokens) {
    auto c = sys.spawn(client);
    spawned.push_back(c);
    generate_request r;
    r.request_id = "cmpl-" + std::to_string(spawned.size());
    r.prompt = "The quick brown fox";
    r.params.temperature = 0;
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    spawn_request(sys, ctx, std::move(r), caf::actor_cast<request_sink_actor>(c));
    sched.run();
    return c;
  }

  stub_scheduler_state& sched_of(const caf::actor& s) {
    return deref<stub_scheduler_state>(s);
  }

  /// `s` sends the request of its admission `i` one " hello" token.
  void send_token(const caf::actor& s, size_t i, finish_kind finish = finish_kind::none) {
    const auto& a = sched_of(s).admitted.at(i);
    token_msg t;
    t.seq_id = a.msg.seq_id;
    t.tokens = {hello};
    t.batch_size = 1;
    t.finish_reason = finish;
    t.queue_ns = 0;
    caf::send_as(s, caf::actor_cast<request_actor>(a.request), std::move(t));
    sched.run();
  }

  std::string metrics_text() {
    return metrics->render(*status);
  }

  /// Lets `d` of virtual time pass, a heartbeat interval at a time.
  void pass(std::chrono::milliseconds d) {
    for (auto t = 0ms; t < d; t += 100ms) {
      sched.advance_time(100ms);
      sched.run();
    }
  }
};

TEST_F(workers_test, a_joined_worker_takes_requests_on_its_own_clock) {
  EXPECT_FALSE(status->replica(1).up) << "worker slots start empty";
  auto w = make_worker();
  deref<stub_agent_state>(w.agent).offset_ns = 5'000'000'000; // its clock: 5 s ahead
  auto& st = deref<stub_agent_state>(w.agent);
  st.health.running = 2;
  st.health.waiting = 3;
  st.health.kv_used_pages = 10;
  st.health.kv_total_pages = 64;
  auto j = join_of(w, "w1");
  j.now_ns += 5'000'000'000;
  auto& joined = join(std::move(j));
  ASSERT_TRUE(joined.welcome) << (joined.error ? sys.render(*joined.error) : "no answer");
  EXPECT_EQ(joined.welcome->replica, 1);
  EXPECT_TRUE(status->replica(1).up);
  // The first heartbeat came at the join: the worker's load is the replica's.
  EXPECT_GE(st.pings, 1);
  EXPECT_EQ(status->replica(1).running, 2);
  EXPECT_EQ(status->replica(1).kv_used_pages, 10);
  // Requests go by load: the local replica first, then the worker.
  request(50);
  request(50);
  ASSERT_EQ(sched_of(local).admitted.size(), 1u);
  ASSERT_EQ(sched_of(w.scheduler).admitted.size(), 1u);
  const auto& on_local = sched_of(local).admitted[0].msg;
  const auto& on_worker = sched_of(w.scheduler).admitted[0].msg;
  EXPECT_EQ(on_worker.arrival_ns - on_local.arrival_ns, 5'000'000'000)
    << "the arrival is moved onto the worker's clock";
  // Its tokens reach the client; the request ends normally.
  send_token(w.scheduler, 0);
  send_token(w.scheduler, 0, finish_kind::length);
  auto& c = deref<client_state>(spawned.back());
  ASSERT_TRUE(c.done);
  EXPECT_EQ(c.done->completion_tokens, 2);
  EXPECT_EQ(c.text, " hello hello");
  const auto text = metrics_text();
  EXPECT_NE(text.find("metronome:worker_events_total{event=\"joined\"} 1"), std::string::npos);
  EXPECT_NE(text.find("metronome:replica_routed_requests_total{replica=\"1\"} 1"),
            std::string::npos);
}

TEST_F(workers_test, a_worker_that_does_not_fit_is_refused_with_the_reason) {
  auto w = make_worker();
  auto expect_refused = [&](worker_join j, const std::string& why) {
    auto& r = join(std::move(j));
    ASSERT_TRUE(r.error) << why;
    EXPECT_EQ(r.error->category(), caf::atom("worker"));
    const auto text = sys.render(*r.error);
    EXPECT_NE(text.find(why), std::string::npos) << text;
  };
  auto j = join_of(w, "old");
  j.version = wire_version + 1;
  expect_refused(j, "wire version " + std::to_string(wire_version + 1));
  j = join_of(w, "other-model");
  j.model_fingerprint = fingerprint + 1;
  expect_refused(j, "another model");
  j = join_of(w, "short");
  j.max_model_len = 512;
  expect_refused(j, "context is 512 tokens, shorter than this front end's 1024");
  EXPECT_FALSE(status->replica(1).up);
  EXPECT_FALSE(status->replica(2).up);
  // Two slots: a third worker finds none.
  ASSERT_TRUE(join(join_of(make_worker(), "a")).welcome);
  ASSERT_TRUE(join(join_of(make_worker(), "b")).welcome);
  expect_refused(join_of(make_worker(), "c"), "all 2 worker slots are taken");
  EXPECT_NE(metrics_text().find("metronome:worker_events_total{event=\"refused\"} 4"),
            std::string::npos);
}

TEST_F(workers_test, a_silent_worker_is_removed_and_its_requests_run_again_or_fail) {
  auto w = make_worker();
  ASSERT_TRUE(join(join_of(w, "w1")).welcome);
  // Everything goes to the worker while the local replica is out.
  caf::anon_send(router, ready_atom::value, int32_t(0), false);
  sched.run();
  auto fresh = request(20);    // no token yet when the worker goes
  auto streaming = request(20); // one token streamed
  ASSERT_EQ(sched_of(w.scheduler).admitted.size(), 2u);
  send_token(w.scheduler, 1);
  EXPECT_EQ(deref<client_state>(streaming).deltas, 1);
  caf::anon_send(router, ready_atom::value, int32_t(0), true);
  sched.run();
  // The worker stops answering: removed once a heartbeat goes unanswered
  // for the timeout (2 s), not before.
  deref<stub_agent_state>(w.agent).silent = true;
  pass(1500ms);
  EXPECT_TRUE(status->replica(1).up) << "removed before its timeout";
  pass(2500ms);
  EXPECT_FALSE(status->replica(1).up);
  // The one with nothing streamed runs again on the local replica, under a
  // new sequence id; the other fails, saying why.
  ASSERT_EQ(sched_of(local).admitted.size(), 1u);
  const auto old_id = sched_of(w.scheduler).admitted[0].msg.seq_id;
  EXPECT_NE(sched_of(local).admitted[0].msg.seq_id, old_id);
  auto& s = deref<client_state>(streaming);
  ASSERT_TRUE(s.error);
  EXPECT_EQ(s.error->code, request_errc::engine_failure);
  EXPECT_NE(s.error->message.find("lost after 1 tokens"), std::string::npos) << s.error->message;
  EXPECT_NE(s.error->message.find("no heartbeat answer within 2000 ms"), std::string::npos)
    << s.error->message;
  // The lost scheduler is told to cancel both, in case it wakes up.
  EXPECT_EQ(sched_of(w.scheduler).cancelled.size(), 2u);
  // A late token of the lost admission is dropped; the new run's arrive.
  send_token(w.scheduler, 0);
  auto& f = deref<client_state>(fresh);
  EXPECT_EQ(f.deltas, 0) << "a token of the lost admission reached the client";
  send_token(local, 0);
  send_token(local, 0, finish_kind::length);
  ASSERT_TRUE(f.done);
  EXPECT_EQ(f.done->completion_tokens, 2);
  EXPECT_FALSE(f.error);
  EXPECT_NE(metrics_text().find("metronome:request_reruns_total"), std::string::npos);
}

TEST_F(workers_test, a_closed_connection_removes_the_worker_at_once) {
  auto w = make_worker();
  ASSERT_TRUE(join(join_of(w, "w1")).welcome);
  caf::anon_send(router, ready_atom::value, int32_t(0), false);
  sched.run();
  auto c = request(20);
  ASSERT_EQ(sched_of(w.scheduler).admitted.size(), 1u);
  // What the middleman does to a proxy whose connection closed.
  caf::anon_send_exit(w.agent, caf::exit_reason::remote_link_unreachable);
  sched.run();
  EXPECT_FALSE(status->replica(1).up);
  // Nowhere to run again: the request fails at once, not at its deadline.
  auto& st = deref<client_state>(c);
  ASSERT_TRUE(st.error);
  EXPECT_EQ(st.error->code, request_errc::unavailable);
  EXPECT_NE(metrics_text().find("metronome:worker_events_total{event=\"lost\"} 1"),
            std::string::npos);
}

TEST_F(workers_test, a_worker_that_comes_back_gets_its_slot_again) {
  auto first = make_worker();
  ASSERT_TRUE(join(join_of(first, "w1")).welcome);
  auto other = make_worker();
  ASSERT_EQ(join(join_of(other, "w2")).welcome->replica, 2);
  caf::anon_send_exit(first.agent, caf::exit_reason::remote_link_unreachable);
  caf::anon_send_exit(other.agent, caf::exit_reason::remote_link_unreachable);
  sched.run();
  EXPECT_FALSE(status->replica(1).up);
  // w2 comes back first, into its own slot, not the first free one.
  auto& again2 = join(join_of(make_worker(), "w2"));
  ASSERT_TRUE(again2.welcome);
  EXPECT_EQ(again2.welcome->replica, 2);
  auto& again1 = join(join_of(make_worker(), "w1"));
  ASSERT_TRUE(again1.welcome);
  EXPECT_EQ(again1.welcome->replica, 1);
  EXPECT_TRUE(status->replica(1).up);
  // A second worker of a name replaces the first (a quick restart whose
  // old connection is not yet known dead).
  auto newer = make_worker();
  auto& replaced = join(join_of(newer, "w1"));
  ASSERT_TRUE(replaced.welcome);
  EXPECT_EQ(replaced.welcome->replica, 1);
  caf::anon_send(router, ready_atom::value, int32_t(0), false);
  sched.run();
  request(10);
  request(10);
  EXPECT_EQ(sched_of(newer.scheduler).admitted.size(), 1u) << "the replaced worker still routed";
}

} // namespace
} // namespace metronome
