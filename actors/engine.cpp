#include "actors/engine.hpp"

#include <fstream>
#include <random>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/engine_metrics.hpp"
#include "actors/kv_precision_supervisor.hpp"
#include "actors/replica_router_actor.hpp"
#include "actors/stats_reporter.hpp"
#include "actors/request_actor.hpp"
#include "actors/scheduler_actor.hpp"
#include "actors/worker_registry.hpp"
#include "caf/io/middleman.hpp"
#include "config/config_scalar.hpp"
#include "model/model_card.hpp"
#include "model/model_error.hpp"
#include "model/model_weights.hpp"
#include "model/tensor_parallel.hpp"
#include "model/tokenizer/chat_template.hpp"
#include "model/tokenizer/tokenizer.hpp"
#include "gpu/cuda_runner.hpp"

namespace metronome {

namespace {

/// EOS ids of config.json and generation_config.json together.
std::vector<int32_t> eos_ids(const model_folder& model, const tokenizer& tok) {
  auto ids = model.config.eos_token_ids;
  auto gen_path = model.dir / "generation_config.json";
  if (std::ifstream in(gen_path); in) {
    try {
      auto doc = nlohmann::json::parse(in);
      auto e = doc.value("eos_token_id", nlohmann::json());
      if (e.is_number_integer())
        ids.push_back(e.get<int32_t>());
      else if (e.is_array())
        for (const auto& x : e)
          if (x.is_number_integer())
            ids.push_back(x.get<int32_t>());
    } catch (const nlohmann::json::exception& ex) {
      throw model_error(gen_path.string(), "", std::string("malformed JSON: ") + ex.what());
    }
  }
  if (ids.empty() && tok.eos_id())
    ids.push_back(*tok.eos_id());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

/// The runner of o.device with `limits` (o.limits resolved: max_model_len,
/// and on the CPU kv_cache_tokens, as the engine fixed them). `sharing`:
/// the replicas on that device (data parallel), o.gpu_memory_fraction
/// already divided among them.
runner_factory device_runner(const engine_options& o, std::shared_ptr<const model_folder> model,
                             const engine_limits& limits, int32_t sharing = 1) {
  if (o.runner_factory)
    return o.runner_factory;
  if (o.device == "cpu")
    return [=, dtype = o.kv_cache_dtype] { return make_cpu_runner(model, limits, dtype); };
  if (o.device.starts_with("cuda")) {
    cuda_runner_options g;
    g.device = parse_cuda_device(o.device);
    if (g.device < 0)
      throw std::invalid_argument("device '" + o.device + "': expected cpu or cuda:N");
    // A missing device is refused here, at start: the executor would fail,
    // restart and leave a server up with a degraded engine.
    if (const std::string p = cuda_device_problem(g.device); !p.empty())
      throw std::invalid_argument("device '" + o.device + "': " + p);
    g.gpu_memory_fraction = o.gpu_memory_fraction;
    // Replicas sharing the device each plan their own share: the others'
    // memory is not theirs to count (cuda_runner_options::device_replicas).
    g.device_replicas = sharing;
    // The scheduler's limits: one step timeout, the runner's own wait for a
    // step ends where the scheduler's does.
    g.limits = limits;
    g.cuda_graphs = o.cuda_graphs;
    g.kv_cache_dtype = o.kv_cache_dtype;
    // Sequences the runner may hold: the running ones, plus as many finished
    // ones waiting to be released with the next plan.
    g.max_seqs = 2 * limits.max_batch_size;
    g.tensor_parallel = o.tensor_parallel;
    g.tensor_parallel_collective = o.tensor_parallel_collective;
    for (const auto& d : o.tensor_parallel_devices) {
      const int n = parse_cuda_device(d);
      if (n < 0)
        throw std::invalid_argument("model.tensor_parallel_devices: '" + d
                                    + "': expected cuda:N");
      if (const std::string p = cuda_device_problem(n); !p.empty())
        throw std::invalid_argument("model.tensor_parallel_devices: '" + d + "': " + p);
      g.tensor_parallel_devices.push_back(n);
    }
    return [=] { return make_cuda_runner(model, g); };
  }
  throw std::invalid_argument("device '" + o.device + "': expected cpu or cuda:N");
}

/// The shape part of the model fingerprint (worker_registry.hpp).
std::string model_shape(const model_config& c) {
  std::string out;
  for (int64_t x : {int64_t(c.vocab_size), int64_t(c.hidden_size), int64_t(c.intermediate_size),
                    int64_t(c.num_layers), int64_t(c.num_heads), int64_t(c.num_kv_heads),
                    int64_t(c.head_dim), int64_t(c.max_position_embeddings)})
    out += std::to_string(x) + ",";
  for (auto id : c.eos_token_ids)
    out += "e" + std::to_string(id);
  return out;
}

/// The bytes of the folder's tokenizer file ("" without one).
std::string tokenizer_bytes(const std::filesystem::path& dir) {
  for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
    std::ifstream in(dir / name, std::ios::binary);
    if (in)
      return std::string(std::istreambuf_iterator<char>(in), {});
  }
  return {};
}

} // namespace

std::vector<std::string> replica_devices(const engine_options& o) {
  auto devices = o.devices.empty() ? std::vector<std::string>{o.device} : o.devices;
  const bool cpu = devices.front() == "cpu";
  for (const auto& d : devices)
    if ((d == "cpu") != cpu)
      throw std::invalid_argument("model.devices: replicas run on the CPU or on CUDA devices, "
                                  "not both (got '" + devices.front() + "' and '" + d + "')");
  return devices;
}

double replica_memory_fraction(const std::vector<std::string>& devices, size_t i,
                               double fraction) {
  const auto sharing = std::count(devices.begin(), devices.end(), devices.at(i));
  return fraction / double(sharing);
}

engine spawn_engine(caf::actor_system& sys, engine_options o) {
  // Data parallel: one replica per entry; the checks below look at the
  // first device, which is of the same kind as all the others.
  const auto devices = replica_devices(o);
  o.device = devices.front();
  // A front end without replicas of its own reads the model's configuration
  // and tokenizer only: its workers load the weights.
  const int32_t replicas = o.workers_only ? 0 : int32_t(devices.size());
  if (o.workers_only && o.workers.listen.empty())
    throw std::invalid_argument("engine: no local replica and no workers.listen: nothing would "
                                "serve");
  auto model = model_folder::open(o.model_dir,
                                  {o.workers_only ? weight_quantization::none : o.quantize});
  auto tok = tokenizer::load(o.model_dir);
  auto chat = std::make_shared<const chat_template>(
    o.chat_template || o.chat_template_file.empty()
      ? chat_template::from_folder(o.model_dir, o.chat_template)
      : chat_template::from_file(o.model_dir, o.chat_template_file));
  const auto& cfg = model->config;
  if (tok->vocab_size() > cfg.vocab_size)
    throw model_error((o.model_dir / "tokenizer.json").string(), "",
                      "the tokenizer has " + std::to_string(tok->vocab_size())
                        + " tokens but the model's vocab_size is " + std::to_string(cfg.vocab_size));
  engine_limits& limits = o.limits;
  if (limits.page_size <= 0 || limits.max_batch_size <= 0 || limits.max_num_batched_tokens <= 0)
    throw std::invalid_argument("engine: page_size, max_batch_size and max_num_batched_tokens "
                                "must be positive");
  // The KV cache's element type is checked against the model here, before
  // any executor starts: a refusal inside the executor would only show as
  // restarts and a degraded engine.
  const std::string dtype(to_string(o.kv_cache_dtype));
  if (replicas > 0 && o.kv_cache_dtype == kv_cache_dtype_kind::fp8 && o.device == "cpu")
    throw std::invalid_argument("engine.kv_cache_dtype fp8 needs a CUDA device (device 'cpu' "
                                "keeps its KV cache in fp32)");
  // fp8_e5m2 on the CPU is the format's reference (cpu_engine::set_kv_dtype),
  // which rounds an fp32 cache: served there (its overflow supervision can
  // be driven end to end), it costs quality and saves no memory. CUDA keeps
  // it in e5m2 bytes (gpu/kv_e5m2.cuh).
  const bool e5m2_on_cpu = o.kv_cache_dtype == kv_cache_dtype_kind::fp8_e5m2 && o.device == "cpu";
  if (e5m2_on_cpu && replicas > 0)
    spdlog::warn("engine.kv_cache_dtype fp8_e5m2 on device 'cpu': the CPU engine rounds its "
                 "fp32 KV cache as fp8_e5m2 stores values (the format's reference, with its "
                 "overflow supervision) but keeps it fp32: it saves no memory");
  if (!e5m2_on_cpu)
    if (const std::string p = cuda_kv_cache_problem(cfg, o.kv_cache_dtype); !p.empty())
      throw std::invalid_argument("engine.kv_cache_dtype '" + dtype + "': " + p);

  // Tensor parallelism: a model that does not split (4-bit weights
  // included: whole words and groups a rank), refused here naming the
  // field, before any executor starts.
  if (replicas > 0 && o.tensor_parallel > 1) {
    if (!o.devices.empty())
      throw std::invalid_argument(
        "model.tensor_parallel is " + std::to_string(o.tensor_parallel)
        + " with data parallel replicas (model.data_parallel, model.devices): one replica "
          "split over ranks is supported, not several yet");
    if (o.device == "cpu")
      throw std::invalid_argument("model.tensor_parallel is " + std::to_string(o.tensor_parallel)
                                  + " but model.device is cpu: tensor parallelism splits the "
                                    "model over CUDA devices");
    // Each rank counts the overflows of its own kv heads, and only rank 0's
    // step output reaches the scheduler.
    if (o.kv_cache_dtype == kv_cache_dtype_kind::fp8_e5m2)
      throw std::invalid_argument("model.tensor_parallel is " + std::to_string(o.tensor_parallel)
                                  + " with engine.kv_cache_dtype fp8_e5m2: its overflow counts "
                                    "are not summed over ranks yet (use fp8 or bf16)");
    const tensor_parallel_plan plan(cfg, o.tensor_parallel,
                                    (o.model_dir / "config.json").string());
    spdlog::info("{}", plan.describe());
  }

  // A context longer than the model's: positions it was never trained on
  // (and RoPE tables it does not have). Refused here, naming both numbers.
  if (cfg.max_position_embeddings > 0 && limits.max_model_len > cfg.max_position_embeddings)
    throw std::invalid_argument(
      "model.max_model_len (--max-model-len) is " + std::to_string(limits.max_model_len)
      + " but the model's context is " + std::to_string(cfg.max_position_embeddings)
      + " tokens (max_position_embeddings in " + (o.model_dir / "config.json").string()
      + "); use at most " + std::to_string(cfg.max_position_embeddings) + ", or 0 for that");

  engine e;
  e.status = std::make_shared<engine_status>();
  e.tokens = tok;
  e.chat = chat;
  auto& st = *e.status;
  const auto card = read_model_card(o.model_dir);
  st.model_name = o.served_model_name;
  if (st.model_name.empty() && card)
    st.model_name = card->id;
  if (st.model_name.empty())
    st.model_name = o.model_dir.filename().string();
  if (st.model_name.empty())
    st.model_name = o.model_dir.parent_path().filename().string();
  if (card)
    st.model_description = card->description;
  st.weights = model->weights_description();
  if (model->quantized_at_load)
    spdlog::info("model.quantize int4: {} projections quantized at load, weights {}",
                 model->owned_projections.size(), st.weights);
  e.metrics = std::make_shared<engine_metrics>(st.model_name);
  st.device = o.device;
  // From here on the limits are resolved: the model's context for 0, and on
  // the CPU the KV cache's size, fixed here (cpu_kv_pages) so the runner
  // makes that many pages at every restart.
  limits.max_model_len = limits.max_model_len > 0 ? limits.max_model_len
                                                  : cfg.max_position_embeddings;
  if (replicas > 0 && o.device == "cpu") {
    const int64_t kv_tokens = int64_t(cpu_kv_pages(cfg, limits)) * limits.page_size;
    limits.kv_cache_tokens = kv_tokens;
    if (kv_tokens < limits.max_model_len) {
      spdlog::warn("KV cache holds {} tokens: max_model_len lowered from {}", kv_tokens,
                   limits.max_model_len);
      limits.max_model_len = int32_t(kv_tokens);
    }
  }
  st.max_model_len = limits.max_model_len;
  st.page_size = limits.page_size;
  st.model_fingerprint = model_fingerprint(tokenizer_bytes(o.model_dir), model_shape(cfg));
  st.kv_cache_strategy = to_string(o.kv) + ";page_size=" + std::to_string(limits.page_size)
                         + (o.device == "cpu" && !e5m2_on_cpu ? ";dtype=fp32" : ";dtype=" + dtype);

  if (replicas > 0 && o.faults.what == fault_injection::kind::device_fault && o.device == "cpu")
    throw std::invalid_argument("engine.fault_injection " + o.faults.to_string()
                                + ": a device fault needs a CUDA device (model.device cuda:N)");
  std::vector<runner_factory> factories;
  for (size_t i = 0; i < size_t(replicas); ++i) {
    auto oi = o;
    oi.device = devices[i];
    oi.gpu_memory_fraction = replica_memory_fraction(devices, i, o.gpu_memory_fraction);
    const auto sharing = int32_t(std::count(devices.begin(), devices.end(), devices[i]));
    factories.push_back(device_runner(oi, model, limits, sharing));
  }
  if (o.faults) {
    spdlog::warn("engine.fault_injection {}: every executor's step {} will fail on purpose (a "
                 "test setting: never set it in production)",
                 o.faults.to_string(), o.faults.after_steps + 1);
    for (auto& factory : factories)
      factory = [inner = std::move(factory), f = o.faults] { return with_faults(inner(), f); };
  }
  // Workers: slots after the local replicas, behind the same router.
  std::optional<host_port> worker_address;
  const int32_t worker_slots = o.workers.listen.empty() ? 0 : o.workers.max_workers;
  if (!o.workers.listen.empty()) {
    worker_address = parse_host_port(o.workers.listen);
    if (!worker_address)
      throw std::invalid_argument("workers.listen: expected HOST:PORT, got '" + o.workers.listen
                                  + "'");
    if (!sys.has_middleman())
      throw std::invalid_argument("workers.listen: this actor system has no middleman "
                                  "(load caf::io::middleman to accept workers)");
  }
  const int32_t slots = replicas + worker_slots;
  if (slots > 1) {
    st.set_replicas(slots);
    e.metrics->enable_replicas(slots);
    std::string list;
    for (const auto& d : devices)
      list += (list.empty() ? "" : ", ") + d;
    st.device = list;
    if (replicas > 1)
      spdlog::info("data parallel: {} replicas ({}) behind one router", replicas, list);
    if (worker_slots > 0)
      st.device += " + workers";
  }
  if (replicas == 0)
    st.device = "workers";
  scheduler_actor_config sc;
  sc.scheduler.limits = limits;
  sc.scheduler.prefix_caching = o.prefix_caching;
  sc.scheduler.kv = o.kv;
  sc.scheduler.kv_bucket_min_tokens = o.kv_bucket_min_tokens;
  sc.scheduler.kv_buckets_per_size = o.kv_buckets_per_size;
  sc.scheduler.groups = o.groups;
  // Per process: clients cannot aim hash collisions at it (and every match
  // is verified token by token; a restarted executor starts with no cache).
  sc.scheduler.cache_salt = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  sc.policy = o.policy;
  sc.eos_ids = eos_ids(*model, *tok);
  sc.policies = policy_context::make(o.predictor, o.ladb, o.srpt);
  if (!o.step_trace.empty()) {
    try {
      sc.trace = std::make_shared<step_trace>(o.step_trace);
    } catch (const std::exception& e) {
      throw std::runtime_error(std::string("logging.step_trace: ") + e.what());
    }
  }
  for (int32_t i = 0; i < replicas; ++i) {
    auto sci = sc;
    if (replicas > 1) {
      sci.replica = i;
      // Each replica's policies learn from its own requests, on its own
      // thread: nothing of theirs is shared.
      sci.policies = policy_context::make(o.predictor, o.ladb, o.srpt);
      if (i > 0)
        sci.trace = nullptr; // one writer: replica 0's steps only
    }
    e.schedulers.push_back(spawn_scheduler(sys, std::move(sci), e.status, e.metrics));
  }
  if (!e.schedulers.empty())
    e.scheduler = e.schedulers.front();
  if (slots > 1 || replicas == 0) {
    replica_router_config rc;
    rc.replicas = slots;
    rc.page_size = limits.page_size;
    rc.prefix_affinity = o.prefix_caching;
    e.router = spawn_replica_router(sys, rc, e.schedulers, e.status, e.metrics, worker_slots);
  }
  if (worker_slots > 0) {
    worker_registry_config wc;
    wc.first_slot = replicas;
    wc.slots = worker_slots;
    wc.heartbeat = o.workers.heartbeat;
    wc.timeout = o.workers.timeout;
    wc.model_fingerprint = st.model_fingerprint;
    wc.model_name = st.model_name;
    wc.max_model_len = st.max_model_len;
    e.workers = spawn_worker_registry(sys, wc, e.router, e.status, e.metrics);
    auto port = sys.middleman().publish(e.workers, worker_address->port,
                                        worker_address->host.c_str(), true);
    if (!port) {
      caf::anon_send_exit(e.workers, caf::exit_reason::user_shutdown);
      caf::anon_send_exit(e.router, caf::exit_reason::user_shutdown);
      for (auto& sched : e.schedulers)
        caf::anon_send_exit(sched, caf::exit_reason::user_shutdown);
      throw std::runtime_error("workers.listen " + o.workers.listen
                               + ": cannot listen: " + sys.render(port.error()));
    }
    e.worker_port = *port;
    spdlog::info("workers attach at {}:{} (up to {}, heartbeat {} ms, timeout {} ms)",
                 worker_address->host, *port, worker_slots, o.workers.heartbeat.count(),
                 o.workers.timeout.count());
  }
  if (replicas > 1) {
    if (o.drift.enabled && o.policy != policy_kind::fcfs)
      spdlog::info("data parallel: drift supervision is off (it watches one scheduler)");
    if (sc.trace)
      spdlog::info("data parallel: logging.step_trace records replica 0's steps only");
  } else if (replicas == 1 && o.drift.enabled && o.policy != policy_kind::fcfs)
    e.drift_supervisor = spawn_drift_supervisor(
      sys, e.scheduler, {o.drift, o.policy, policy_kind::fcfs}, e.metrics);
  // The fp8_e5m2 cache's overflow supervision: one scheduler to watch (data
  // parallel would need one supervisor per replica; not yet), whose runner
  // keeps full-precision pages beside fp8 ones (the CPU's; not CUDA's yet).
  if (replicas == 1 && e5m2_on_cpu)
    e.kv_precision_supervisor
      = spawn_kv_precision_supervisor(sys, e.scheduler, o.kv_overflow, e.metrics);
  else if (replicas > 1 && o.kv_cache_dtype == kv_cache_dtype_kind::fp8_e5m2)
    spdlog::warn("data parallel: the fp8_e5m2 KV overflow supervision is off (it watches one "
                 "scheduler); overflows are only counted");
  else if (replicas == 1 && o.kv_cache_dtype == kv_cache_dtype_kind::fp8_e5m2)
    spdlog::warn("engine.kv_cache_dtype fp8_e5m2 on {}: overflows are counted "
                 "(metronome:kv_overflow_values_total) and kept saturated; re-materialising "
                 "in full precision needs bf16 pages beside the fp8 ones, which the CUDA "
                 "runner does not keep yet (engine.kv_overflow does not act)",
                 o.device);
  if (o.stats_interval.count() > 0)
    e.stats_reporter = spawn_stats_reporter(sys, e.scheduler.address(), e.metrics, e.status,
                                            o.stats_interval);
  engine_supervision supervision;
  supervision.restarts = o.restarts;
  supervision.on_device_lost = o.on_device_lost;
  engine_children children{e.scheduler, e.drift_supervisor, e.stats_reporter, {}, e.router,
                           e.workers, e.kv_precision_supervisor};
  if (e.schedulers.size() > 1)
    children.more_schedulers.assign(e.schedulers.begin() + 1, e.schedulers.end());
  e.supervisor = spawn_engine_supervisor(sys, std::move(children), std::move(factories),
                                         std::move(supervision), e.status);
  auto ctx = std::make_shared<request_context>();
  // One replica: no router, the request actors talk to its scheduler.
  if (e.router)
    ctx->scheduler = e.router;
  else
    ctx->scheduler = e.scheduler;
  ctx->tokens = tok;
  ctx->chat = chat;
  ctx->status = e.status;
  ctx->metrics = e.metrics;
  ctx->max_model_len = st.max_model_len;
  ctx->vocab_size = cfg.vocab_size;
  ctx->default_timeout = o.request_timeout;
  e.frontend = spawn_frontend(sys, std::shared_ptr<const request_context>(ctx));
  return e;
}

void engine::shutdown() const {
  auto stop = [](const auto& a) {
    if (a)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  };
  stop(frontend);
  stop(supervisor); // and through its links the scheduler, executor and watchers
}

std::string render_metrics(const engine& e) {
  return e.metrics->render(*e.status);
}

} // namespace metronome
