// The engine's actors together on real threads with the CPU runner and a
// tiny Llama-3 model: what a client sees (deltas, done, errors), and what
// the engine does when a client leaves, a step fails or limits are hit.

#include <map>

#include <gtest/gtest.h>

#include "actors/engine.hpp"
#include "actors/engine_metrics.hpp"
#include "actors/request_actor.hpp"
#include "gpu/cuda_runner.hpp"
#include "model/make_model.hpp"
#include "model/tokenizer/chat_template.hpp"
#include "model/model_weights.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "tests/actors/actor_test_config.hpp"
#include "tests/model/test_support.hpp"

namespace metronome {
namespace {

using namespace std::chrono_literals;

using test::chat_model;
using test_config = test::actor_test_config;

/// What one request produced, as its sink saw it.
struct outcome {
  std::string text;
  std::vector<int32_t> ids;
  std::optional<generation_done> done;
  std::optional<generation_error> error;
  int deltas = 0;
};

class engine_test : public ::testing::Test {
protected:
  test_config cfg;
  caf::actor_system sys{cfg};
  engine_options opts;
  std::optional<engine> eng;

  void start() {
    opts.model_dir = chat_model();
    eng = spawn_engine(sys, opts);
  }

  ~engine_test() override {
    if (eng)
      eng->shutdown();
  }

  outcome run(generate_request req, std::chrono::seconds limit = 60s) {
    caf::scoped_actor self{sys};
    self->send(eng->frontend, std::move(req));
    outcome out;
    bool finished = false;
    while (!finished) {
      self->receive(
        [&](text_delta& d) {
          out.text += d.text;
          out.ids.insert(out.ids.end(), d.token_ids.begin(), d.token_ids.end());
          ++out.deltas;
        },
        [&](generation_done& d) {
          out.done = d;
          finished = true;
        },
        [&](generation_error& e) {
          out.error = e;
          finished = true;
        },
        caf::after(limit) >> [&] {
          ADD_FAILURE() << "no answer within " << limit.count() << " s";
          finished = true;
        });
    }
    return out;
  }

  static generate_request completion(std::string prompt, int32_t max_tokens) {
    generate_request r;
    r.request_id = "cmpl-test";
    r.prompt = std::move(prompt);
    r.params.temperature = 0;
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    return r;
  }

  scheduler_stats stats() {
    caf::scoped_actor self{sys};
    scheduler_stats out;
    self->request(eng->scheduler, 5s, stats_atom::value)
      .receive([&](scheduler_stats& s) { out = s; },
               [&](caf::error& e) { ADD_FAILURE() << sys.render(e); });
    return out;
  }

