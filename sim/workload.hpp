#pragma once
// Synthetic workloads: arrivals from a renewal process (Poisson, gamma or
// constant gaps), optionally modulated by a diurnal sine and periodic
// bursts, with prompt and output lengths from named distributions. The
// result is a sim::trace, so `metronome replay --workload` and
// `metronome bench-serve --workload` read it exactly like a trace file.
//
// Grammar (no spaces; docs/bench-serve.md has examples):
//
//   SPEC     := ARRIVAL ":" PARAM ("," PARAM)*
//   ARRIVAL  := poisson | gamma | constant
//   PARAM    := rate=R            requests per second (required, > 0)
//             | cv=C              gamma only: coefficient of variation of the
//                                 gaps (1 = Poisson, > 1 bursty, < 1 regular)
//             | burstiness=B      gamma only: the gamma shape, as vLLM's
//                                 --burstiness (= 1 / cv^2); give cv or this
//             | n=N               number of requests
//             | duration=S        arrivals in [0, S) seconds (n and duration
//                                 together: whichever ends first; one is
//                                 required)
//             | prompt=DIST       prompt tokens (default fixed:512)
//             | output=DIST       output tokens (default fixed:128)
//             | seed=S            default 0
//             | diurnal=A:P       rate x (1 + A sin(2 pi t / P)), 0 <= A < 1,
//                                 P seconds
//             | burst=E:L:F       rate x F during the first L seconds of
//                                 every E seconds (0 < L < E, F > 0)
//   DIST     := fixed:N | uniform:A:B (inclusive)
//             | normal:MEAN:SD[:MIN:MAX] | lognormal:MEAN:SD[:MIN:MAX]
//               (MEAN and SD of the lengths themselves; rounded, clamped to
//               [MIN, MAX], default [1, 1048576])
//             | mix:[W*]DIST|[W*]DIST...  (weights W default 1)
//
// Example: poisson:rate=20,prompt=uniform:130:900,output=uniform:64:448,n=500,seed=1
//
// Determinism: the same spec gives the same trace on every run and
// platform (own samplers over a 64-bit SplitMix/xoshiro generator, not the
// implementation-defined std:: distributions). Arrivals, prompt lengths
// and output lengths draw from three separate streams of the seed, so
// changing one distribution leaves the others' draws as they were.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "sim/trace.hpp"

namespace metronome::sim {

/// A malformed workload spec: what() = "workload: <param>: <problem>".
class workload_error : public std::invalid_argument {
public:
  workload_error(const std::string& param, const std::string& problem);
};

/// A distribution of token counts (>= 1).
struct length_distribution {
  enum class kind { fixed, uniform, normal, lognormal, mix };
  kind type = kind::fixed;
  /// fixed: a = N. uniform: [a, b]. normal / lognormal: mean a, sd b.
  double a = 1, b = 0;
  /// Clamp of normal and lognormal draws.
  int32_t min = 1, max = 1 << 20;
  /// mix: one weighted component.
  struct part;
  /// mix: the components; weights need not sum to 1. (A struct completed
  /// below rather than std::pair: clang cannot instantiate a pair of this
  /// still incomplete type with libstdc++ 12, and the sanitizer builds use
  /// clang.)
  std::vector<part> parts;

  /// The mean of the distribution before clamping (mix: weighted).
  double mean() const;
};

struct length_distribution::part {
  double weight = 1;
  length_distribution dist;
};

struct workload_spec {
  enum class arrival_kind { poisson, gamma, constant };
  arrival_kind arrival = arrival_kind::poisson;
  double rate = 0;
  /// Gamma shape of the gaps (1 for Poisson).
  double shape = 1;
  /// 0 = unbounded (then duration_s bounds it).
  int64_t n = 0;
  /// 0 = unbounded (then n bounds it).
  double duration_s = 0;
  uint64_t seed = 0;
  double diurnal_amplitude = 0;
  double diurnal_period_s = 0;
  double burst_every_s = 0;
  double burst_length_s = 0;
  double burst_factor = 1;
  length_distribution prompt{length_distribution::kind::fixed, 512};
  length_distribution output{length_distribution::kind::fixed, 128};
  /// The spec as written (the trace's name).
  std::string text;

  /// The instantaneous rate multiplier at t seconds (diurnal x burst).
  double rate_multiplier(double t) const;
};

/// Parses a spec. Throws workload_error naming the parameter at fault.
workload_spec parse_workload(std::string_view text);

/// Parses one DIST ("uniform:130:900"); `param` names it in errors.
length_distribution parse_length_distribution(std::string_view text, const std::string& param);

/// The trace of a spec: arrivals sorted, the first at 0 s, name = spec text.
/// At most 10 million requests (a duration-bounded spec that would exceed it
/// throws workload_error). Deterministic for the spec.
trace generate_workload(const workload_spec& spec);

/// parse_workload then generate_workload.
trace make_workload(std::string_view text);

} // namespace metronome::sim
