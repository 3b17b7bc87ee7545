#include "sched/scheduler.hpp"

#include <algorithm>
#include <limits>
#include <span>
#include <stdexcept>

namespace metronome {

scheduler::scheduler(scheduler_config config, std::unique_ptr<admission_policy> policy)
  : config_(config), policy_(std::move(policy)) {
  // nop
}

void scheduler::set_capacity(int32_t num_pages, int32_t page_size) {
  if (pool_.used_pages() > 0)
    throw std::logic_error("scheduler: capacity set while sequences hold pages");
  num_pages_ = num_pages;
  page_size_ = page_size;
  pool_ = kv_page_pool(num_pages, page_size);
  buckets_.reset(num_pages, page_size,
                 config_.kv == kv_strategy::bucketed ? config_.kv_bucket_min_tokens : 0,
                 config_.kv_buckets_per_size, config_.limits.max_model_len);
  bucket_holders_.clear();
}

namespace {

/// Page i's tokens of r (prompt, then output): a view of r's own storage, or
/// of `buf` where the page spans both.
std::span<const int32_t> page_tokens(const sched_request& r, int32_t i, int32_t ps,
                                     std::vector<int32_t>& buf) {
  const size_t begin = size_t(i) * size_t(ps), end = begin + size_t(ps);
  if (end <= r.prompt.size())
    return std::span<const int32_t>(r.prompt).subspan(begin, size_t(ps));
  if (begin >= r.prompt.size())
    return std::span<const int32_t>(r.output).subspan(begin - r.prompt.size(), size_t(ps));
  buf.clear();
  for (size_t t = begin; t < end; ++t)
    buf.push_back(r.token(int32_t(t)));
  return buf;
}

} // namespace

uint64_t scheduler::hash_salt(const sched_request& r) const {
  // Full-precision pages hold other values than the configured type's for
  // the same tokens: their chains start elsewhere (any fixed odd constant).
  return r.precision == kv_precision::full ? config_.cache_salt ^ 0x9e3779b97f4a7c15ull
                                           : config_.cache_salt;
}

void scheduler::set_precision(sched_request& r, kv_precision p, kv_fallback why) {
  if (r.precision != p)
    r.page_hashes.clear(); // named under the other precision's salt
  r.precision = p;
  r.fallback = why;
}

void scheduler::hash_pages(sched_request& r, int32_t pages) {
  std::vector<int32_t> buf;
  for (int32_t i = int32_t(r.page_hashes.size()); i < pages; ++i) {
    const uint64_t prev = i == 0 ? hash_salt(r) : r.page_hashes[size_t(i) - 1];
    r.page_hashes.push_back(page_hash(prev, page_tokens(r, i, page_size_, buf)));
  }
}

std::vector<int32_t> scheduler::cached_prefix(sched_request& r) {
  if (!config_.prefix_caching || page_size_ <= 0 || num_pages_ == 0)
    return {};
  // At least one token stays to compute: its logits start the output.
  const int32_t usable = (r.known_tokens() - 1) / page_size_;
  if (usable <= 0)
    return {};
  hash_pages(r, usable);
  const auto hashes = std::span<const uint64_t>(r.page_hashes).first(size_t(usable));
  if (r.output.empty())
    return pool_.match(hashes, r.prompt);
  std::vector<int32_t> tokens(r.prompt);
  tokens.insert(tokens.end(), r.output.begin(), r.output.end());
  return pool_.match(hashes, tokens);
}

void scheduler::name_pages(sched_request& r) {
  if (!config_.prefix_caching)
    return;
  const int32_t full = std::min(r.num_computed, r.known_tokens()) / page_size_;
  if (full <= r.named_pages)
    return;
  hash_pages(r, full);
  std::vector<int32_t> buf;
  for (int32_t i = r.named_pages; i < full; ++i)
    pool_.cache(r.id, i, r.page_hashes[size_t(i)], page_tokens(r, i, page_size_, buf));
  r.named_pages = full;
}

int32_t scheduler::pages_for(int64_t tokens) const {
  return int32_t((tokens + page_size_ - 1) / page_size_);
}

int32_t scheduler::pages_held(uint64_t id) const {
  const auto* table = pool_.table(id);
  return table ? int32_t(table->size()) : 0;
}

void scheduler::release_pages(uint64_t id) {
  if (pool_.table(id))
    pool_.release(id);
  auto& r = requests_.at(id);
  if (r.bucket >= 0) {
    buckets_.give(r.bucket);
    r.bucket = -1;
    bucket_holders_.erase(std::find(bucket_holders_.begin(), bucket_holders_.end(), id));
  }
}

int32_t scheduler::reserved_unused_pages() const {
  int32_t n = 0;
  for (auto id : bucket_holders_)
    n += std::max(0, buckets_.pages(requests_.at(id).bucket) - pages_held(id));
  return n;
}

int32_t scheduler::free_for(const sched_request& r) const {
  int32_t free = pool_.free_pages() - reserved_unused_pages();
  if (r.bucket >= 0)
    free += std::max(0, buckets_.pages(r.bucket) - pages_held(r.id));
  return free;
}

bool scheduler::take_bucket(sched_request& r) {
  if (buckets_.classes() == 0 || r.kv_mode.value_or(config_.kv) != kv_strategy::bucketed)
    return false;
  // Its whole life: the prompt and all the output it may produce.
  const int64_t tokens = int64_t(r.prompt.size()) + r.max_output;
  const int32_t c = buckets_.find(tokens);
  if (c < 0 || buckets_.pages(c) > free_for(r))
    return false;
  buckets_.take(c);
  r.bucket = c;
  bucket_holders_.push_back(r.id);
  ++bucket_admissions_;
  return true;
}

admit_result scheduler::add(sched_request r, sched_time now) {
  if (requests_.contains(r.id))
    return admit_result::duplicate;
  if (r.prompt.empty())
    return admit_result::empty_prompt;
  if (int64_t(r.prompt.size()) >= config_.limits.max_model_len)
    return admit_result::too_long;
  if ((r.max_context > 0 && r.max_context <= int32_t(r.prompt.size()))
      || (r.kv_mode == kv_strategy::bucketed && config_.kv != kv_strategy::bucketed))
    return admit_result::bad_kv_request;
  r.max_output = std::min<int32_t>(r.params.max_tokens,
                                   config_.limits.max_model_len - int32_t(r.prompt.size()));
  if (r.max_context > 0)
    r.max_output = std::min<int32_t>(r.max_output, r.max_context - int32_t(r.prompt.size()));
  r.bucket = -1;
  if (num_pages_ > 0 && pages_for(int64_t(r.prompt.size()) + r.max_output) > num_pages_)
    return admit_result::too_large_for_cache;
  if (int32_t(waiting_.size()) >= config_.limits.max_queued_requests)
    return admit_result::queue_full;
  r.status = request_status::waiting;
  r.arrival = std::min(r.arrival, now);
  if (admission_precision_ == kv_precision::full)
    set_precision(r, kv_precision::full, kv_fallback::cooldown);
  // What the cache holds now: the policies count those tokens as done.
  r.cached_tokens = int32_t(cached_prefix(r).size()) * page_size_;
  auto id = r.id;
  auto& stored = requests_.emplace(id, std::move(r)).first->second;
  waiting_.push_back(id);
  policy_->on_arrival(stored, now);
  return admit_result::ok;
}

const sched_request* scheduler::find(uint64_t id) const {
  auto i = requests_.find(id);
  return i == requests_.end() ? nullptr : &i->second;
}

void scheduler::finish(sched_request& r, finish_kind reason, sched_time now) {
  if (r.status == request_status::waiting)
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), r.id));
  else if (r.status == request_status::running)
    running_.erase(std::find(running_.begin(), running_.end(), r.id));
  r.status = request_status::finished;
  r.finish_reason = reason;
  finishing_.push_back(r.id);
  policy_->on_finish(r, now);
}

