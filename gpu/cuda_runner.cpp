// The CUDA executor as a model_runner: step plans in, sampled ids out.
//
// Design note. The runner keeps the host-side truth about sequences (the
// shared sequence_table: tokens, computed count, pages) plus, per sequence,
// the device slot that indexes its page table and what penalties need (the
// distinct prompt tokens, output counts). A plan is checked completely before
// anything changes: a plan_error leaves the runner as it was. The engine gets
// each chunk's tokens, position and slot and the page-table rows that grew.
//
// Steps overlap (submit/collect): a sampled token is appended to its
// sequence as pending the moment its step is launched, so the next plan's
// decode chunk can be launched behind it with the token fed on the device;
// the step's end writes the real id into the table. At most two steps are in
// the engine; a step that samples for a sequence with penalties first waits
// for the step in flight (its penalty entries count the earlier tokens).
//
// The executor learns of a step's end without polling: once it has set a
// step listener, every launched step is followed on the engine's stream by
// an event that the step notifier's thread sleeps on (step_notifier.hpp).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "gpu/cuda_engine.hpp"
#include "gpu/cuda_runner.hpp"
#include "gpu/kernels_v1.hpp"
#include "gpu/step_notifier.hpp"
#include "gpu/tensor_parallel_runner.hpp"
#include "model/model_weights.hpp"

namespace metronome {

namespace {

using gpu::engine_chunk;
using gpu::engine_result;
using gpu::page_update;
using gpu::penalty_entry;

/// What the runner keeps per sequence beyond the shared table.
struct gpu_sequence {
  int32_t slot = 0;
  int32_t pages = 0;
  uint64_t seed = 0;
  uint64_t incarnation = 0; // tells a re-admitted sequence from its earlier self
  sampling_params params;
  std::vector<int32_t> prompt_distinct; // sorted, only with a repetition penalty
  std::unordered_map<int32_t, int32_t> output_counts; // only when params.penalised()
  int32_t prior_outputs = 0; // output before a re-admission (new_sequence::num_output)
  int32_t fed_row = -1; // its row in the sampled ids of the step launched last
};

/// Marks a sampled token the host does not know yet: the step in flight
/// samples it on the device (the next step reads it there, fed_row).
constexpr int32_t pending_token = -1;

class cuda_runner final : public model_runner {
public:
  cuda_runner(std::shared_ptr<const model_folder> model, const cuda_runner_options& options)
    : model_(std::move(model)), engine_(model_, options) {
    for (int32_t s = engine_.max_seqs() - 1; s >= 0; --s)
      free_slots_.push_back(s);
  }

  ~cuda_runner() override {
    // No listener call begins from here on (model_runner's contract); the
    // notifier itself goes after the engine, which waits for the steps in
    // flight (bounded), so that its thread has nothing left to wait for.
    if (notifier_)
      notifier_->set_listener({});
  }

  step_output execute(const step_plan& plan) override {
    if (!pending_.empty())
      throw std::logic_error("cuda runner: execute() while submitted steps are uncollected");
    submit(plan);
    return collect();
  }

