#pragma once
// The engine as one unit: spawns the frontend and the supervision tree (the
// engine supervisor, which owns the scheduler, the executor and the
// watchers: engine_supervisor.hpp) for one model, and hands out the handles
// a network edge or an embedding program needs.

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "caf/all.hpp"

#include "actors/drift_supervisor.hpp"
#include "actors/engine_supervisor.hpp"
#include "actors/interfaces.hpp"
#include "sched/kv_precision_controller.hpp"
#include "sched/ladb_policy.hpp"
#include "sched/token_groups.hpp"
#include "model/engine_limits.hpp"
#include "model/fault_injection.hpp"
#include "model/model_runner.hpp"
#include "model/weight_quantization.hpp"

namespace metronome {

class tokenizer;
class chat_template;
class engine_metrics;

/// Replicas in other processes (`metronome worker`; workers.* in
/// metronome.yaml, docs/scale-out.md), seen from the front end.
struct worker_options {
  /// HOST:PORT where workers attach (port 0: any free port, engine::
  /// worker_port says which); empty: no workers. Needs an actor system
  /// with CAF's middleman loaded.
  std::string listen;
  /// Worker slots of the router (replicas after the local ones).
  int32_t max_workers = 8;
  std::chrono::milliseconds heartbeat{500};
  std::chrono::milliseconds timeout{3000};
};

/// How an engine is built; tools/metronome/cmd_serve.cpp fills it from the
/// server configuration.
struct engine_options {
  std::filesystem::path model_dir;
  /// "cpu" or "cuda:N".
  std::string device = "cpu";
  /// Data parallel (model.devices, model.data_parallel): one replica per
  /// entry, each with its own scheduler, executor and KV cache behind one
  /// router; all "cpu" or all "cuda:N". A device listed k times holds k
  /// replicas, each planning gpu_memory_fraction / k of it. Empty: one
  /// replica on `device`.
  std::vector<std::string> devices;
  /// Tensor parallel (model.tensor_parallel ...): the one replica split
  /// over this many ranks, on tensor_parallel_devices (empty: consecutive
  /// devices from `device`), summing over the collective named
  /// (cuda_runner_options). 1: not split.
  int32_t tensor_parallel = 1;
  std::vector<std::string> tensor_parallel_devices;
  std::string tensor_parallel_collective = "auto";
  /// Name reported by /v1/models and checked against requests; defaults to
  /// the id in the folder's metronome.json (model/model_card.hpp), else the
  /// folder's name.
  std::string served_model_name;
  /// Force a chat template format (llama3, llama2, mistral, chatml).
  std::optional<std::string> chat_template;
  /// A Jinja chat template file to use instead of the folder's template
  /// (chat_template::from_file; spawn_engine throws model_error naming it
  /// when it cannot be read or its format is not recognised). Ignored when
  /// chat_template names a format.
  std::filesystem::path chat_template_file;
  /// Step size, sequence length, KV pages and capacity, queue and step
  /// timeout, passed on to the scheduler and the runner
  /// (model/engine_limits.hpp; max_model_len 0 = the model's context).
  engine_limits limits;
  /// Scheduling policy; ladb is `serve`'s default too.
  policy_kind policy = policy_kind::ladb;
  /// Settings of the latency-aware policies (config sections predictor,
  /// batching, router) and of their drift supervisor (supervisor.drift),
  /// which runs when the policy is not fcfs and drift.enabled.
  predictor_options predictor;
  ladb_options ladb;
  srpt_options srpt;
  drift_options drift;
  /// How often the stats line (actors/stats_reporter.hpp) is written while
  /// the engine has work; 0: never.
  std::chrono::milliseconds stats_interval{std::chrono::seconds(10)};
  /// A CSV of every step's plan and measured time (sched/step_trace.hpp;
  /// logging.step_trace); empty = none. spawn_engine throws
  /// std::runtime_error when it cannot be written.
  std::filesystem::path step_trace;
  /// Default and maximum time a request may take.
  std::chrono::milliseconds request_timeout{std::chrono::minutes(10)};
  /// Executor restarts allowed within their window before the engine is
  /// degraded (supervisor.executor; the configuration's defaults).
  restart_policy restarts;
  /// GPU settings.
  double gpu_memory_fraction = 0.9;
  bool cuda_graphs = true;
  /// Reuse the KV pages of identical prompt prefixes (sched/kv_page_pool.hpp).
  bool prefix_caching = true;
  /// engine.kv_strategy and its buckets (sched/kv_buckets.hpp).
  kv_strategy kv = kv_strategy::paged;
  int32_t kv_bucket_min_tokens = 4096;
  int32_t kv_buckets_per_size = 32;
  /// batching.token_groups: token-aware grouping (sched/token_groups.hpp);
  /// none = off.
  token_groups groups;
  /// Element type of the KV cache (fp8: CUDA only, spawn_engine refuses it
  /// on the CPU, whose KV cache is fp32 whatever this says; fp8_e5m2: the
  /// CPU only, as the format's reference, its cache still fp32).
  kv_cache_dtype_kind kv_cache_dtype = kv_cache_dtype_kind::bf16;
  /// fp8_e5m2's overflow supervision (engine.kv_overflow;
  /// sched/kv_precision_controller.hpp): the kv precision supervisor runs
  /// with these settings when kv_cache_dtype is fp8_e5m2 and one replica.
  kv_overflow_options kv_overflow;
  /// model.quantize: int4 quantizes a float checkpoint's projections at load
  /// (model_folder::open, model/rtn_quantize.hpp).
  weight_quantization quantize = weight_quantization::none;
  /// Test hook: builds the runner instead of the device's own (called on the
  /// executor's thread at every (re)start).
  std::function<std::unique_ptr<model_runner>()> runner_factory;
  /// Tests and drills only (engine.fault_injection): one step of every
  /// runner fails as this says (model/fault_injection.hpp); none by default.
  fault_injection faults;
  /// Called when the device is lost for the rest of the process
  /// (engine_supervision::on_device_lost); `serve` exits non-zero.
  std::function<void(const std::string& reason)> on_device_lost;
  /// Workers that may attach to this engine as more replicas.
  worker_options workers;
  /// No replica in this process: only workers serve (workers.listen must be
  /// set). The front end then loads the model's configuration and tokenizer,
  /// not its weights, and reports ready once a worker has joined.
  bool workers_only = false;
};

/// Data parallel: one replica's figures, written by its scheduler (and
/// `up` by the router), read by /metrics. Any thread.
struct replica_gauges {
  std::atomic<int32_t> waiting{0};
  std::atomic<int32_t> running{0};
  std::atomic<int32_t> kv_used_pages{0};
  std::atomic<int32_t> kv_total_pages{0};
  /// The router places requests on it.
  std::atomic<bool> up{true};
};

/// Facts about a running engine, readable from any thread without blocking
/// (the memory plan under a short lock).
struct engine_status {
  /// The executor has loaded the model and is ready to run steps.
  std::atomic<bool> ready{false};
  /// The engine is degraded (the executor failed more often than
  /// max_restarts, or lost its device): requests fail fast. Written by the
  /// engine supervisor only (set_degraded), which owns the state; read by
  /// /health, the frontend and the scheduler's admission. Any thread.
  std::atomic<bool> degraded{false};
  /// Request actors alive (admitted or tokenizing).
  std::atomic<int64_t> live_requests{0};
  /// Requests waiting and running in the scheduler.
  std::atomic<int32_t> waiting{0};
  std::atomic<int32_t> running{0};
  /// KV pages in use and in all.
  std::atomic<int32_t> kv_used_pages{0};
  std::atomic<int32_t> kv_total_pages{0};

