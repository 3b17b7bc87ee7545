#include "bench/gpu/overlap_bench.hpp"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <thread>

#include "bench/gpu/bench_driver.hpp"
#include "config/config_scalar.hpp"
#include "gpu/cuda_runner.hpp"
#include "sim/report.hpp"

namespace metronome::bench {
namespace {

using clock_type = std::chrono::steady_clock;
using nlohmann::json;

/// The nearest-rank P95 (the replay's and bench-serve's definition).
double p95(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : sim::percentile_sorted(v, 95);
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// What one split measures, by chunk.
struct split_figures {
  std::string decode_share, prompt_share;
  double decode_alone_ms = NAN, decode_alone_p95_ms = NAN;
  int32_t context_from = 0, context_to = 0;
  std::map<int32_t, double> prompt_alone_ms, serial_mixed_ms, prompt_beside_tok_s;
  std::map<int32_t, std::vector<double>> decode_beside_ms;
};

/// Decode steps of `ids`, each submitted behind the one in flight; the
/// device ms of each measured step.
std::vector<double> decode_steps(bench_driver& d, const std::vector<uint64_t>& ids, int warm,
                                 int steps) {
  std::vector<double> ms;
  d.decode_into(ids, warm, steps, true, ms);
  return ms;
}

void run_split(const std::shared_ptr<const model_folder>& model, const overlap_options& o,
               int32_t sms, split_figures& f) {
  const int32_t max_chunk = *std::max_element(o.chunks.begin(), o.chunks.end());
  std::barrier sync(2);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> measure_from_ns{0};
  std::exception_ptr failed[2];
  // A side that fails leaves the barrier and stops the other's prompt loop,
  // so the other runs its phases to the end alone and nothing waits for ever.
  auto give_up = [&](int side) {
    failed[side] = std::current_exception();
    stop = true;
    sync.arrive_and_drop();
  };
  // Phases, both threads: 0 up; 1 decode runner alone; 2 prompt runner
  // alone; then per chunk: start together, decode runner measures, stop.
  auto decode_side = [&] {
    try {
      cuda_runner_options ro;
      ro.device_replicas = 2;
      ro.limits.max_batch_size = o.decode_batch + 1; // the serial step: a prompt beside
      ro.limits.max_num_batched_tokens = max_chunk + o.decode_batch;
      // Pools sized by hand: the two runners hold two copies of the weights.
      ro.limits.kv_cache_tokens =
        int64_t(o.decode_batch) * (o.context + 4 * o.steps + 64) + 2 * max_chunk;
      ro.mixed_graphs = false;
      ro.sm_count = sms;
      auto runner = make_cuda_runner(model, ro);
      f.decode_share = describe_cuda_runner(*runner);
      bench_driver d(*runner, ro.limits.max_num_batched_tokens, ro.limits.max_batch_size);
      sync.arrive_and_wait(); // 0: up
      sync.arrive_and_wait(); // the prompt runner up (its start-up's timings run alone)
      const auto ids = d.prefill(o.decode_batch, o.context);
      f.context_from = d.context(ids[0]);
      const auto alone = decode_steps(d, ids, 10, o.steps);
      f.decode_alone_ms = median(alone);
      f.decode_alone_p95_ms = p95(alone);
      // The serial engine's step: every decode and a whole chunk of a new
      // prompt in one step (fcfs under a budget that fits the chunk).
      for (int32_t c : o.chunks) {
        std::vector<double> ms;
        for (int rep = 0; rep < 4; ++rep) {
          auto extra = d.add(1, c);
          std::vector<std::pair<uint64_t, int32_t>> chunks;
          for (auto id : ids)
            chunks.push_back({id, 1});
          chunks.push_back({extra[0], c});
          const double t = d.step(chunks);
          if (rep > 0)
            ms.push_back(t);
          d.release(extra);
        }
        f.serial_mixed_ms[c] = median(ms);
      }
      sync.arrive_and_wait(); // 1
      sync.arrive_and_wait(); // 2: the prompt runner alone
      for (int32_t c : o.chunks) {
        sync.arrive_and_wait(); // the prompt runner is computing
        decode_steps(d, ids, 5, 0);
        measure_from_ns = clock_type::now().time_since_epoch().count();
        f.decode_beside_ms[c] = decode_steps(d, ids, 0, o.steps);
        stop = true;
        sync.arrive_and_wait(); // the prompt runner stopped
        stop = false;
      }
      f.context_to = d.context(ids[0]);
      d.release(ids);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "overlap: decode runner: %s\n", e.what());
      give_up(0);
    }
  };
  auto prompt_side = [&] {
    try {
      cuda_runner_options ro;
      ro.device_replicas = 2;
      ro.limits.max_batch_size = 8;
      ro.limits.max_num_batched_tokens = max_chunk;
      ro.limits.kv_cache_tokens = 2 * max_chunk + 256;
      ro.cuda_graphs = false;
      ro.sm_count = sms;
      ro.sm_rest = sms > 0;
      sync.arrive_and_wait(); // 0: the decode runner up
      auto runner = make_cuda_runner(model, ro);
      f.prompt_share = describe_cuda_runner(*runner);
      bench_driver d(*runner, ro.limits.max_num_batched_tokens, ro.limits.max_batch_size);
      sync.arrive_and_wait(); // up
      auto prompt_step = [&](int32_t c) {
        auto ids = d.add(1, c);
        const double ms = d.step({{ids[0], c}});
        d.release(ids);
        return ms;
      };
      sync.arrive_and_wait(); // 1: the decode runner alone
      for (int32_t c : o.chunks) {
        std::vector<double> ms;
        for (int rep = 0; rep < 10; ++rep) {
          const double t = prompt_step(c);
          if (rep >= 2)
            ms.push_back(t);
        }
        f.prompt_alone_ms[c] = median(ms);
      }
      sync.arrive_and_wait(); // 2
      for (int32_t c : o.chunks) {
        measure_from_ns = 0;
        prompt_step(c); // running before the decode side measures
        sync.arrive_and_wait();
        // The rate of the steps that started once the decode side measured
        // and ended before it stopped: each beside decode steps throughout.
        int64_t tokens = 0;
        double busy_s = 0;
        while (!stop) {
          const int64_t from = measure_from_ns;
          const auto t0 = clock_type::now();
          prompt_step(c);
          if (from != 0 && t0.time_since_epoch().count() >= from && !stop) {
            tokens += c;
            busy_s += seconds_since(t0);
          }
        }
        f.prompt_beside_tok_s[c] = tokens > 0 ? double(tokens) / busy_s : NAN;
        sync.arrive_and_wait();
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "overlap: prompt runner: %s\n", e.what());
      give_up(1);
    }
  };
  std::thread a(decode_side), b(prompt_side);
  a.join();
  b.join();
  for (const auto& e : failed) {
    if (e)
      std::rethrow_exception(e);
  }
}

} // namespace

std::vector<int32_t> parse_int_list(const std::string& text) {
  std::vector<int32_t> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const auto n = parse_integer(text.substr(at, comma - at));
    if (!n || *n < 0 || *n > (int64_t(1) << 20))
      return {};
    out.push_back(int32_t(*n));
    at = comma + 1;
  }
  return out;
}