  void submit(const step_plan& plan) override {
    const auto start = std::chrono::steady_clock::now();
    check(plan);
    // At most one step stays in flight under this one; none when this one
    // needs the host to know every earlier token (penalties), or has more
    // page-table entries than a step's block (long cached prefixes).
    int64_t new_pages = 0;
    for (const auto& n : plan.added)
      new_pages += int64_t(n.cached_pages.size());
    for (const auto& c : plan.chunks)
      new_pages += int64_t(c.new_pages.size());
    const size_t keep =
      needs_known_tokens(plan) || new_pages > engine_.update_capacity() ? 0 : 1;
    while (engine_.in_flight() > keep)
      finish_oldest();
    table_.apply(plan, page_size(), num_pages());
    for (auto id : plan.released)
      if (auto i = seqs_.find(id); i != seqs_.end()) {
        free_slots_.push_back(i->second.slot);
        seqs_.erase(i);
      }
    for (const auto& n : plan.added) {
      gpu_sequence g;
      g.slot = free_slots_.back();
      free_slots_.pop_back();
      g.seed = n.seed;
      g.params = n.params;
      g.incarnation = ++incarnations_;
      // A re-admitted sequence's last num_output prompt tokens are its earlier
      // output (step_plan.hpp): they count for the penalties as output and
      // advance its random stream, as the CPU runner's sampler does.
      const auto split = n.prompt.begin() + int64_t(n.prompt.size()) - n.num_output;
      g.prior_outputs = n.num_output;
      if (g.params.penalised())
        for (auto t = split; t != n.prompt.end(); ++t)
          ++g.output_counts[*t];
      if (g.params.repetition_penalty != 1.0f) {
        g.prompt_distinct.assign(n.prompt.begin(), split);
        std::sort(g.prompt_distinct.begin(), g.prompt_distinct.end());
        g.prompt_distinct.erase(std::unique(g.prompt_distinct.begin(), g.prompt_distinct.end()),
                                g.prompt_distinct.end());
      }
      seqs_.emplace(n.id, std::move(g));
    }

    chunks_.clear();
    updates_.clear();
    entries_.clear();
    entry_ranges_.clear();
    // A sequence that starts on cached pages (prefix caching): they begin
    // its page table, and their tokens count as computed (the table did).
    for (const auto& n : plan.added) {
      auto& g = seqs_.at(n.id);
      for (size_t i = 0; i < n.cached_pages.size(); ++i)
        updates_.push_back({g.slot, int32_t(i), n.cached_pages[i]});
      g.pages = int32_t(n.cached_pages.size());
    }
    for (const auto& c : plan.chunks) {
      auto& s = table_.at(c.id);
      auto& g = seqs_.at(c.id);
      for (size_t i = 0; i < c.new_pages.size(); ++i)
        updates_.push_back({g.slot, g.pages + int32_t(i), c.new_pages[i]});
      g.pages += int32_t(c.new_pages.size());
      engine_chunk e;
      e.slot = g.slot;
      e.start_pos = s.num_computed;
      e.tokens = std::span<const int32_t>(s.tokens).subspan(size_t(s.num_computed),
                                                           size_t(c.num_tokens));
      // Only a sequence's last token can be pending (one is appended only
      // where a chunk samples, i.e. computes every known token), and only the
      // step launched last can have sampled it: older ones were finished
      // above, which filed their tokens.
      if (e.tokens.back() == pending_token)
        e.fed_row = g.fed_row;
      e.sample = s.num_computed + c.num_tokens == int32_t(s.tokens.size());
      const auto& p = g.params;
      e.temperature = p.temperature;
      e.top_p = p.top_p;
      e.min_p = p.min_p;
      e.top_k = p.top_k;
      e.logprobs = p.logprobs;
      e.repetition_penalty = p.repetition_penalty;
      e.frequency_penalty = p.frequency_penalty;
      e.presence_penalty = p.presence_penalty;
      e.seed = g.seed;
      e.sample_step = int32_t(s.tokens.size()) - s.prompt_len + g.prior_outputs;
      const size_t first = entries_.size();
      if (e.sample && g.params.penalised())
        add_penalties(g);
      entry_ranges_.emplace_back(first, entries_.size());
      chunks_.push_back(e);
    }
    for (size_t i = 0; i < chunks_.size(); ++i)
      chunks_[i].penalties = std::span<const penalty_entry>(entries_).subspan(
        entry_ranges_[i].first, entry_ranges_[i].second - entry_ranges_[i].first);

    const size_t before = engine_.in_flight();
    engine_.launch(chunks_, updates_);

    pending_step p;
    p.step = plan.step;
    p.num_seqs = int32_t(plan.chunks.size());
    p.submitted = start;
    p.launched = engine_.in_flight() > before;
    int32_t row = 0;
    for (size_t i = 0; i < plan.chunks.size(); ++i) {
      const auto& c = plan.chunks[i];
      p.chunk_ids.push_back(c.id);
      auto& s = table_.at(c.id);
      s.num_computed += c.num_tokens;
      p.num_tokens += c.num_tokens;
      if (!chunks_[i].sample)
        continue;
      auto& g = seqs_.at(c.id);
      p.sampled.push_back({c.id, g.incarnation, s.tokens.size()});
      s.tokens.push_back(pending_token);
      g.fed_row = row++;
    }
    if (!p.launched)
      p.output = make_output(p, {});
    const bool watch = p.launched && notifier_;
    pending_.push_back(std::move(p));
    // Behind the step on the stream: its end wakes the notifier's thread.
    if (watch)
      notifier_->watch(engine_.stream());
  }

