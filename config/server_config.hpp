#pragma once
// The configuration of a whole Metronome server as plain C++ values: one
// struct per section of metronome.yaml, each member initialised to its
// default, so `server_config{}` is the configuration of `metronome serve`
// with no file and no flags. config_loader.hpp reads YAML and command-line
// overrides into it; config_schema.hpp lists every key with its range.
//
// The `batching`, `predictor` and `router` sections are those of the original
// system's ladb_config.yaml; `supervisor` holds the drift and executor
// supervisors' windows and thresholds.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/dtype.hpp" // kv_cache_dtype_kind, shared with the engine and the runners
#include "model/weight_quantization.hpp" // model.quantize, shared with the loader

namespace metronome {

// -- value types -----------------------------------------------------------------

/// Where the model runs.
enum class device_kind : uint8_t { cpu, cuda };

/// A device as written in the config: "cpu" or "cuda:N".
struct device_spec {
  device_kind kind = device_kind::cpu;
  /// The CUDA ordinal; 0 for the CPU.
  int32_t index = 0;

  /// Parses "cpu" or "cuda:N" (N a decimal ordinal in [0, 63]); nullopt on
  /// anything else.
  static std::optional<device_spec> parse(std::string_view text);

  /// "cpu" or "cuda:N".
  std::string to_string() const;

  bool operator==(const device_spec&) const = default;
};

/// The chat formats model.chat_template may name; any other value but ""
/// is the path of a Jinja template file.
inline constexpr std::array<std::string_view, 4> chat_template_names = {"llama3", "llama2",
                                                                        "mistral", "chatml"};

/// `name` is one of chat_template_names.
bool is_chat_template_name(std::string_view name);

/// The scheduler's admission policy (issue 6 adds ladb and srpt).
enum class scheduling_policy : uint8_t { fcfs, ladb, srpt, ladb_literal };

/// How KV pages are granted: on demand (paged), or reserved buckets with
/// overflow into pages (bucketed; sched/kv_buckets.hpp).
enum class kv_strategy_kind : uint8_t { paged, bucketed };

/// The order in which LADB's router releases admitted requests.
enum class queue_strategy_kind : uint8_t { priority_by_remaining_steps, fcfs };

/// What LADB does with a request that has waited `router.timeout_ms`.
enum class fallback_policy_kind : uint8_t { immediate_dispatch, wait };

/// Log verbosity, as spdlog names it.
enum class log_level : uint8_t { trace, debug, info, warn, error };

/// How log lines are written: text, or one JSON object a line.
enum class log_format_kind : uint8_t { text, json };

/// The YAML spelling of each value.
std::string_view to_string(scheduling_policy x);
std::string_view to_string(kv_strategy_kind x);
std::string_view to_string(queue_strategy_kind x);
std::string_view to_string(fallback_policy_kind x);
std::string_view to_string(log_level x);
std::string_view to_string(log_format_kind x);

/// Parses a YAML spelling; nullopt when `text` is none of them.
std::optional<scheduling_policy> parse_scheduling_policy(std::string_view text);

// -- sections --------------------------------------------------------------------

/// `server`: the network front door and its limits.
struct server_section {
  std::string host = "127.0.0.1";
  /// 0 binds any free port (the server prints the one it got).
  int32_t port = 8080;
  /// Larger request bodies get 413.
  int64_t max_body_bytes = int64_t{1} << 20;
  /// Requests waiting for admission beyond this get 429 with Retry-After.
  int32_t max_queued_requests = 1024;
  /// The Retry-After header of a 429, in seconds.
  int32_t retry_after_s = 1;
  /// A request still unfinished after this long is cancelled with an error.
  double request_timeout_s = 600.0;
  /// Larger WebSocket messages close the connection with 1009.
  int64_t max_ws_message_bytes = int64_t{1} << 20;
  /// Threads running the Asio io_context.
  int32_t io_threads = 2;
  /// Requests in flight at once on one WebSocket connection.
  int32_t max_concurrent_streams_per_connection = 64;
  /// Open client connections (HTTP and WebSocket) at once; more get 503
  /// with Retry-After. 0 sizes it from the file descriptor limit
  /// (RLIMIT_NOFILE), leaving headroom for the process's other files.
  int32_t max_connections = 0;
  /// A keep-alive connection that starts no new request for this long is
  /// closed; a WebSocket that answers no ping for this long is dropped.
  double idle_timeout_s = 120.0;
  /// A request's headers and body must arrive within this many seconds of
  /// its first byte (slow, trickling clients are closed).
  double header_timeout_s = 30.0;
  /// An HTTP response write that makes no progress for this long closes
  /// the connection (a client that stopped reading its SSE stream).
  double write_timeout_s = 60.0;
  /// On SIGTERM/SIGINT, running requests get this long to finish before
  /// they are ended with an error.
  double drain_timeout_s = 30.0;