void scheduler::collect_finished(std::vector<uint64_t>* done) {
  auto keep = finishing_.begin();
  for (auto id : finishing_) {
    auto& r = requests_.at(id);
    if (r.inflight > 0) {
      *keep++ = id;
      continue;
    }
    release_pages(id);
    if (r.in_runner)
      release_next_.push_back(id);
    if (done)
      done->push_back(id);
    requests_.erase(id);
  }
  finishing_.erase(keep, finishing_.end());
}

bool scheduler::abort(uint64_t id, finish_kind reason, sched_time now) {
  auto i = requests_.find(id);
  if (i == requests_.end() || i->second.status == request_status::finished)
    return false;
  finish(i->second, reason, now);
  collect_finished(nullptr);
  return true;
}

void scheduler::preempt(sched_request& r) {
  running_.erase(std::find(running_.begin(), running_.end(), r.id));
  waiting_.push_front(r.id); // it goes first once its outputs are in
  r.status = request_status::waiting;
  release_pages(r.id);
  if (r.in_runner) {
    release_next_.push_back(r.id);
    r.in_runner = false;
  }
  r.num_computed = 0;
  r.named_pages = 0;
  ++r.preemptions;
  ++preemptions_;
}

std::vector<sched_request*> scheduler::waiting_list() {
  std::vector<sched_request*> out;
  out.reserve(waiting_.size());
  for (auto id : waiting_)
    out.push_back(&requests_.at(id));
  return out;
}