  void set_step_listener(std::function<void()> on_step_done) override {
    if (!on_step_done) {
      notifier_.reset();
      return;
    }
    if (notifier_)
      notifier_->set_listener(std::move(on_step_done));
    else
      notifier_ = std::make_unique<gpu::step_notifier>(engine_.options().device,
                                                       std::move(on_step_done));
  }

  size_t in_flight() const override {
    return pending_.size();
  }

  bool ready() override {
    if (pending_.empty())
      return false;
    if (pending_.front().output)
      return true;
    return engine_.oldest_done()
           || engine_.oldest_age_s() > engine_.options().limits.step_timeout_s();
  }

  bool arm_device_fault() override {
    engine_.arm_device_fault();
    return true;
  }

  bool device_stuck() override {
    // A launched step the device has not finished: its kernels still hold
    // the context (and freeing device memory would wait for them).
    return engine_.in_flight() > 0 && !engine_.oldest_done();
  }

  step_output collect() override {
    if (pending_.empty())
      throw std::logic_error("cuda runner: collect() with no step in flight");
    if (!pending_.front().output)
      finish_oldest();
    step_output out = std::move(*pending_.front().output);
    pending_.pop_front();
    return out;
  }

  const model_config& config() const override {
    return engine_.config();
  }

  int32_t num_pages() const override {
    return engine_.num_pages();
  }

  int32_t page_size() const override {
    return engine_.page_size();
  }

  std::string device() const override {
    return "cuda:" + std::to_string(engine_.options().device);
  }

  std::vector<memory_plan_entry> memory_plan() const override {
    return engine_.memory_plan();
  }

  gpu::cuda_engine& engine() {
    return engine_;
  }

  const gpu::cuda_engine& engine_view() const {
    return engine_;
  }

private:
  /// Everything the engine would reject, checked before the table changes.
  void check(const step_plan& plan) const {
    const int32_t vocab = config().vocab_size;
    std::unordered_set<uint64_t> released(plan.released.begin(), plan.released.end());
    int64_t live = int64_t(seqs_.size());
    for (auto id : released)
      live -= seqs_.contains(id);
    live += int64_t(plan.added.size());
    if (live > engine_.max_seqs())
      throw plan_error("cuda runner: " + std::to_string(live)
                       + " sequences would be held, more than max_seqs "
                       + std::to_string(engine_.max_seqs()));
    for (const auto& n : plan.added)
      if (n.precision == kv_precision::full && engine_.options().kv_cache_dtype
                                                 != kv_cache_dtype_kind::bf16)
        throw plan_error("cuda runner: sequence " + std::to_string(n.id)
                         + " asks for full-precision KV pages, which the CUDA runner does "
                           "not keep beside an fp8 cache");
    for (const auto& n : plan.added)
      for (auto t : n.prompt)
        if (t < 0 || t >= vocab)
          throw plan_error("sequence " + std::to_string(n.id) + ": token id " + std::to_string(t)
                           + " outside the vocabulary (0.." + std::to_string(vocab - 1) + ")");
    if (int64_t(plan.chunks.size()) > engine_.options().limits.max_batch_size)
      throw plan_error("cuda runner: " + std::to_string(plan.chunks.size())
                       + " sequences in one step exceed max_batch_size "
                       + std::to_string(engine_.options().limits.max_batch_size));
    int64_t tokens = 0;
    for (const auto& c : plan.chunks) {
      tokens += c.num_tokens;
      int64_t pages = int64_t(c.new_pages.size());
      if (auto i = seqs_.find(c.id); i != seqs_.end() && !released.contains(c.id))
        pages += i->second.pages;
      for (const auto& n : plan.added)
        if (n.id == c.id)
          pages += int64_t(n.cached_pages.size());
      if (pages > engine_.max_pages_per_seq())
        throw plan_error("sequence " + std::to_string(c.id) + ": " + std::to_string(pages)
                         + " pages exceed the longest sequence ("
                         + std::to_string(engine_.max_pages_per_seq()) + " pages)");
    }
    const int64_t max_tokens =
      std::max(engine_.options().limits.max_num_batched_tokens,
               engine_.options().limits.max_batch_size);
    if (tokens > max_tokens)
      throw plan_error("cuda runner: " + std::to_string(tokens)
                       + " tokens in one step exceed max_num_batched_tokens "
                       + std::to_string(max_tokens));
  }