  /// Publishes the engine supervisor's decision: degraded, because `why`
  /// (for /health). The reason is set first, so a reader that sees
  /// `degraded` finds it. The engine supervisor's thread (tests that stand
  /// in for it).
  void set_degraded(std::string why) {
    {
      std::lock_guard<std::mutex> guard(memory_mutex_);
      reason_ = std::move(why);
    }
    degraded = true;
  }
  /// Data parallel: makes `n` replicas' gauges. Once, before any actor
  /// runs (spawn_engine); with one replica there are none.
  void set_replicas(int32_t n) {
    for (int32_t i = 0; i < n; ++i)
      replicas_.push_back(std::make_unique<replica_gauges>());
  }
  int32_t num_replicas() const {
    return int32_t(replicas_.size());
  }
  /// Replica i's gauges (i < num_replicas()). Any thread.
  replica_gauges& replica(int32_t i) {
    return *replicas_.at(size_t(i));
  }
  const replica_gauges& replica(int32_t i) const {
    return *replicas_.at(size_t(i));
  }

  /// A scheduler's figures: replica -1 (the only one) writes the engine's
  /// directly; replica i writes its own and the engine's become the sums
  /// over all replicas. The scheduler's thread.
  void publish_load(int32_t replica, int32_t now_waiting, int32_t now_running, int32_t used,
                    int32_t total) {
    if (replica < 0 || replica >= num_replicas()) {
      waiting = now_waiting;
      running = now_running;
      kv_used_pages = used;
      kv_total_pages = total;
      return;
    }
    auto& g = *replicas_[size_t(replica)];
    g.waiting = now_waiting;
    g.running = now_running;
    g.kv_used_pages = used;
    g.kv_total_pages = total;
    // Summed under a lock: two replicas publishing at once would otherwise
    // each store a sum missing the other's latest figures.
    std::lock_guard<std::mutex> guard(load_mutex_);
    int32_t w = 0, r = 0, u = 0, t = 0;
    for (const auto& x : replicas_) {
      w += x->waiting;
      r += x->running;
      u += x->kv_used_pages;
      t += x->kv_total_pages;
    }
    waiting = w;
    running = r;
    kv_used_pages = u;
    kv_total_pages = t;
  }