std::vector<scheduler::visit_entry> scheduler::running_order() const {
  std::vector<visit_entry> visit;
  visit.reserve(running_.size());
  for (size_t i = 0; i < running_.size(); ++i)
    visit.push_back({running_[i], int32_t(i)});
  if (!config_.groups.enabled())
    return visit;
  // Decodes (one token to compute) trade places among themselves only, so a
  // prompt chunk takes the budget where it would without groups.
  std::vector<size_t> places;
  std::vector<visit_entry> decodes;
  for (size_t i = 0; i < visit.size(); ++i) {
    const auto& r = requests_.at(visit[i].id);
    if (r.total_tokens() - r.num_computed == 1) {
      places.push_back(i);
      decodes.push_back(visit[i]);
    }
  }
  std::stable_sort(decodes.begin(), decodes.end(), [&](const auto& a, const auto& b) {
    return group_of(requests_.at(a.id)) < group_of(requests_.at(b.id));
  });
  for (size_t j = 0; j < places.size(); ++j)
    visit[places[j]] = decodes[j];
  return visit;
}

size_t scheduler::pick_victim(const std::vector<visit_entry>& visit, size_t k) {
  size_t latest = visit.size(), chosen = visit.size();
  int32_t chosen_group = -1;
  for (size_t j = k + 1; j < visit.size(); ++j) {
    const auto& r = requests_.at(visit[j].id);
    if (r.bucket >= 0)
      continue;
    if (latest == visit.size() || visit[j].admitted > visit[latest].admitted)
      latest = j;
    const int32_t g = group_of(r);
    if (chosen == visit.size() || g > chosen_group
        || (g == chosen_group && visit[j].admitted > visit[chosen].admitted)) {
      chosen = j;
      chosen_group = g;
    }
  }
  if (chosen != latest)
    ++group_stats_.preemptions; // only with groups: otherwise both are the latest
  return chosen;
}