  /// A submitted step until collect() returns it.
  struct pending_step {
    uint64_t step = 0;
    int32_t num_seqs = 0;
    int64_t num_tokens = 0;
    bool launched = false; // false: nothing for the device (releases only)
    struct sampled_at {
      uint64_t id = 0, incarnation = 0;
      size_t index = 0; // of its pending token in the table
    };
    std::vector<sampled_at> sampled; // in the engine's row order
    std::vector<uint64_t> chunk_ids;  // the plan's chunks, in order (overflow counts)
    std::chrono::steady_clock::time_point submitted;
    std::optional<step_output> output; // once finished
  };

  /// True when a chunk of `plan` samples for a sequence with penalties: its
  /// penalty entries need the sequence's earlier tokens on the host, and the
  /// engine takes a step with penalties only when none is in flight.
  bool needs_known_tokens(const step_plan& plan) {
    for (const auto& c : plan.chunks) {
      auto added = std::find_if(plan.added.begin(), plan.added.end(),
                                [&](const new_sequence& n) { return n.id == c.id; });
      if (added != plan.added.end()) {
        if (added->params.penalised() && c.num_tokens == int32_t(added->prompt.size()))
          return true;
      } else if (auto i = seqs_.find(c.id); i != seqs_.end() && i->second.params.penalised()) {
        const auto& s = table_.at(c.id);
        if (s.num_computed + c.num_tokens == int32_t(s.tokens.size()))
          return true;
      }
    }
    return false;
  }

  /// Waits for the oldest step the engine runs and files its tokens: into
  /// the table where the pending token's sequence still lives (not
  /// released, not re-admitted since), and into the step's output.
  void finish_oldest() {
    for (auto& p : pending_)
      if (!p.output) {
        p.output = make_output(p, engine_.finish());
        return;
      }
    throw std::logic_error("cuda runner: no step to finish");
  }

  step_output make_output(const pending_step& p, const engine_result& result) {
    step_output out;
    out.step = p.step;
    out.num_seqs = p.num_seqs;
    out.num_tokens = p.num_tokens;
    for (size_t r = 0; r < p.sampled.size(); ++r) {
      const auto& at = p.sampled[r];
      const int32_t token = result.tokens.at(r);
      if (auto i = seqs_.find(at.id); i != seqs_.end() && i->second.incarnation == at.incarnation) {
        table_.at(at.id).tokens.at(at.index) = token;
        // Counted only for the penalties that read them (a map insert per
        // sequence and step otherwise, on the step's critical path).
        if (i->second.params.penalised())
          ++i->second.output_counts[token];
      }
      out.tokens.push_back({at.id, token, result.logprobs.at(r),
                            r < result.model_logprobs.size() ? result.model_logprobs[r]
                                                             : std::vector<token_logprob>{}});
    }
    // fp8_e5m2: what each chunk's writes could not store, by the engine's
    // chunk order (the plan's).
    for (size_t i = 0; 2 * i + 1 < result.kv_overflow.size() && i < p.chunk_ids.size(); ++i)
      if (result.kv_overflow[2 * i] + result.kv_overflow[2 * i + 1] > 0)
        out.kv_overflows.push_back({p.chunk_ids[i], int64_t(result.kv_overflow[2 * i]),
                                    int64_t(result.kv_overflow[2 * i + 1])});
    // The time of a step behind another starts when that one ended.
    const auto now = std::chrono::steady_clock::now();
    out.seconds = std::chrono::duration<double>(now - std::max(p.submitted, last_finished_))
                    .count();
    if (p.launched)
      last_finished_ = now;
    out.device_seconds = result.device_ms * 1e-3;
    return out;
  }