  /// Why the engine is degraded ("" while it is not). Any thread.
  std::string reason() const {
    std::lock_guard<std::mutex> guard(memory_mutex_);
    return reason_;
  }

  /// The runner's memory plan, set by the engine supervisor when an
  /// executor (re)starts; read by /metrics. Any thread.
  void set_memory_plan(std::vector<memory_plan_entry> plan) {
    std::lock_guard<std::mutex> guard(memory_mutex_);
    memory_plan_ = std::move(plan);
  }
  std::vector<memory_plan_entry> memory_plan() const {
    std::lock_guard<std::mutex> guard(memory_mutex_);
    return memory_plan_;
  }

  // Immutable after spawn_engine returns:
  std::string model_name;
  /// What the model is, from its folder's metronome.json; "" when it says
  /// nothing.
  std::string model_description;
  /// What the weights are (model_folder::weights_description): "bf16", or
  /// "int4 (RTN at load: awq, 4 bits, group 128; ...)" with model.quantize.
  std::string weights;
  int32_t max_model_len = 0;
  std::string device;
  std::string kv_cache_strategy;
  /// What a worker and its front end must share (worker_registry.hpp's
  /// model_fingerprint): the tokenizer and the model's shape.
  uint64_t model_fingerprint = 0;
  /// KV pages' size in tokens (engine.page_size).
  int32_t page_size = 0;

private:
  std::vector<std::unique_ptr<replica_gauges>> replicas_;
  std::mutex load_mutex_;
  mutable std::mutex memory_mutex_;
  std::vector<memory_plan_entry> memory_plan_;
  std::string reason_;
};

/// Handles of a running engine (their messages: actors/interfaces.hpp).
struct engine {
  /// Send generate_request here; the sender is the request's sink.
  frontend_actor frontend;
  /// Replica 0's scheduler (the only one without data parallelism); null
  /// in a front end without local replicas (engine_options::workers_only).
  scheduler_actor scheduler;
  /// Every replica's scheduler, replica 0's first.
  std::vector<scheduler_actor> schedulers;
  /// Data parallel: the router in front of the schedulers; null with one
  /// replica.
  replica_router_actor router;
  /// Owns the scheduler, the executor and the watchers below: stopping it
  /// stops them all (engine_supervisor.hpp).
  engine_supervisor_actor supervisor;
  /// Where workers attach (workers.listen; null without), and its port.
  worker_registry_actor workers;
  uint16_t worker_port = 0;
  /// The drift supervisor (null unless a latency-aware policy runs).
  drift_supervisor_actor drift_supervisor;
  /// Writes the stats line (null when options.stats_interval is 0).
  stats_reporter_actor stats_reporter;
  /// The fp8_e5m2 KV cache's overflow supervision (null with another
  /// kv_cache_dtype, or data parallel).
  kv_precision_supervisor_actor kv_precision_supervisor;
  std::shared_ptr<engine_status> status;
  std::shared_ptr<engine_metrics> metrics;
  std::shared_ptr<const tokenizer> tokens;
  /// The chat template requests are rendered with (POST /tokenize renders
  /// with it too). Immutable, any thread.
  std::shared_ptr<const chat_template> chat;

  /// Stops all actors of the engine: the frontend and the supervisor, which
  /// takes its tree down with it (requests in flight get generation_error
  /// unavailable). Call from any thread.
  void shutdown() const;
};

/// The replicas' devices of `o` (o.devices, or o.device alone), checked:
/// all cpu or all cuda (std::invalid_argument otherwise). Any thread.
std::vector<std::string> replica_devices(const engine_options& o);

/// Replica i's share of device memory: `fraction` divided by the number of
/// replicas on devices[i]'s device. Any thread.
double replica_memory_fraction(const std::vector<std::string>& devices, size_t i,
                               double fraction);

/// The Prometheus text for GET /metrics. Any thread, never blocks.
std::string render_metrics(const engine& e);

/// Opens the model folder (config, weights mapping, tokenizer, chat
/// template) on the calling thread, so configuration errors surface here as
/// model_error, then spawns the actors. Loading weights onto the device
/// happens on the executor's thread; status->ready tells when it is done.
engine spawn_engine(caf::actor_system& sys, engine_options options);

} // namespace metronome