  /// Waits until the engine is idle: no requests (none monitored by the
  /// scheduler), no pages in use, no page table left.
  bool settles() {
    for (int i = 0; i < 200; ++i) {
      const auto s = stats();
      if (eng->status->live_requests == 0 && eng->status->kv_used_pages == 0
          && s.live_requests == 0 && s.kv_used_pages == 0 && s.kv_sequences == 0
          && s.waiting == 0 && s.running == 0)
        return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }
};

TEST_F(engine_test, a_completion_streams_the_greedy_tokens_as_text) {
  start();
  auto out = run(completion("The quick brown fox", 12));
  ASSERT_FALSE(out.error) << out.error->message;
  ASSERT_TRUE(out.done);
  EXPECT_EQ(out.done->finish_reason, finish_kind::length);
  EXPECT_EQ(out.done->completion_tokens, 12);
  EXPECT_EQ(out.ids.size(), 12u);
  // The text is the tokenizer's decoding of the ids, whatever the chunking.
  EXPECT_EQ(out.text, eng->tokens->decode(out.ids));
  // And the ids are what the runner makes alone.
  auto prompt = eng->tokens->encode("The quick brown fox", {true, false});
  EXPECT_EQ(out.done->prompt_tokens, int32_t(prompt.size()));
  const auto alone = test::greedy_alone(prompt, 12, {0, 1});
  EXPECT_EQ(out.ids, alone);
  EXPECT_GT(out.done->ttft_s, 0.0);
  EXPECT_GE(out.done->e2e_s, out.done->ttft_s);
  EXPECT_GE(out.done->first_token_batch_size, 1);
  EXPECT_TRUE(settles());
}

// The runner's memory plan reaches /metrics once the executor is up: the CPU
// runner's KV cache, fp32 keys and values of every layer for every page.
TEST_F(engine_test, two_cpu_replicas_serve_concurrent_requests_as_one_engine_does) {
  opts.devices = {"cpu", "cpu"};
  start();
  ASSERT_TRUE(eng->router) << "data parallel runs a router";
  ASSERT_EQ(eng->schedulers.size(), 2u);
  const auto alone = run(completion("The quick brown fox", 8));
  ASSERT_FALSE(alone.error) << alone.error->message;
  // Four at once from one sink, told apart by their ids.
  caf::scoped_actor self{sys};
  for (int i = 0; i < 4; ++i) {
    auto r = completion("The quick brown fox", 8);
    r.request_id = "r" + std::to_string(i);
    self->send(eng->frontend, std::move(r));
  }
  std::map<std::string, std::vector<int32_t>> ids;
  int ended = 0;
  while (ended < 4) {
    self->receive(
      [&](text_delta& d) {
        auto& v = ids[d.request_id];
        v.insert(v.end(), d.token_ids.begin(), d.token_ids.end());
      },
      [&](generation_done&) { ++ended; },
      [&](generation_error& e) {
        ADD_FAILURE() << e.request_id << ": " << e.message;
        ++ended;
      },
      caf::after(60s) >> [&] {
        ADD_FAILURE() << "no answer within 60 s";
        ended = 4;
      });
  }
  ASSERT_EQ(ids.size(), 4u);
  for (const auto& [id, got] : ids)
    EXPECT_EQ(got, alone.ids) << id << ": the replicas run the same model";
  const auto text = render_metrics(*eng);
  double routed = 0;
  for (const std::string r : {"0", "1"}) {
    const std::string series = "metronome:replica_routed_requests_total{replica=\"" + r + "\"} ";
    const auto at = text.find(series);
    ASSERT_NE(at, std::string::npos) << text;
    routed += std::stod(text.substr(at + series.size()));
  }
  EXPECT_EQ(routed, 5) << "every request went through the router";
  EXPECT_NE(text.find("metronome:replica_up{replica=\"1\"} 1"), std::string::npos);
  EXPECT_TRUE(settles());
}

TEST_F(engine_test, replicas_sharing_a_device_split_its_memory_fraction) {
  const std::vector<std::string> devices = {"cuda:0", "cuda:1", "cuda:0"};
  EXPECT_DOUBLE_EQ(replica_memory_fraction(devices, 0, 0.9), 0.45);
  EXPECT_DOUBLE_EQ(replica_memory_fraction(devices, 1, 0.9), 0.9);
  EXPECT_DOUBLE_EQ(replica_memory_fraction(devices, 2, 0.9), 0.45);
  engine_options o;
  o.devices = {"cpu", "cuda:0"};
  EXPECT_THROW(replica_devices(o), std::invalid_argument);
  o.devices.clear();
  o.device = "cuda:3";
  EXPECT_EQ(replica_devices(o), std::vector<std::string>{"cuda:3"});
}

TEST_F(engine_test, the_memory_plan_is_in_the_metrics_once_the_executor_is_up) {
  start();
  auto out = run(completion("Hello", 1)); // the executor is up once a step ran
  ASSERT_TRUE(out.done);
  const auto cfg = model_folder::open(chat_model())->config;
  const int64_t pages = eng->status->kv_total_pages.load();
  ASSERT_GT(pages, 0);
  const int64_t bytes = pages * opts.limits.page_size * cfg.num_layers * 2 * cfg.kv_size() * 4;
  const std::string text = eng->metrics->render(*eng->status);
  EXPECT_NE(text.find("# TYPE metronome:memory_bytes gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("metronome:memory_bytes{part=\"kv_pool\"} " + std::to_string(bytes) + "\n"),
            std::string::npos)
    << text;
  const auto plan = eng->status->memory_plan();
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].name, "kv_pool");
  EXPECT_EQ(plan[0].bytes, bytes);
}

// engine.kv_strategy bucketed end to end on the CPU: the strategy is named,
// a request takes a bucket (counted in /metrics) and gives it back.
TEST_F(engine_test, a_bucketed_engine_reserves_and_returns_buckets) {
  opts.kv = kv_strategy::bucketed;
  opts.kv_bucket_min_tokens = 64;
  opts.kv_buckets_per_size = 2;
  start();
  EXPECT_TRUE(eng->status->kv_cache_strategy.starts_with("bucketed;")) << eng->status->kv_cache_strategy;
  auto out = run(completion("Hello", 8)); // a few prompt tokens + 8: the 64-token class
  ASSERT_FALSE(out.error) << out.error->message;
  ASSERT_TRUE(out.done);
  EXPECT_TRUE(settles());
  const std::string text = eng->metrics->render(*eng->status);
  EXPECT_NE(text.find("\nmetronome:kv_bucket_admissions_total 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nmetronome:kv_bucket_overflows_total 0\n"), std::string::npos);
  EXPECT_NE(text.find("\nmetronome:kv_bucket_reserved_unused_pages 0\n"), std::string::npos)
    << "the bucket came back";
}

TEST_F(engine_test, a_stop_string_ends_generation_before_it_and_is_not_sent) {
  start();
  auto full = run(completion("Once upon a time", 24));
  ASSERT_TRUE(full.done);
  ASSERT_GE(full.text.size(), 6u);
  // Stop at a piece of the text the model will produce, spanning tokens.
  auto stop = full.text.substr(full.text.size() / 2, 3);
  auto req = completion("Once upon a time", 24);
  req.stop = {"\x01never", stop};
  auto out = run(req);
  ASSERT_TRUE(out.done) << (out.error ? out.error->message : "");
  EXPECT_EQ(out.done->finish_reason, finish_kind::stop);
  EXPECT_EQ(out.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_TRUE(settles());
}

TEST_F(engine_test, chat_requests_use_the_template_and_stop_at_eos_unless_ignored) {
  start();
  generate_request r;
  r.request_id = "chatcmpl-1";
  r.chat = true;
  r.messages = {{"system", "Be brief."}, {"user", "Hi <|eot_id|> there"}};
  r.params.temperature = 0;
  r.params.max_tokens = 8;
  auto out = run(r);
  ASSERT_TRUE(out.done) << (out.error ? out.error->message : "");
  EXPECT_GT(out.done->prompt_tokens, 10);
  // The user's "<|eot_id|>" stayed text: only the template's one per turn.
  auto tmpl = chat_template::from_folder(chat_model());
  auto ids = encode_chat(*eng->tokens, tmpl, r.messages, true);
  EXPECT_EQ(int32_t(ids.size()), out.done->prompt_tokens);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *eng->tokens->token_to_id("<|eot_id|>")), 2);
}

/// A sink that leaves after `n` deltas, as a client that hangs up.
caf::behavior impatient_sink(caf::event_based_actor* self, frontend_actor frontend,
                             generate_request req, int n) {
  self->send(frontend, std::move(req));
  auto left = std::make_shared<int>(n);
  return {
    [=](text_delta&) {
      if (--*left == 0)
        self->quit();
    },
    [=](generation_done&) { self->quit(); },
    [=](generation_error&) { self->quit(); },
  };
}

TEST_F(engine_test, a_client_that_leaves_cancels_its_request_and_frees_its_pages) {
  start();
  for (int i = 0; i < 8; ++i)
    sys.spawn(impatient_sink, eng->frontend, completion("Tell me a long story", 4000), 1 + i % 3);
  for (int i = 0; i < 500 && stats().cancelled < 8; ++i)
    std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(settles()) << "live " << eng->status->live_requests << " pages "
                         << eng->status->kv_used_pages;
  EXPECT_EQ(stats().cancelled, 8);
  // Still serving.
  EXPECT_TRUE(run(completion("Hello", 3)).done);
}

TEST_F(engine_test, an_executor_crash_fails_running_requests_and_the_engine_recovers) {
  start();
  caf::scoped_actor self{sys};
  self->send(eng->frontend, completion("A long answer", 3000));
  self->receive([&](text_delta&) {}, caf::after(30s) >> [] { FAIL() << "no first token"; });
  caf::anon_send(eng->supervisor, crash_atom::value);
  std::optional<generation_error> err;
  for (bool done = false; !done;)
    self->receive([&](text_delta&) {},
                  [&](generation_error& e) {
                    err = e;
                    done = true;
                  },
                  [&](generation_done&) { done = true; },
                  caf::after(30s) >> [&] { done = true; });
  ASSERT_TRUE(err);
  EXPECT_EQ(err->code, request_errc::engine_failure);
  EXPECT_NE(err->message.find("injected crash"), std::string::npos) << err->message;
  auto out = run(completion("After the crash", 4));
  ASSERT_TRUE(out.done) << (out.error ? out.error->message : "");
  EXPECT_TRUE(settles());
  EXPECT_FALSE(eng->status->degraded);
}

TEST_F(engine_test, too_many_crashes_degrade_the_engine_to_fast_failure) {
  opts.restarts.max_restarts = 1;
  start();
  for (int i = 0; i < 2; ++i) {
    while (!eng->status->ready)
      std::this_thread::sleep_for(5ms);
    eng->status->ready = false; // set again by the restart
    caf::anon_send(eng->supervisor, crash_atom::value);
    for (int k = 0; k < 500 && !eng->status->ready && !eng->status->degraded; ++k)
      std::this_thread::sleep_for(10ms);
  }
  auto out = run(completion("Anyone?", 4));
  ASSERT_TRUE(out.error);
  EXPECT_EQ(out.error->code, request_errc::unavailable);
  EXPECT_TRUE(eng->status->degraded);
}

TEST_F(engine_test, invalid_requests_get_errors_naming_the_parameter) {
  opts.limits.max_model_len = 64;
  start();
  std::string long_prompt;
  for (int i = 0; i < 100; ++i)
    long_prompt += "word" + std::to_string(i) + " ";
  auto r = completion(long_prompt, 4);
  auto out = run(r);
  ASSERT_TRUE(out.error);
  EXPECT_EQ(out.error->code, request_errc::context_length);
  EXPECT_EQ(out.error->param, "prompt");
  EXPECT_NE(out.error->message.find("maximum context length is 64 tokens"), std::string::npos);
  r = completion("short", 100);
  out = run(r);
  ASSERT_TRUE(out.error);
  EXPECT_EQ(out.error->param, "max_tokens");
  r = completion("short", 4);
  r.params.top_p = 0;
  out = run(r);
  ASSERT_TRUE(out.error);
  EXPECT_EQ(out.error->code, request_errc::invalid_request);
  EXPECT_EQ(out.error->param, "top_p");
  r = completion("", 4);
  r.prompt_ids = {1, 999999};
  out = run(r);
  ASSERT_TRUE(out.error);
  EXPECT_EQ(out.error->param, "prompt");
  generate_request chat;
  chat.chat = true;
  chat.messages = {{"wizard", "hi"}};
  out = run(chat);
  ASSERT_TRUE(out.error);
  EXPECT_EQ(out.error->code, request_errc::invalid_request);
  EXPECT_TRUE(settles());
}

TEST_F(engine_test, an_fp8_kv_cache_is_refused_on_the_cpu_at_start) {
  auto message_of = [&] {
    try {
      start();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "spawn_engine accepted kv_cache_dtype " << to_string(opts.kv_cache_dtype);
    return std::string();
  };
  opts.kv_cache_dtype = kv_cache_dtype_kind::fp8;
  EXPECT_EQ(message_of(), "engine.kv_cache_dtype fp8 needs a CUDA device (device 'cpu' keeps "
                          "its KV cache in fp32)");
  EXPECT_FALSE(eng);
  // bf16, the default, runs on the CPU (whose KV cache is fp32 regardless).
  opts.kv_cache_dtype = kv_cache_dtype_kind::bf16;
  start();
  EXPECT_EQ(eng->status->kv_cache_strategy, "paged;page_size=16;dtype=fp32");
  auto out = run(completion("Hello", 2));
  ASSERT_FALSE(out.error) << out.error->message;
  EXPECT_TRUE(out.done);
}

// Tensor parallelism is refused at start, naming the key or the field,
// where it cannot run: on the CPU, beside data parallel replicas, and with
// a model whose heads do not split.
TEST_F(engine_test, tensor_parallelism_is_refused_at_start_where_it_cannot_run) {
  auto message_of = [&]() -> std::string {
    try {
      start();
    } catch (const std::exception& e) {
      return e.what();
    }
    ADD_FAILURE() << "spawn_engine accepted tensor_parallel " << opts.tensor_parallel;
    return {};
  };
  opts.tensor_parallel = 2;
  EXPECT_NE(message_of().find("model.tensor_parallel is 2 but model.device is cpu"),
            std::string::npos);
  opts.devices = {"cpu", "cpu"};
  EXPECT_NE(message_of().find("with data parallel replicas"), std::string::npos);
  opts.devices.clear();
  opts.device = "cuda:0";
  opts.tensor_parallel = 3; // tiny-llama3: 4 query heads
  EXPECT_NE(message_of().find("num_attention_heads"), std::string::npos);
  EXPECT_FALSE(eng);
}

// fp8_e5m2 on CUDA with tensor parallelism is refused at start (each rank
// counts the overflows of its own kv heads), before any device is looked
// at (so also on a machine without one).
TEST_F(engine_test, an_fp8_e5m2_kv_cache_with_tensor_parallelism_is_refused_at_start) {
  opts.model_dir = chat_model();
  opts.kv_cache_dtype = kv_cache_dtype_kind::fp8_e5m2;
  opts.device = "cuda:0";
  opts.tensor_parallel = 2;
  try {
    eng = spawn_engine(sys, opts);
    ADD_FAILURE() << "spawn_engine accepted fp8_e5m2 with tensor_parallel 2";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "model.tensor_parallel is 2 with engine.kv_cache_dtype fp8_e5m2: its overflow "
              "counts are not summed over ranks yet (use fp8 or bf16)");
  }
  EXPECT_FALSE(eng);
}

// On the CPU, fp8_e5m2 is served as the format's reference with its
// overflow supervision: on a model made to overflow (test::
// overflowing_model), a request whose prompt holds the overflowing token
// is re-materialised in bf16 and ends with what a bf16 engine generates;
// the done message, the metrics and the strategy say so.
TEST_F(engine_test, an_fp8_e5m2_kv_cache_is_served_on_the_cpu_with_overflow_supervision) {
  auto request = [] {
    generate_request r = completion("", 6);
    r.prompt_ids = {100, test::overflow_token, 200, 300, 400};
    return r;
  };
  opts.model_dir = test::overflowing_model();
  opts.kv_cache_dtype = kv_cache_dtype_kind::bf16;
  eng = spawn_engine(sys, opts);
  EXPECT_FALSE(eng->kv_precision_supervisor) << "only with fp8_e5m2";
  const auto bf16 = run(request());
  ASSERT_FALSE(bf16.error) << bf16.error->message;
  eng->shutdown();
  eng.reset();

  opts.kv_cache_dtype = kv_cache_dtype_kind::fp8_e5m2;
  eng = spawn_engine(sys, opts);
  EXPECT_TRUE(eng->kv_precision_supervisor);
  EXPECT_EQ(eng->status->kv_cache_strategy, "paged;page_size=16;dtype=fp8_e5m2");
  const auto out = run(request());
  ASSERT_FALSE(out.error) << out.error->message;
  ASSERT_TRUE(out.done);
  EXPECT_EQ(out.ids, bf16.ids);
  EXPECT_EQ(out.done->kv_overflow, "rematerialized");
  const auto metrics = render_metrics(*eng);
  EXPECT_NE(metrics.find("metronome:kv_precision_events_total{event=\"rematerialized\"} 1"),
            std::string::npos)
    << metrics;
  EXPECT_NE(metrics.find("metronome:kv_precision_mode{mode=\"fp8_e5m2\"} 1"), std::string::npos);
  EXPECT_TRUE(settles());
}

// On a CUDA device, a model the fp8 cache cannot serve (head_dim 256) is
// refused by spawn_engine with the reason, before any executor starts
// (which would otherwise fail, restart and leave the engine degraded). No
// GPU is needed: the check is host arithmetic.
TEST_F(engine_test, an_fp8_kv_cache_the_model_cannot_use_is_refused_at_start) {
  make_model_options mo;
  mo.config = *preset_config("tiny-llama3");
  mo.config.hidden_size = 256;
  mo.config.num_heads = 1;
  mo.config.num_kv_heads = 1;
  mo.config.head_dim = 256;
  if (cuda_kv_cache_problem(mo.config, kv_cache_dtype_kind::fp8).empty())
    GTEST_SKIP() << "this build has no CUDA kernels to ask";
  mo.seed = 7;
  mo.tokenizer_dir = test::env("TESTDATA") + "/tokenizers/llama3";
  mo.out_dir = test::scratch_dir("engine-head-dim-256");
  make_model(mo);
  opts.model_dir = mo.out_dir;
  opts.device = "cuda:0";
  opts.kv_cache_dtype = kv_cache_dtype_kind::fp8;
  try {
    eng = spawn_engine(sys, opts);
    ADD_FAILURE() << "spawn_engine accepted fp8 for head_dim 256";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "engine.kv_cache_dtype 'fp8': fp8 needs head_dim 16, 32, 64 or 128 and at most 8 "
              "query heads a kv head (this model: head_dim 256, 1 a kv head)");
  }
}