void overlap_bench(const std::shared_ptr<const model_folder>& model, const overlap_options& o,
                   json& rows) {
  std::printf("overlap: %d decoding sequences from %d tokens of context; prompt chunks",
              o.decode_batch, o.context);
  for (int32_t c : o.chunks)
    std::printf(" %d", c);
  std::printf("\n%-22s %6s %9s %9s %9s %9s %9s %9s %9s %10s %6s\n", "split (decode SMs)",
              "chunk", "dec.alone", "dec.p50", "dec.p95", "x alone", "prm.alone", "prm.tok/s",
              "of alone", "serial mix", "ctx");
  for (int32_t sms : o.decode_sms) {
    split_figures f;
    const auto t0 = clock_type::now();
    run_split(model, o, sms, f);
    const double took = seconds_since(t0);
    for (int32_t c : o.chunks) {
      const auto& beside = f.decode_beside_ms[c];
      const double p50 = median(beside), p95_ms = p95(beside);
      const double alone_rate = double(c) / (f.prompt_alone_ms[c] * 1e-3);
      json r = {{"split", sms == 0 ? "shared" : std::to_string(sms)},
                {"decode_share", f.decode_share},
                {"prompt_share", f.prompt_share},
                {"decode_batch", o.decode_batch},
                {"context_from", f.context_from},
                {"context_to", f.context_to},
                {"chunk", c},
                {"decode_alone_ms", f.decode_alone_ms},
                {"decode_alone_p95_ms", f.decode_alone_p95_ms},
                {"decode_beside_p50_ms", p50},
                {"decode_beside_p95_ms", p95_ms},
                {"decode_beside_ms", beside},
                {"prompt_alone_ms", f.prompt_alone_ms[c]},
                {"prompt_beside_tok_s", f.prompt_beside_tok_s[c]},
                {"prompt_alone_tok_s", alone_rate},
                {"serial_mixed_ms", f.serial_mixed_ms[c]},
                {"seconds", took}};
      rows.push_back(r);
      std::printf("%-22s %6d %9.3f %9.3f %9.3f %9.2f %9.3f %9.0f %9.2f %10.3f %3d-%d\n",
                  sms == 0 ? "shared (two streams)" : ("first " + std::to_string(sms)).c_str(),
                  c, f.decode_alone_ms, p50, p95_ms, p50 / f.decode_alone_ms, f.prompt_alone_ms[c],
                  f.prompt_beside_tok_s[c], f.prompt_beside_tok_s[c] / alone_rate,
                  f.serial_mixed_ms[c], f.context_from, f.context_to);
    }
    std::printf("  (%s | %s; %.0f s)\n", f.decode_share.c_str(), f.prompt_share.c_str(), took);
    std::fflush(stdout);
  }
}

} // namespace metronome::bench