  void add_penalties(const gpu_sequence& g) {
    const bool rep = g.params.repetition_penalty != 1.0f;
    if (rep)
      for (auto t : g.prompt_distinct) {
        auto i = g.output_counts.find(t);
        entries_.push_back({0, t, i == g.output_counts.end() ? 0 : i->second, 1});
      }
    for (const auto& [t, count] : g.output_counts)
      if (!rep || !std::binary_search(g.prompt_distinct.begin(), g.prompt_distinct.end(), t))
        entries_.push_back({0, t, count, rep ? 1 : 0});
  }

  std::shared_ptr<const model_folder> model_;
  // Destroyed after the engine (members go in reverse): see ~cuda_runner.
  std::unique_ptr<gpu::step_notifier> notifier_; // once a step listener is set
  gpu::cuda_engine engine_;
  sequence_table table_;
  std::unordered_map<uint64_t, gpu_sequence> seqs_;
  std::vector<int32_t> free_slots_;
  std::vector<engine_chunk> chunks_;
  std::vector<page_update> updates_;
  std::vector<penalty_entry> entries_;
  std::vector<std::pair<size_t, size_t>> entry_ranges_;
  std::deque<pending_step> pending_;
  uint64_t incarnations_ = 0;
  std::chrono::steady_clock::time_point last_finished_;
};

} // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

int parse_cuda_device(const std::string& device) {
  if (device == "cuda")
    return 0;
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5)
    return -1;
  int n = 0;
  for (size_t i = 5; i < device.size(); ++i) {
    if (device[i] < '0' || device[i] > '9' || n > 100000)
      return -1;
    n = n * 10 + (device[i] - '0');
  }
  return n;
}

std::string cuda_device_problem(int device) {
  const int n = cuda_device_count();
  if (n == 0)
    return "no CUDA device is available (no GPU, or no driver)";
  if (device < 0 || device >= n) {
    std::string s = "this machine has " + std::to_string(n);
    s += n == 1 ? " CUDA device (cuda:0)" : " CUDA devices (cuda:0 to cuda:";
    if (n > 1)
      s += std::to_string(n - 1) + ")";
    return s;
  }
  return {};
}

namespace {

/// The lock a runner holds on `device` while it starts. A replica plans its
/// KV pool from the device memory its own start-up took (cudaMemGetInfo
/// before and after: cuda_runner_options::device_replicas); another replica
/// allocating on the same device at the same time would be counted as its
/// own, and both would shrink or fail ("no memory left for the KV cache").
std::mutex& device_start_lock(int device) {
  static std::mutex guard;
  static std::map<int, std::unique_ptr<std::mutex>> by_device;
  std::lock_guard lock(guard);
  auto& m = by_device[device];
  if (!m)
    m = std::make_unique<std::mutex>();
  return *m;
}

} // namespace

std::unique_ptr<model_runner> make_cuda_runner(std::shared_ptr<const model_folder> model,
                                               const cuda_runner_options& options) {
  if (!model)
    throw std::invalid_argument("make_cuda_runner: no model");
  if (options.tensor_parallel > 1) {
    // Each rank would count the overflows of its own kv heads only, and
    // rank 0's step output is the group's.
    if (options.kv_cache_dtype == kv_cache_dtype_kind::fp8_e5m2)
      throw std::invalid_argument("cuda runner: kv_cache_dtype fp8_e5m2 with tensor_parallel "
                                  + std::to_string(options.tensor_parallel)
                                  + ": its overflow counts are not summed over ranks yet");
    return std::make_unique<tensor_parallel_runner>(std::move(model), options);
  }
  if (options.tensor_parallel < 1)
    throw std::invalid_argument("make_cuda_runner: tensor_parallel must be at least 1 (got "
                                + std::to_string(options.tensor_parallel) + ")");
  if (const std::string p = cuda_device_problem(options.device); !p.empty())
    throw std::invalid_argument("make_cuda_runner: cuda:" + std::to_string(options.device) + ": "
                                + p);
  // Runners of one process start one at a time on a device (each start is
  // bounded by the step timeout of its device waits).
  std::lock_guard start(device_start_lock(options.device));
  return std::make_unique<cuda_runner>(std::move(model), options);
}