// A CUDA device this machine does not have (any on a machine without a GPU)
// is refused by spawn_engine, rather than an executor failing, restarting and
// leaving the engine degraded behind a listening server.
TEST_F(engine_test, a_cuda_device_the_machine_lacks_is_refused_at_start) {
  opts.model_dir = chat_model();
  opts.device = "cuda:" + std::to_string(cuda_device_count());
  try {
    eng = spawn_engine(sys, opts);
    ADD_FAILURE() << "spawn_engine accepted " << opts.device;
  } catch (const std::invalid_argument& e) {
    const std::string problem = cuda_device_problem(cuda_device_count());
    EXPECT_FALSE(problem.empty());
    EXPECT_EQ(std::string(e.what()), "device '" + opts.device + "': " + problem);
  }
}

// A real device fault cannot be injected into the CPU runner: refused at
// start, not at the failing step.
TEST_F(engine_test, a_device_fault_injection_needs_a_cuda_device) {
  opts.model_dir = chat_model();
  opts.faults = *fault_injection::parse("device_fault_after:3");
  try {
    eng = spawn_engine(sys, opts);
    ADD_FAILURE() << "spawn_engine accepted a device fault on the CPU";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "engine.fault_injection device_fault_after:3: a device fault "
                                     "needs a CUDA device (model.device cuda:N)");
  }
}

