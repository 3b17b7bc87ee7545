#pragma once
// A small scheduler for the GPU benchmarks: sequences with random prompts,
// their pages from the runner's pool, prompt chunks and decode steps planned
// by hand and run through the model_runner interface as the executor runs
// them. Used by one thread, the runner's.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "model/model_runner.hpp"

namespace metronome::bench {

inline double median(std::vector<double> v) {
  if (v.empty())
    return NAN;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

class bench_driver {
public:
  /// logprobs: what every sequence asks for (sampling_params::logprobs).
  bench_driver(model_runner& r, int32_t max_tokens, int32_t max_batch, int32_t logprobs = -1)
    : r_(r), max_tokens_(max_tokens), max_batch_(max_batch), logprobs_(logprobs) {
    for (int32_t p = r.num_pages() - 1; p >= 0; --p)
      free_pages_.push_back(p);
  }

  /// Adds `count` sequences with random prompts of `len` tokens (computed
  /// by later steps). Returns their ids.
  std::vector<uint64_t> add(int32_t count, int32_t len) {
    std::vector<uint64_t> ids;
    for (int32_t i = 0; i < count; ++i) {
      const uint64_t id = next_id_++;
      pending_.push_back(new_sequence{id, random_prompt(len), greedy(), 0});
      seqs_[id] = {len, 0, {}};
      ids.push_back(id);
    }
    return ids;
  }

  /// Computes the prompts of `ids` up to `upto` tokens each (all of it when
  /// upto < 0), several sequences per step within the token budget.
  void compute(const std::vector<uint64_t>& ids, int32_t upto = -1) {
    size_t i = 0;
    while (i < ids.size()) {
      std::vector<std::pair<uint64_t, int32_t>> chunks;
      int32_t budget = max_tokens_;
      while (i < ids.size() && budget > 0 && int32_t(chunks.size()) < max_batch_) {
        auto& s = seqs_.at(ids[i]);
        const int32_t target = upto < 0 ? s.known : std::min(upto, s.known);
        const int32_t n = std::min(budget, target - s.computed);
        if (n > 0) {
          chunks.push_back({ids[i], n});
          budget -= n;
        }
        if (s.computed + n == target)
          ++i;
        else
          break;
      }
      if (!chunks.empty())
        step(chunks);
    }
  }

  std::vector<uint64_t> prefill(int32_t count, int32_t len) {
    auto ids = add(count, len);
    compute(ids);
    return ids;
  }

  /// One step of the given (sequence, tokens) chunks; returns the wall ms.
  double step(const std::vector<std::pair<uint64_t, int32_t>>& chunks) {
    auto out = r_.execute(plan(chunks));
    account(out);
    return out.seconds * 1e3;
  }

  /// Median ms of `steps` decode steps of `ids` after `warm` unmeasured
  /// ones. overlap: each step submitted behind the one in flight, as the
  /// executor runs them (a step's time then runs from the previous step's
  /// end to its own); else one execute() at a time, host work included.
  double decode(const std::vector<uint64_t>& ids, int warm, int steps, bool overlap = true) {
    std::vector<double> ms;
    decode_into(ids, warm, steps, overlap, ms);
    return median(ms);
  }

  /// Overlapped and one-at-a-time steps of `ids` in `rounds` alternating
  /// blocks of `steps`, after `warm` overlapped ones (the first steps after
  /// a prefill run slower while the device settles: a step trace showed the
  /// batch-64 step fall from 7.6 to 6.9 ms over ten steps): the medians.
  std::pair<double, double> decode_both(const std::vector<uint64_t>& ids, int warm, int steps,
                                        int rounds) {
    std::vector<double> overlapped, sync;
    decode_into(ids, warm, 0, true, overlapped);
    for (int r = 0; r < rounds; ++r) {
      decode_into(ids, 1, steps, true, overlapped);
      decode_into(ids, 1, steps, false, sync);
    }
    return {median(overlapped), median(sync)};
  }

  /// Appends the ms of `steps` decode steps after `warm` unmeasured ones.
  void decode_into(const std::vector<uint64_t>& ids, int warm, int steps, bool overlap,
                   std::vector<double>& ms) {
    std::vector<std::pair<uint64_t, int32_t>> chunks;
    for (auto id : ids)
      chunks.push_back({id, 1});
    int done = 0;
    auto collect = [&] {
      auto out = r_.collect();
      account(out);
      if (done++ >= warm)
        ms.push_back(out.seconds * 1e3);
    };
    for (int i = 0; i < warm + steps; ++i) {
      if (!overlap) {
        const double t = step(chunks);
        if (i >= warm)
          ms.push_back(t);
        continue;
      }
      r_.submit(plan(chunks));
      if (r_.in_flight() > 1)
        collect();
    }
    while (r_.in_flight() > 0)
      collect();
  }

  void release(const std::vector<uint64_t>& ids) {
    step_plan plan;
    plan.step = step_no_++;
    for (auto id : ids) {
      plan.released.push_back(id);
      auto& s = seqs_.at(id);
      free_pages_.insert(free_pages_.end(), s.pages.begin(), s.pages.end());
      seqs_.erase(id);
    }
    r_.execute(plan);
  }

  int32_t context(uint64_t id) const {
    return seqs_.at(id).computed;
  }

  /// Shuffles the free pages: later sequences' pages are scattered over the
  /// whole pool (as after hours of serving), not taken in order.
  void scatter_free_pages(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::shuffle(free_pages_.begin(), free_pages_.end(), rng);
  }

  /// Gives the free pages back in order (the lowest page id taken first).
  void order_free_pages() {
    std::sort(free_pages_.begin(), free_pages_.end(), std::greater<>());
  }

private:
  /// The plan of one step of (sequence, tokens) chunks; counts the tokens
  /// computed (a plan never depends on the ids of the steps before it).
  step_plan plan(const std::vector<std::pair<uint64_t, int32_t>>& chunks) {
    step_plan plan;
    plan.step = step_no_++;
    plan.added = std::move(pending_);
    pending_.clear();
    for (auto [id, n] : chunks) {
      auto& s = seqs_.at(id);
      scheduled_chunk c{id, n, {}};
      while (int32_t(s.pages.size()) * r_.page_size() < s.computed + n) {
        if (free_pages_.empty())
          throw std::runtime_error("bench: out of KV pages");
        c.new_pages.push_back(free_pages_.back());
        s.pages.push_back(free_pages_.back());
        free_pages_.pop_back();
      }
      plan.chunks.push_back(c);
    }
    for (auto [id, n] : chunks)
      seqs_.at(id).computed += n;
    return plan;
  }

  void account(const step_output& out) {
    for (const auto& t : out.tokens)
      if (auto i = seqs_.find(t.id); i != seqs_.end())
        ++i->second.known;
  }

  sampling_params greedy() const {
    sampling_params p;
    p.temperature = 0;
    p.logprobs = logprobs_;
    return p;
  }

  std::vector<int32_t> random_prompt(int32_t len) {
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (auto& t : p)
      t = int32_t(rng_() % uint64_t(r_.config().vocab_size));
    return p;
  }

  struct seq {
    int32_t known, computed;
    std::vector<int32_t> pages;
  };
  model_runner& r_;
  int32_t max_tokens_, max_batch_;
  int32_t logprobs_ = -1;
  uint64_t next_id_ = 1, step_no_ = 0;
  std::mt19937_64 rng_{2026};
  std::vector<new_sequence> pending_;
  std::map<uint64_t, seq> seqs_;
  std::vector<int32_t> free_pages_;
};

} // namespace metronome::bench