std::optional<step_draft> scheduler::schedule(sched_time now) {
  if (num_pages_ == 0 || int32_t(inflight_.size()) >= config_.pipeline_depth)
    return std::nullopt;
  step_draft d;
  std::vector<uint64_t> in_plan;
  int32_t budget = config_.limits.max_num_batched_tokens;
  bool preempted = false;

  // What the step's decodes cost alone, and the prompt work ready now: the
  // policy's limit on prompt tokens and on the step's time depends on both.
  step_load load{budget, 0, 0, int32_t(waiting_.size())};
  step_shape decodes;
  int64_t ready_prompt = 0;
  for (auto id : running_) {
    const auto& r = requests_.at(id);
    const int32_t uncomputed = r.total_tokens() - r.num_computed;
    if (uncomputed > 1) {
      ++load.prefilling;
      ready_prompt += uncomputed;
    } else {
      ++load.decoding;
      if (uncomputed == 1)
        decodes.add_chunk(r.num_computed, 1, true);
    }
  }
  for (auto id : waiting_) {
    const auto& r = requests_.at(id);
    if (ready_prompt < budget)
      ready_prompt += std::max(1, r.total_tokens() - r.cached_tokens);
    load.oldest_wait = std::max(load.oldest_wait, now - r.arrival);
  }
  load.decode_ms = step_times_.predict_decode_ms(decodes);
  {
    step_shape wanted = decodes;
    wanted.add_chunk(0, std::min<int64_t>(ready_prompt, budget), false);
    load.prefill_ms = ready_prompt > 0 ? step_times_.predict_ms(wanted) - load.decode_ms : 0.0;
  }
  int32_t prefill_left = std::max(1, policy_->prefill_budget(load, now));
  // engine.prefill_chunk_tokens: the most prompt tokens one sequence gets.
  const int32_t chunk_cap = config_.limits.prefill_chunk_tokens > 0
                              ? config_.limits.prefill_chunk_tokens
                              : std::numeric_limits<int32_t>::max();
  d.limit_ms = load.decoding > 0 ? policy_->step_time_limit_ms(load, now) : std::nullopt;
  // The decodes go in the step whatever the limit: prompt chunks get the rest.
  step_shape limit_shape = decodes;
  bool prompt_placed = false, cut = false;

  // The prompt tokens of a chunk of `r` that fit the step's time limit.
  auto within_limit = [&](const sched_request& r, int32_t n) {
    if (!d.limit_ms)
      return n;
    int32_t fit = step_times_.prefill_tokens_within(limit_shape, r.num_computed, n, *d.limit_ms);
    if (!prompt_placed)
      fit = std::max(fit, std::min(n, config_.min_prefill_chunk));
    cut = cut || fit < n;
    return fit;
  };

  // Gives `r` n tokens of this step.
  auto place = [&](sched_request& r, int32_t n, int32_t need) {
    auto pages = pool_.grow(r.id, need);
    if (!pages) // need <= free_pages() was checked: a bug, never a state to run with
      throw std::logic_error("scheduler: the KV pool refused pages it reported free");
    d.plan.chunks.push_back({r.id, n, std::move(*pages)});
    const bool decode = n == 1 && r.total_tokens() - r.num_computed == 1;
    d.shape.add_chunk(r.num_computed, n, decode);
    if (!decode) {
      limit_shape.add_chunk(r.num_computed, n, false);
      prompt_placed = true;
    }
    r.num_computed += n;
    const bool samples = r.num_computed == r.total_tokens();
    if (samples)
      ++r.pending; // this chunk ends with a sample
    d.samples.push_back(samples ? 1 : 0);
    ++r.inflight;
    budget -= n;
    in_plan.push_back(r.id);
    name_pages(r);
  };

  // 1. Running requests, in admission order (decodes by token group when
  // groups are on: running_order).
  auto visit = running_order();
  size_t k = 0;
  int32_t last_decode = -1; // the latest admitted decode placed
  for (; k < visit.size() && budget > 0;) {
    auto& r = requests_.at(visit[k].id);
    const int32_t uncomputed = r.total_tokens() - r.num_computed;
    const bool samples_max = int32_t(r.output.size()) + r.pending >= r.max_output;
    // A request parked for a KV overflow waits for the supervisor.
    if (uncomputed <= 0 || samples_max || r.overflow_parked) {
      ++k;
      continue;
    }
    const bool prompt = uncomputed > 1;
    int32_t n
      = std::min(uncomputed, prompt ? std::min({budget, prefill_left, chunk_cap}) : budget);
    if (prompt)
      n = within_limit(r, n);
    if (n <= 0) {
      ++k;
      continue;
    }
    const int32_t need = pages_for(int64_t(r.num_computed) + n) - pages_held(r.id);
    // Make room by preempting a request not visited yet that holds no
    // bucket (a bucket's pages are guaranteed for its life): pick_victim.
    while (need > free_for(r)) {
      const size_t v = pick_victim(visit, k);
      if (v == visit.size())
        break;
      preempt(requests_.at(visit[v].id));
      visit.erase(visit.begin() + ptrdiff_t(v));
      preempted = true;
    }
    if (need > free_for(r)) {
      preempt(r); // alone and still too big: wait for pages
      visit.erase(visit.begin() + ptrdiff_t(k));
      preempted = true;
      continue;
    }
    place(r, n, need);
    if (prompt)
      prefill_left -= n;
    else
      last_decode = std::max(last_decode, visit[k].admitted);
    ++k;
  }
  // Decodes the budget left out while a decode of a lower group admitted
  // after them ran: what the group order changed (none without groups,
  // where decodes run in admission order).
  for (size_t j = k; j < visit.size(); ++j) {
    const auto& r = requests_.at(visit[j].id);
    const bool waits = r.total_tokens() - r.num_computed == 1 && !r.overflow_parked
                       && int32_t(r.output.size()) + r.pending < r.max_output;
    if (waits && visit[j].admitted < last_decode)
      ++group_stats_.decodes;
  }

  // 2. Waiting requests, in the policy's order (none after a preemption,
  // none beside a request that runs alone).
  const bool alone = std::any_of(running_.begin(), running_.end(),
                                 [&](uint64_t id) { return requests_.at(id).no_batch; });
  if (!preempted && !alone && budget > 0 && prefill_left > 0
      && int32_t(running_.size()) < config_.limits.max_batch_size) {
    int32_t free_slots = config_.limits.max_batch_size - int32_t(running_.size());
    auto order = policy_->admission_order(waiting_list(), free_slots, now);
    // Token groups: requests that generated less go first (new arrivals are
    // group 0, preempted ones keep what they generated); the policy's order
    // holds within a group. `jumped`: moved ahead of a higher group.
    std::vector<uint64_t> jumped;
    if (config_.groups.enabled()) {
      int32_t highest = -1;
      for (auto* r : order) {
        const int32_t g = group_of(*r);
        if (g < highest)
          jumped.push_back(r->id);
        highest = std::max(highest, g);
      }
      std::stable_sort(order.begin(), order.end(),
                       [&](auto* a, auto* b) { return group_of(*a) < group_of(*b); });
    }
    for (auto* r : order) {
      if (free_slots <= 0 || budget <= 0)
        break;
      if (r->inflight > 0 || r->status != request_status::waiting || r->overflow_parked)
        continue; // preempted with samples still in flight, or parked
      // Its KV precision: full once re-materialised, else the admissions'
      // (full during a cool-down).
      if (r->fallback != kv_fallback::rematerialized) {
        if (admission_precision_ == kv_precision::full)
          set_precision(*r, kv_precision::full, kv_fallback::cooldown);
        else
          set_precision(*r, kv_precision::configured,
                        r->fallback == kv_fallback::saturated ? kv_fallback::saturated
                                                              : kv_fallback::none);
      }
      // One that runs alone waits for the running ones to finish, and the
      // requests behind it wait for it (no skipping ahead).
      if (r->no_batch && !running_.empty())
        break;
      const int32_t total = r->total_tokens();
      // Its longest cached prefix is computed already: the chunk starts
      // after it, in fresh pages.
      const std::vector<int32_t> hit = cached_prefix(*r);
      const int32_t cached = int32_t(hit.size()) * page_size_;
      r->num_computed = cached;
      const int32_t n
        = within_limit(*r, std::min({total - cached, budget, prefill_left, chunk_cap}));
      const int32_t need = pages_for(int64_t(cached) + n) - int32_t(hit.size());
      const bool bucketed = n > 0 && take_bucket(*r);
      // Shared pages no table holds stop counting as free.
      if (n <= 0 || need + pool_.unreferenced(hit) > free_for(*r)) {
        if (bucketed) {
          release_pages(r->id);
          --bucket_admissions_;
        }
        r->num_computed = 0;
        break; // no skipping ahead: that would starve long prompts
      }
      waiting_.erase(std::find(waiting_.begin(), waiting_.end(), r->id));
      running_.push_back(r->id);
      r->status = request_status::running;
      if (!r->first_scheduled)
        r->first_scheduled = now;
      new_sequence seq{r->id, r->prompt, r->params, r->seed, int32_t(r->output.size())};
      seq.prompt.insert(seq.prompt.end(), r->output.begin(), r->output.end());
      seq.num_cached = cached;
      seq.cached_pages = hit;
      seq.precision = r->precision;
      d.plan.added.push_back(std::move(seq));
      r->in_runner = true;
      pool_.share(r->id, hit);
      r->named_pages = int32_t(hit.size());
      r->cached_tokens = cached;
      if (config_.prefix_caching) {
        prefix_queries_ += total;
        prefix_hits_ += cached;
      }
      if (!bucketed && buckets_.classes() > 0
          && r->kv_mode.value_or(config_.kv) == kv_strategy::bucketed)
        ++bucket_overflows_; // admitted into plain pages
      place(*r, n, need);
      prefill_left -= n;
      --free_slots;
      if (std::find(jumped.begin(), jumped.end(), r->id) != jumped.end())
        ++group_stats_.admissions;
      if (r->no_batch)
        break;
    }
  }

  if (d.plan.chunks.empty()) // after preemptions, the freed pages may admit others
    return preempted ? schedule(now) : std::nullopt;
  d.plan.released = std::move(release_next_);
  release_next_.clear();
  d.plan.step = next_step_++;
  d.predicted_ms = step_times_.predict_ms(d.shape);
  inflight_.push_back({std::move(in_plan), d.shape, d.predicted_ms});
  ++steps_;
  if (cut)
    ++limited_steps_;
  return d;
}

