#include "actors/engine_metrics.hpp"

#include <algorithm>

#include "actors/engine.hpp"

namespace metronome {

namespace {

// Bucket bounds: vLLM's, extended downwards where Metronome aims lower.
std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
          2.5,   5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}

std::vector<double> itl_buckets() {
  return {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
          0.2,   0.3,    0.4,   0.5,    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
}

std::vector<double> request_buckets() {
  return {0.01, 0.025, 0.05, 0.1,  0.3,  0.5,  0.8,   1.0,   1.5,   2.0,   2.5,   5.0,  10.0,
          15.0, 20.0,  30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

/// Token counts of one request: powers of two up to 128k, with 1.5x steps
/// between (vLLM's request_prompt_tokens uses 1, 2, 5 steps).
std::vector<double> token_buckets() {
  std::vector<double> b;
  for (double x = 1; x <= 131072; x *= 2) {
    b.push_back(x);
    if (x >= 4)
      b.push_back(x * 1.5);
  }
  return b;
}

std::vector<double> batch_buckets() {
  return {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512};
}

std::vector<double> ratio_buckets() {
  return {0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
}

/// The constant labels of the metrics vLLM labels with the model's name.
prometheus::label_set model_label(const std::string& model_name) {
  return {{"model_name", model_name}};
}

} // namespace

engine_metrics::engine_metrics(const std::string& model_name)
  : ttft_(registry_.add_histogram("metronome:time_to_first_token_seconds",
                                  "Time from arrival to the first output token, per request.",
                                  ttft_buckets(), model_label(model_name))),
    itl_(registry_.add_histogram("metronome:inter_token_latency_seconds",
                                 "Time between consecutive output tokens of a request.",
                                 itl_buckets(), model_label(model_name))),
    e2e_(registry_.add_histogram("metronome:e2e_request_latency_seconds",
                                 "Time from arrival to the last output token, per request.",
                                 request_buckets(), model_label(model_name))),
    queue_(registry_.add_histogram("metronome:request_queue_time_seconds",
                                   "Time from arrival to the first scheduled step, per request.",
                                   request_buckets(), model_label(model_name))),
    batch_size_(registry_.add_histogram("metronome:batch_size",
                                        "Sequences in each engine step.", batch_buckets())),
    batch_efficiency_(registry_.add_histogram(
      "metronome:batch_efficiency_ratio",
      "Sequences in each engine step over the configured max_batch_size.", ratio_buckets())),
    step_time_(registry_.add_histogram("metronome:step_duration_seconds",
                                       "Wall time of each engine step on the device.",
                                       itl_buckets())),
    computed_tokens_(registry_.add_counter(
      "metronome:step_computed_tokens_total",
      "Tokens computed by engine steps, prompt and output (throughput as it happens).")),
    sampled_tokens_(registry_.add_counter("metronome:step_sampled_tokens_total",
                                          "Output tokens sampled by engine steps.")),
    prompt_tokens_(registry_.add_counter("metronome:prompt_tokens_total",
                                         "Prompt tokens of finished requests.",
                                         model_label(model_name))),
    generation_tokens_(registry_.add_counter("metronome:generation_tokens_total",
                                             "Output tokens of finished requests.",
                                             model_label(model_name))),
    preemptions_(registry_.add_counter("metronome:num_preemptions_total",
                                       "Requests preempted for lack of KV pages.",
                                       model_label(model_name))),
    restarts_(registry_.add_counter("metronome:executor_restarts_total",
                                    "Executor failures handled by its supervisor.")),
    finished_(registry_.add_counter_family("metronome:request_success_total",
                                           "Requests that ended, by finish reason.",
                                           {"finished_reason"}, model_label(model_name))),
    cancelled_(registry_.add_counter("metronome:request_cancelled_total",
                                     "Requests cancelled by their client (stop, disconnect)",
                                     model_label(model_name))),
    request_prompt_tokens_(registry_.add_histogram("metronome:request_prompt_tokens",
                                                   "Prompt tokens of each finished request.",
                                                   token_buckets(), model_label(model_name))),
    request_generation_tokens_(registry_.add_histogram(
      "metronome:request_generation_tokens", "Output tokens of each finished request.",
      token_buckets(), model_label(model_name))),
    prefill_time_(registry_.add_histogram(
      "metronome:request_prefill_time_seconds",
      "Time from a request's first scheduled step to its first token.", request_buckets(),
      model_label(model_name))),
    decode_time_(registry_.add_histogram("metronome:request_decode_time_seconds",
                                         "Time from a request's first token to its last.",
                                         request_buckets(), model_label(model_name))),
    build_info_(registry_.add_gauge_family("metronome:build_info",
                                           "1, labelled with the build's version and whether "
                                           "it has CUDA.",
                                           {"version", "cuda"})),
    errors_(registry_.add_counter_family("metronome:request_errors_total",
                                         "Requests that failed, by error code.", {"code"},
                                         model_label(model_name))),
    http_responses_(registry_.add_counter_family(
      "metronome:http_responses_total",
      "Responses by route (the API's routes; anything else is other) and status code.",
      {"route", "status"})),
    policy_switches_(registry_.add_counter_family("metronome:policy_switches_total",
                                                  "Scheduling policy switches, by target policy "
                                                  "and cause.",
                                                  {"policy", "cause"})),
    kv_precision_events_(registry_.add_counter_family(
      "metronome:kv_precision_events_total",
      "Transitions of the fp8_e5m2 KV cache's overflow supervision: an overflowing request "
      "rematerialized in bf16 or kept with saturated values, a cool-down started or ended.",
      {"event"})),
    kv_precision_mode_(registry_.add_gauge_family(
      "metronome:kv_precision_mode",
      "1 for the KV element type new requests get now (fp8_e5m2, or bf16 during an overflow "
      "cool-down), 0 for the other; absent unless the KV cache is fp8_e5m2.",
      {"mode"})),
    reruns_(registry_.add_counter("metronome:request_reruns_total",
                                  "Requests admitted again because the worker running them was "
                                  "lost before their first token.",
                                  model_label(model_name))),
    worker_events_(registry_.add_counter_family("metronome:worker_events_total",
                                                "Workers (replicas in other processes) that "
                                                "joined, were lost or were refused.",
                                                {"event"})),
    scheduling_events_(registry_.add_counter_family(
      "metronome:scheduling_events_total",
      "Decisions of the latency-aware policies, by kind (limited_step, long_step, relaxed_step, "
      "promotion, reclassification, timeout_dispatch), and of token-aware grouping "
      "(group_admission, group_preemption, group_decode).",
      {"kind"})),
    step_model_(registry_.add_gauge_family(
      "metronome:step_time_model_scale",
      "Measured step time over the step-time model's prior, by part (decode, prefill).",
      {"part"})),
    prefix_queries_(registry_.add_counter(
      "metronome:prefix_cache_queries_total",
      "Prompt tokens looked up in the prefix cache at admissions.", model_label(model_name))),
    prefix_hits_(registry_.add_counter("metronome:prefix_cache_hits_total",
                                       "Prompt tokens found in the prefix cache (not computed).",
                                       model_label(model_name))),
    prefix_pages_(registry_.add_gauge("metronome:prefix_cache_pages",
                                      "KV pages the prefix cache names (in use or kept).")),
    bucket_admissions_(registry_.add_counter(
      "metronome:kv_bucket_admissions_total",
      "Admissions into a reserved KV bucket (engine.kv_strategy bucketed).")),
    bucket_overflows_(registry_.add_counter(
      "metronome:kv_bucket_overflows_total",
      "Bucketed admissions that found no free bucket and took plain pages.")),
    kv_overflow_values_(registry_.add_counter(
      "metronome:kv_overflow_values_total",
      "Key and value elements the fp8_e5m2 KV cache could not store: saturated past their "
      "window's range, or not finite.")),
    reserved_unused_(registry_.add_gauge(
      "metronome:kv_bucket_reserved_unused_pages",
      "KV pages buckets hold reserved for their requests but not yet used.")),
    kv_usage_(registry_.add_gauge("metronome:kv_cache_usage_perc",
                                  "Fraction of KV cache pages in use (0 to 1).",
                                  model_label(model_name))),
    running_(registry_.add_gauge("metronome:num_requests_running",
                                 "Requests with sequences in the engine.",
                                 model_label(model_name))),
    waiting_(registry_.add_gauge("metronome:num_requests_waiting",
                                 "Requests waiting for admission.", model_label(model_name))),
    live_actors_(registry_.add_gauge("metronome:request_actors_alive",
                                     "Request actors alive (one per request in the server).")),
    ready_(registry_.add_gauge("metronome:engine_ready",
                               "1 once the model is loaded and the executor runs.")),
    memory_(registry_.add_gauge_family("metronome:memory_bytes",
                                       "The runner's memory plan at start-up, by part (weights, "
                                       "activations, graphs, kv_pool, ...).",
                                       {"part"})),
    process_(registry_) {
#ifdef METRONOME_HAVE_CUDA
  const char* cuda = "yes";
#else
  const char* cuda = "no";
#endif
  build_info_.with({METRONOME_VERSION, cuda}).set(1);
}

void engine_metrics::on_step(int32_t num_seqs, int32_t max_batch_size, int64_t num_tokens,
                             int64_t sampled_tokens, double seconds) {
  if (num_tokens > 0)
    computed_tokens_.inc(double(num_tokens));
  if (sampled_tokens > 0)
    sampled_tokens_.inc(double(sampled_tokens));
  batch_size_.observe(num_seqs);
  if (max_batch_size > 0)
    batch_efficiency_.observe(double(num_seqs) / max_batch_size);
  step_time_.observe(seconds);
}

void engine_metrics::on_first_token(double queue_s, double ttft_s) {
  queue_.observe(queue_s);
  ttft_.observe(ttft_s);
}

void engine_metrics::on_token_gap(double seconds) {
  itl_.observe(seconds);
}

void engine_metrics::on_finish(finish_kind reason, double e2e_s, int32_t prompt_tokens,
                               int32_t completion_tokens, double queue_s, double ttft_s) {
  // The tokens were computed either way (throughput counts them).
  prompt_tokens_.inc(prompt_tokens);
  generation_tokens_.inc(completion_tokens);
  if (reason == finish_kind::cancelled) {
    cancelled_.inc();
    return;
  }
  finished_.with({std::string(to_string(reason))}).inc();
  e2e_.observe(e2e_s);
  request_prompt_tokens_.observe(prompt_tokens);
  request_generation_tokens_.observe(completion_tokens);
  if (completion_tokens > 0) {
    prefill_time_.observe(std::max(0.0, ttft_s - queue_s));
    decode_time_.observe(std::max(0.0, e2e_s - ttft_s));
  }
}

void engine_metrics::on_error(const std::string& code) {
  errors_.with({code}).inc();
}

void engine_metrics::on_http_response(std::string_view route, int status) {
  // A fixed set of label values: a client's path never becomes a series.
  static constexpr std::string_view routes[] = {
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/ws", "/health", "/metrics",
    "/",                    "/tokenize",       "/detokenize", "/version"};
  std::string_view label = "other";
  for (auto r : routes)
    if (route == r)
      label = r;
  http_responses_.with({std::string(label), std::to_string(status)}).inc();
}

void engine_metrics::on_preemptions(int64_t n) {
  if (n > 0)
    preemptions_.inc(double(n));
}

void engine_metrics::on_executor_restart() {
  restarts_.inc();
}

// -- data parallel: per-replica series ------------------------------------------------

void engine_metrics::enable_replicas(int32_t n) {
  if (!replicas_.empty() || n < 2)
    return;
  auto& up = registry_.add_gauge_family(
    "metronome:replica_up", "1 while the replica takes requests (its executor is up).",
    {"replica"});
  auto& running = registry_.add_gauge_family("metronome:replica_num_requests_running",
                                             "Requests with sequences in the replica.",
                                             {"replica"});
  auto& waiting = registry_.add_gauge_family("metronome:replica_num_requests_waiting",
                                             "Requests waiting in the replica's scheduler.",
                                             {"replica"});
  auto& kv = registry_.add_gauge_family("metronome:replica_kv_cache_usage_perc",
                                        "Fraction of the replica's KV cache pages in use.",
                                        {"replica"});
  auto& routed = registry_.add_counter_family("metronome:replica_routed_requests_total",
                                              "Requests the router placed on the replica.",
                                              {"replica"});
  auto& steps = registry_.add_counter_family("metronome:replica_steps_total",
                                             "Engine steps the replica ran.", {"replica"});
  auto& tokens = registry_.add_counter_family(
    "metronome:replica_computed_tokens_total",
    "Tokens (prompt and output) the replica's steps computed.", {"replica"});
  auto& restarts = registry_.add_counter_family(
    "metronome:replica_executor_restarts_total",
    "Failures of the replica's executor (restarted or not).", {"replica"});
  for (int32_t i = 0; i < n; ++i) {
    // Every series exists from the start (a replica that never fails shows
    // 0 restarts), and is looked up once.
    const std::string r = std::to_string(i);
    replicas_.push_back({&up.with({r}), &running.with({r}), &waiting.with({r}), &kv.with({r}),
                         &routed.with({r}), &steps.with({r}), &tokens.with({r}),
                         &restarts.with({r})});
  }
}

void engine_metrics::on_routed(int32_t replica) {
  if (replica >= 0 && replica < int32_t(replicas_.size()))
    replicas_[size_t(replica)].routed->inc();
}

void engine_metrics::on_replica_step(int32_t replica, int64_t num_tokens) {
  if (replica < 0 || replica >= int32_t(replicas_.size()))
    return;
  replicas_[size_t(replica)].steps->inc();
  if (num_tokens > 0)
    replicas_[size_t(replica)].tokens->inc(double(num_tokens));
}

void engine_metrics::on_replica_restart(int32_t replica) {
  if (replica >= 0 && replica < int32_t(replicas_.size()))
    replicas_[size_t(replica)].restarts->inc();
}

void engine_metrics::on_scheduling_event(const std::string& kind, int64_t n) {
  if (n > 0)
    scheduling_events_.with({kind}).inc(double(n));
}

void engine_metrics::on_step_model(double decode_scale, double prefill_scale) {
  step_model_.with({"decode"}).set(decode_scale);
  step_model_.with({"prefill"}).set(prefill_scale);
}

void engine_metrics::on_prefix_cache(int64_t queried, int64_t hit, int32_t cached_pages) {
  if (queried > 0)
    prefix_queries_.inc(double(queried));
  if (hit > 0)
    prefix_hits_.inc(double(hit));
  prefix_pages_.set(double(cached_pages));
}

void engine_metrics::on_kv_buckets(int64_t bucketed, int64_t overflowed,
                                   int32_t reserved_unused_pages) {
  if (bucketed > 0)
    bucket_admissions_.inc(double(bucketed));
  if (overflowed > 0)
    bucket_overflows_.inc(double(overflowed));
  reserved_unused_.set(double(reserved_unused_pages));
}

void engine_metrics::on_kv_overflow_values(int64_t values) {
  if (values > 0)
    kv_overflow_values_.inc(double(values));
}

void engine_metrics::on_rerun() {
  reruns_.inc();
}

void engine_metrics::on_worker_event(const std::string& event) {
  worker_events_.with({event}).inc();
}

void engine_metrics::on_policy_switch(const std::string& policy, const std::string& why) {
  policy_switches_.with({policy, why}).inc();
}

void engine_metrics::on_kv_precision_event(const std::string& event, bool cooling_down) {
  if (!event.empty())
    kv_precision_events_.with({event}).inc();
  kv_precision_mode_.with({"fp8_e5m2"}).set(cooling_down ? 0 : 1);
  kv_precision_mode_.with({"bf16"}).set(cooling_down ? 1 : 0);
}

engine_stats_sample engine_metrics::sample(const engine_status& s) const {
  engine_stats_sample out;
  out.computed_tokens = computed_tokens_.value();
  out.sampled_tokens = sampled_tokens_.value();
  out.prefix_queries = prefix_queries_.value();
  out.prefix_hits = prefix_hits_.value();
  out.running = s.running.load();
  out.waiting = s.waiting.load();
  out.kv_used_pages = s.kv_used_pages.load();
  out.kv_total_pages = s.kv_total_pages.load();
  return out;
}

std::string engine_metrics::render(const engine_status& s) {
  const int32_t total = s.kv_total_pages.load();
  kv_usage_.set(total > 0 ? double(s.kv_used_pages.load()) / total : 0.0);
  running_.set(s.running.load());
  waiting_.set(s.waiting.load());
  live_actors_.set(double(s.live_requests.load()));
  ready_.set(s.ready.load() ? 1.0 : 0.0);
  for (const auto& e : s.memory_plan())
    memory_.with({e.name}).set(double(e.bytes));
  for (int32_t i = 0; i < int32_t(replicas_.size()) && i < s.num_replicas(); ++i) {
    const auto& g = s.replica(i);
    const auto& m = replicas_[size_t(i)];
    const int32_t pages = g.kv_total_pages.load();
    m.up->set(g.up.load() ? 1.0 : 0.0);
    m.running->set(g.running.load());
    m.waiting->set(g.waiting.load());
    m.kv_usage->set(pages > 0 ? double(g.kv_used_pages.load()) / pages : 0.0);
  }
  process_.refresh();
  return registry_.render();
}

} // namespace metronome