namespace {

/// Rank 0 of a tensor-parallel runner, else `runner` itself.
template <class R>
R& first_rank(R& runner) {
  if (auto* tp = dynamic_cast<const tensor_parallel_runner*>(&runner))
    return const_cast<tensor_parallel_runner*>(tp)->rank(0);
  return runner;
}

} // namespace

std::string describe_cuda_runner(const model_runner& runner) {
  if (auto* tp = dynamic_cast<const tensor_parallel_runner*>(&runner))
    return tp->describe() + "; rank 0: " + describe_cuda_runner(first_rank(runner));
  auto* r = dynamic_cast<const cuda_runner*>(&runner);
  if (!r)
    return {};
  const auto& e = r->engine_view();
  return "weights " + e.weights_choice() + "; " + e.sm_share() + "; small-batch decode path "
         + e.small_batch_choice() + "; " + std::to_string(e.mixed_graph_count())
         + " mixed-step graphs";
}

std::vector<float> cuda_runner_logits(model_runner& runner, int32_t rows) {
  auto* r = dynamic_cast<cuda_runner*>(&first_rank(runner));
  if (!r)
    return {};
  return r->engine().logits(rows);
}

bool set_cuda_graphs(model_runner& runner, bool enabled) {
  if (auto* tp = dynamic_cast<tensor_parallel_runner*>(&runner)) {
    tp->for_each_rank([&](model_runner& rank) { set_cuda_graphs(rank, enabled); });
    return true;
  }
  auto* r = dynamic_cast<cuda_runner*>(&runner);
  if (!r)
    return false;
  r->engine().set_graphs(enabled);
  return true;
}

int64_t cuda_mixed_graph_launches(const model_runner& runner) {
  auto* r = dynamic_cast<const cuda_runner*>(&first_rank(runner));
  return r ? int64_t(r->engine_view().mixed_launches()) : -1;
}

bool set_mixed_graphs(model_runner& runner, bool enabled) {
  if (auto* tp = dynamic_cast<tensor_parallel_runner*>(&runner)) {
    tp->for_each_rank([&](model_runner& rank) { set_mixed_graphs(rank, enabled); });
    return true;
  }
  auto* r = dynamic_cast<cuda_runner*>(&runner);
  if (!r)
    return false;
  r->engine().set_mixed_graphs(enabled);
  return true;
}

double cuda_graph_replay_ms(model_runner& runner, int32_t batch, bool repeat_last_step) {
  auto* r = dynamic_cast<cuda_runner*>(&runner);
  return r ? r->engine().graph_replay_ms(batch, repeat_last_step) : std::nan("");
}

std::string cuda_kv_cache_problem(const model_config& c, kv_cache_dtype_kind dtype) {
  if (dtype == kv_cache_dtype_kind::bf16)
    return {};
  // Every kernel that reads or writes the cache has an fp8 form (e4m3 and
  // e5m2 bytes) from the second generation on, for the shapes of its
  // tensor-core decode kernel.
  const std::string name(to_string(dtype));
  gpu::attention_shape sh;
  sh.num_heads = c.num_heads;
  sh.kv_heads = c.num_kv_heads;
  sh.head_dim = c.head_dim;
  if (!gpu::decode_attention_v2_supports(sh))
    return name + " needs head_dim 16, 32, 64 or 128 and at most 8 query heads a kv head (this "
           "model: head_dim " + std::to_string(c.head_dim) + ", "
           + std::to_string(c.num_kv_heads > 0 ? c.num_heads / c.num_kv_heads : 0)
           + " a kv head)";
  const gpu::kernel_generations& k = gpu::active_kernels();
  if (k.decode_attention == 1 || k.prefill_attention == 1)
    return name + " needs the second-generation attention kernels (a benchmark selected the "
           "first)";
  return {};
}

std::string format_memory_plan(const std::vector<memory_plan_entry>& plan) {
  std::string out;
  char line[160];
  for (const auto& e : plan) {
    std::snprintf(line, sizeof line, "  %-18s %10.1f MiB\n", e.name.c_str(),
                  double(e.bytes) / (1024.0 * 1024.0));
    out += line;
  }
  return out;
}

} // namespace metronome