TEST_F(engine_test, a_request_that_outlives_its_timeout_fails_and_frees_its_pages) {
  start();
  auto r = completion("Slowly", 3000);
  r.timeout = 300ms;
  auto out = run(r);
  ASSERT_TRUE(out.error);
  EXPECT_EQ(out.error->code, request_errc::timeout);
  EXPECT_TRUE(settles());
}

TEST_F(engine_test, a_full_queue_refuses_new_requests) {
  opts.limits.max_queued_requests = 1;
  opts.limits.max_batch_size = 1;
  start();
  while (!eng->status->ready) // before it, every request waits in the queue
    std::this_thread::sleep_for(5ms);
  caf::scoped_actor self{sys};
  for (int i = 0; i < 6; ++i)
    self->send(eng->frontend, completion("Queue " + std::to_string(i), 200));
  int refused = 0, served = 0;
  for (int got = 0; got < 6;)
    self->receive([&](text_delta&) {},
                  [&](generation_done&) {
                    ++served;
                    ++got;
                  },
                  [&](generation_error& e) {
                    EXPECT_EQ(e.code, request_errc::queue_full);
                    ++refused;
                    ++got;
                  },
                  caf::after(60s) >> [&] { got = 6; });
  EXPECT_GE(refused, 1);
  EXPECT_GE(served, 2);
  EXPECT_TRUE(settles());
}

} // namespace
} // namespace metronome