  // -- access (docs/reliability.md, "Security") ----------------------------------

  /// Keys clients must present (Authorization: Bearer KEY) on every route
  /// but /health; empty together with api_keys_file and METRONOME_API_KEY:
  /// no key is needed.
  std::vector<std::string> api_keys;
  /// A file holding more keys, one per line ('#' starts a comment); read at
  /// start. Empty: none.
  std::string api_keys_file;
  /// GET /metrics answers without a key (a scraper on a trusted network).
  bool metrics_without_key = false;
  /// GET / serves the chat page (docs/protocol.md, "The chat page").
  bool chat_page = true;
  /// Browser origins ("https://app.example.com", or "*" for any) allowed to
  /// call the API and open /v1/ws besides the server's own; empty: none.
  std::vector<std::string> allowed_origins;
  /// Host header values accepted besides the bound address and localhost
  /// names: exact names, ".example.com" for a domain and its subdomains, or
  /// "*" (no check).
  std::vector<std::string> allowed_hosts;

  /// `server.tls`: HTTPS and wss:// when both files are set.
  struct tls_section {
    /// PEM certificate chain (the server's certificate first).
    std::string cert_file;
    /// PEM private key of the certificate.
    std::string key_file;

    bool operator==(const tls_section&) const = default;
  };
  tls_section tls;

  bool operator==(const server_section&) const = default;
};

/// `model`: what is served and where.
struct model_section {
  /// A Hugging Face folder; empty serves the model that ships with Metronome.
  std::string path;
  device_spec device;
  /// Data parallel: one replica of the model per entry ("cpu" or "cuda:N",
  /// all of one kind; a device listed twice holds two replicas, each with
  /// half of engine.gpu_memory_fraction). Empty: model.data_parallel
  /// replicas on model.device.
  std::vector<std::string> devices;
  /// Data parallel: replicas of the model behind one router, each with its
  /// own scheduler, executor and KV cache (docs/scale-out.md); 0: none in
  /// this process, only workers serve (workers.listen).
  int32_t data_parallel = 1;
  /// The `model` name clients send and /v1/models lists; empty = folder name.
  std::string served_model_name;
  /// How chat messages become a prompt: "" = the Jinja template in the
  /// folder's tokenizer_config.json; one of chat_template_names; or the
  /// path of a Jinja template file whose format Metronome recognises
  /// (checked when the engine starts).
  std::string chat_template;
  /// Longest prompt + output in tokens; 0 = the model's
  /// max_position_embeddings.
  int32_t max_model_len = 0;
  /// int4: quantize a float checkpoint's projections when it is loaded
  /// (round to nearest, AWQ layout, group 128; model/rtn_quantize.hpp).
  weight_quantization quantize = weight_quantization::none;
  /// Tensor parallel: ranks the one model is split over (its attention
  /// heads and MLP features; docs/scale-out.md), one per CUDA device from
  /// model.device on (cuda:N ... cuda:N+ranks-1) unless
  /// tensor_parallel_devices lists them. 1: not split.
  int32_t tensor_parallel = 1;
  /// The ranks' devices, one per rank ("cuda:N"); a device listed k times
  /// holds k ranks, each with 1/k of engine.gpu_memory_fraction (peer
  /// collective only). Empty: consecutive devices from model.device.
  std::vector<std::string> tensor_parallel_devices;
  /// How ranks sum their partial outputs: auto (peer when every rank is on
  /// one device, else nccl), nccl, or peer (gpu/collective.hpp).
  std::string tensor_parallel_collective = "auto";