step_update scheduler::update_from_output(const step_output& out, sched_time now) {
  step_update u;
  if (inflight_.empty())
    return u;
  for (auto id : inflight_.front().ids)
    if (auto i = requests_.find(id); i != requests_.end())
      --i->second.inflight;
  const auto& done = inflight_.front();
  u.step = step_record{out.step,
                       done.shape,
                       done.predicted_ms,
                       step_times_.prior().step_ms(done.shape),
                       out.seconds * 1e3,
                       out.device_seconds * 1e3};
  step_times_.observe(done.shape, out.seconds * 1e3);
  inflight_.pop_front();
  // Overflows first: a request's token of this step was computed on them.
  for (const auto& o : out.kv_overflows) {
    kv_overflow_values_ += o.saturated + o.non_finite;
    auto i = requests_.find(o.id);
    if (i == requests_.end())
      continue;
    auto& r = i->second;
    // Reported once per admission in the configured type: not after a
    // keep (saturated), nor for a sample of a plan made before a
    // re-materialisation (its precision is full by now).
    if (!overflow_supervised_ || r.status == request_status::finished || r.overflow_parked
        || r.precision != kv_precision::configured || r.fallback == kv_fallback::saturated)
      continue;
    r.overflow_parked = true;
    // The pages it wrote hold the saturated values: no later request may
    // match them without computing (and counting) them itself.
    if (page_size_ > 0)
      pool_.unname_from(r.id, r.cached_tokens / page_size_);
    u.overflows.push_back(o);
  }
  for (const auto& t : out.tokens) {
    auto i = requests_.find(t.id);
    if (i == requests_.end())
      continue;
    auto& r = i->second;
    if (r.pending > 0)
      --r.pending;
    if (r.status == request_status::finished)
      continue; // a sample made before the request ended
    if (r.discard > 0) {
      --r.discard; // made on overflowed values; the request is recomputed
      continue;
    }
    if (r.overflow_parked) {
      r.held.push_back({t, out.num_seqs});
      continue;
    }
    accept_token(r, t, out.num_seqs, now, u);
  }
  collect_finished(&u.finished);
  return u;
}