  bool operator==(const model_section&) const = default;
};

/// `engine.kv_overflow`: the overflow supervision of an fp8_e5m2 KV cache
/// (sched/kv_precision_controller.hpp): a request whose keys or values
/// overflow is re-materialised in bf16 at most max_rematerializations
/// times within window_s; the next overflow gives new requests bf16 KV for
/// cooldown_s.
struct kv_overflow_section {
  int32_t max_rematerializations = 3;
  double window_s = 60.0;
  double cooldown_s = 300.0;

  bool operator==(const kv_overflow_section&) const = default;
};

/// `engine`: continuous batching and the KV cache.
struct engine_section {
  /// Cap on running sequences (vLLM's max_num_seqs).
  int32_t max_batch_size = 128;
  /// Token budget of one step: decodes (one token each) plus prefill chunks.
  int32_t max_num_batched_tokens = 2048;
  /// Tokens per KV page; a power of two.
  int32_t page_size = 16;
  /// KV capacity in tokens; 0 sizes it from the device's memory.
  int64_t kv_cache_tokens = 0;
  /// Share of GPU memory Metronome may use (weights, activations, KV).
  double gpu_memory_fraction = 0.9;
  /// Capture decode steps as CUDA graphs (ignored on the CPU).
  bool cuda_graphs = true;
  /// Reuse the KV pages of identical prompt prefixes across requests.
  bool prefix_caching = true;
  /// Element type of the KV cache; fp8 needs a CUDA device (the CPU keeps
  /// its KV cache in fp32 whatever this says, and refuses fp8 at start).
  kv_cache_dtype_kind kv_cache_dtype = kv_cache_dtype_kind::bf16;
  /// engine.kv_strategy, and the buckets of bucketed: classes of 1, 2, 4
  /// and 8 times kv_bucket_min_tokens, kv_buckets_per_size of each.
  kv_strategy_kind kv_strategy = kv_strategy_kind::paged;
  int32_t kv_bucket_min_tokens = 4096;
  int32_t kv_buckets_per_size = 32;
  /// engine.kv_overflow: the fp8_e5m2 cache's overflow supervision.
  kv_overflow_section kv_overflow;
  scheduling_policy policy = scheduling_policy::ladb;
  /// A step running longer fails the executor (the supervisor restarts it).
  int64_t step_timeout_ms = 30000;
  /// Largest prefill chunk of one sequence in one step; 0 = the step's token
  /// budget.
  int32_t prefill_chunk_tokens = 0;
  /// Tests and drills only: "none", or "<kind>_after:N" (kind throw, hang,
  /// device_error, device_lost) makes every executor's step N + 1 fail so
  /// (model/fault_injection.hpp, docs/reliability.md).
  std::string fault_injection = "none";

  bool operator==(const engine_section&) const = default;
};

/// `batching` (ladb_config.yaml): cohort sizes and the hold window.
struct batching_section {
  /// Largest cohort LADB admits at once.
  int32_t max_batch_size = 32;
  /// A cohort is dispatched once it has this many requests.
  int32_t min_batch_size = 4;
  /// The longest a step carrying prompt work may take (ladb's stall-free
  /// steps cut prompt chunks to fit; never below the decodes' own time).
  int64_t target_latency_ms = 500;
  /// A step carrying prompt work may take this many times its decodes alone.
  double step_time_factor = 4.0;
  /// Share of steps that may run a prompt past that limit.
  double long_step_share = 0.05;
  /// Predictions within this relative distance form one cohort.
  double variance_tolerance = 0.2;
  /// The adaptive hold window's bounds.
  int64_t min_hold_ms = 50;
  int64_t max_hold_ms = 120;
  /// Token-aware grouping's bounds of generated tokens ("32,128": groups
  /// 0-32, 33-128, 129+; sched/token_groups.hpp); "" = off.
  std::string token_groups;

  bool operator==(const batching_section&) const = default;
};

/// `predictor` (ladb_config.yaml): the remaining-steps estimator.
struct predictor_section {
  /// Saved predictor state to start from; empty = the cold-start rule.
  std::string model_path;
  /// Completed requests seen before the learned model replaces the rule.
  int32_t warmup_steps = 100;
  /// How often the learned model is refitted.
  int64_t update_interval_ms = 1000;
  /// max_decode_steps = prediction x this; running past it re-classifies.
  double max_steps_factor = 1.2;
  /// Cold start: steps = prompt_tokens x slope + intercept.
  double cold_start_slope = 0.8;
  double cold_start_intercept = 5.0;