void scheduler::accept_token(sched_request& r, const sampled_token& t, int32_t batch_size,
                             sched_time now, step_update& u) {
  r.output.push_back(t.token);
  policy_->on_token(r, now);
  token_event ev{r.id, t.token, batch_size, {}, {}, t.logprobs};
  ev.fallback = r.fallback;
  if (r.output.size() == 1) {
    ev.first_scheduled = r.first_scheduled;
    ev.arrival = r.arrival;
    ev.cached_tokens = r.cached_tokens;
  }
  if (std::find(r.stop_ids.begin(), r.stop_ids.end(), t.token) != r.stop_ids.end())
    ev.finish_reason = finish_kind::stop;
  else if (int32_t(r.output.size()) >= r.max_output)
    ev.finish_reason = finish_kind::length;
  if (ev.finish_reason != finish_kind::none)
    finish(r, ev.finish_reason, now);
  u.tokens.push_back(std::move(ev));
}

bool scheduler::rematerialize(uint64_t id, sched_time now) {
  (void)now;
  auto i = requests_.find(id);
  if (i == requests_.end() || !i->second.overflow_parked
      || i->second.status == request_status::finished)
    return false;
  auto& r = i->second;
  r.overflow_parked = false;
  r.held.clear();
  r.discard = r.pending; // every sample in flight was made after the overflow
  set_precision(r, kv_precision::full, kv_fallback::rematerialized);
  if (r.status == request_status::running)
    preempt(r); // a preempted (waiting) one has no pages left to free
  ++rematerializations_;
  return true;
}

std::vector<uint64_t> scheduler::parked() const {
  std::vector<uint64_t> out;
  for (const auto& [id, r] : requests_)
    if (r.overflow_parked && r.status != request_status::finished)
      out.push_back(id);
  return out;
}

std::optional<step_update> scheduler::keep_overflowed(uint64_t id, sched_time now) {
  auto i = requests_.find(id);
  if (i == requests_.end() || !i->second.overflow_parked
      || i->second.status == request_status::finished)
    return std::nullopt;
  auto& r = i->second;
  r.overflow_parked = false;
  r.fallback = kv_fallback::saturated;
  step_update u;
  auto held = std::move(r.held);
  r.held.clear();
  for (const auto& h : held) {
    if (r.status == request_status::finished)
      break; // a held token ended it: the rest came after its end
    accept_token(r, h.sample, h.batch_size, now, u);
  }
  collect_finished(&u.finished);
  return u;
}

std::vector<uint64_t> scheduler::fail_runner() {
  std::vector<uint64_t> failed;
  for (auto it = requests_.begin(); it != requests_.end();) {
    auto& r = it->second;
    if (r.status == request_status::finished) {
      it = requests_.erase(it); // already reported
      continue;
    }
    if (r.status == request_status::running) {
      failed.push_back(r.id);
      running_.erase(std::find(running_.begin(), running_.end(), r.id));
      it = requests_.erase(it);
      continue;
    }
    r.num_computed = 0; // waiting (possibly preempted): recompute later
    r.named_pages = 0;
    r.pending = 0;
    r.discard = 0;
    r.inflight = 0;
    r.in_runner = false;
    ++it;
  }
  finishing_.clear();
  inflight_.clear();
  release_next_.clear();
  num_pages_ = 0;
  pool_.reset(0);
  for (auto id : bucket_holders_)
    if (auto i = requests_.find(id); i != requests_.end())
      i->second.bucket = -1;
  bucket_holders_.clear();
  buckets_.reset(0, page_size_, 0, 0, 0);
  return failed;
}

void scheduler::set_policy(std::unique_ptr<admission_policy> policy, sched_time now) {
  policy_ = std::move(policy);
  for (auto id : waiting_)
    policy_->on_arrival(requests_.at(id), now);
}

} // namespace metronome