  bool operator==(const predictor_section&) const = default;
};

/// `router` (ladb_config.yaml): queue order and timeouts.
struct router_section {
  queue_strategy_kind queue_strategy = queue_strategy_kind::priority_by_remaining_steps;
  /// A request waiting this long gets the fallback policy.
  int64_t timeout_ms = 250;
  fallback_policy_kind fallback_policy = fallback_policy_kind::immediate_dispatch;
  /// srpt: a request waiting this long is promoted to the front.
  int64_t srpt_promote_after_ms = 150;

  bool operator==(const router_section&) const = default;
};

/// `supervisor.drift`: when LADB is switched off because predictions drift.
struct drift_supervisor_section {
  bool enabled = true;
  /// Rolling window over which the mean relative error is measured.
  double window_s = 300.0;
  /// Mean |predicted - actual| / actual above this counts as drift.
  double error_threshold = 0.3;
  /// Drift must last this long before LADB is disabled.
  double sustain_s = 300.0;
  /// How long the scheduler runs fcfs before LADB is re-enabled.
  double disable_s = 300.0;
  /// Completed requests in the window before drift is judged at all.
  int32_t min_samples = 50;

  bool operator==(const drift_supervisor_section&) const = default;
};

/// `supervisor.executor`: restarts of a failed executor.
struct executor_supervisor_section {
  /// One failure more than this within restart_window_s leaves the engine
  /// degraded: no restart, requests fail fast, /health answers 503.
  int32_t max_restarts = 5;
  double restart_window_s = 60.0;

  bool operator==(const executor_supervisor_section&) const = default;
};

/// `supervisor`.
struct supervisor_section {
  drift_supervisor_section drift;
  executor_supervisor_section executor;

  bool operator==(const supervisor_section&) const = default;
};

/// `logging`.
struct logging_section {
  log_level level = log_level::info;
  /// Text lines, or one JSON object a line (docs/operations.md).
  log_format_kind format = log_format_kind::text;
  /// The engine's stats line comes every this many seconds while it has
  /// work; 0: never.
  double stats_interval_s = 10.0;
  /// Access lines also carry each request's prompt and output (escaped, cut
  /// at 8 KiB). Off: no prompt or output text is ever logged.
  bool log_prompts = false;
  /// A CSV file of every engine step (shape, predicted and measured time:
  /// docs/operations.md); empty: none.
  std::string step_trace;

  bool operator==(const logging_section&) const = default;
};

/// `workers`: replicas in other processes (`metronome worker`,
/// docs/scale-out.md). The front end (`serve`) listens for them; a worker
/// connects to it.
struct workers_section {
  /// serve: where workers attach, HOST:PORT (CAF's middleman over TCP; no
  /// authentication: a loopback or private address). Empty: no workers.
  std::string listen;
  /// worker: the front end's workers.listen address, HOST:PORT.
  std::string connect;
  /// worker: its name in the front end's logs and /metrics; empty:
  /// HOSTNAME:PID.
  std::string name;
  /// serve: workers attached at most (each a replica slot in /metrics).
  int32_t max_workers = 8;
  /// Both: how often the front end asks each worker for its load (its
  /// heartbeat), and the idle interval of CAF's own connection heartbeat.
  int32_t heartbeat_ms = 500;
  /// Both: a worker that answers no heartbeat (and sends nothing) for this
  /// long is removed; its requests are re-run elsewhere or fail.
  int32_t timeout_ms = 3000;

  bool operator==(const workers_section&) const = default;
};

// -- the whole configuration -----------------------------------------------------

/// Everything one metronome.yaml configures. Built on the main thread before
/// the actor system starts, then copied into actors by value.
struct server_config {
  server_section server;
  model_section model;
  engine_section engine;
  batching_section batching;
  predictor_section predictor;
  router_section router;
  supervisor_section supervisor;
  logging_section logging;
  workers_section workers;

  bool operator==(const server_config&) const = default;
};

/// Checks the rules that tie several keys together (min <= max, budgets that
/// must hold a whole batch, ...). Per-key types and ranges are checked when a
/// value is set (config_loader.hpp). Throws config_error naming `source` and
/// the first offending key.
void validate(const server_config& cfg, const std::string& source);

} // namespace metronome
