#include "sim/workload.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

namespace metronome::sim {

workload_error::workload_error(const std::string& param, const std::string& problem)
  : std::invalid_argument("workload: " + param + ": " + problem) {}

namespace {

constexpr int64_t max_requests = 10'000'000;

// -- parsing ---------------------------------------------------------------------

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t at = text.find(sep, start);
    out.push_back(text.substr(start, at == std::string_view::npos ? text.npos : at - start));
    if (at == std::string_view::npos)
      return out;
    start = at + 1;
  }
}

double number(std::string_view text, const std::string& param) {
  double v = 0;
  const auto* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc{} || p != end || !std::isfinite(v))
    throw workload_error(param, "'" + std::string(text) + "' is not a number");
  return v;
}

int64_t integer(std::string_view text, const std::string& param) {
  int64_t v = 0;
  const auto* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc{} || p != end)
    throw workload_error(param, "'" + std::string(text) + "' is not an integer");
  return v;
}

int32_t token_count(std::string_view text, const std::string& param) {
  const auto v = integer(text, param);
  if (v < 1 || v > (1 << 20))
    throw workload_error(param, "'" + std::string(text) + "' is not a token count in 1..1048576");
  return int32_t(v);
}

// -- sampling --------------------------------------------------------------------

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// xoshiro256**: small, fast, and the same sequence everywhere.
class rng {
public:
  rng(uint64_t seed, uint64_t stream) {
    uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ull);
    for (auto& w : s_)
      w = splitmix64(x);
  }

  uint64_t next() {
    const uint64_t out = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return out;
  }

  /// [0, 1).
  double uniform() {
    return double(next() >> 11) * 0x1.0p-53;
  }

  double exponential(double mean) {
    return -mean * std::log1p(-uniform());
  }

  /// Box-Muller, one draw per call.
  double normal() {
    const double u1 = 1.0 - uniform(); // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

  /// Marsaglia and Tsang; shape < 1 through gamma(shape + 1) * u^(1/shape).
  double gamma(double shape, double scale) {
    if (shape < 1) {
      const double u = 1.0 - uniform();
      return gamma(shape + 1, scale) * std::pow(u, 1.0 / shape);
    }
    const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    while (true) {
      double x, v;
      do {
        x = normal();
        v = 1.0 + c * x;
      } while (v <= 0);
      v = v * v * v;
      const double u = 1.0 - uniform();
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v))
        return d * v * scale;
    }
  }

private:
  static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
  }
  uint64_t s_[4];
};

int32_t sample(const length_distribution& d, rng& g) {
  using k = length_distribution::kind;
  auto clamp = [&](double x) {
    return int32_t(std::clamp(std::round(x), double(d.min), double(d.max)));
  };
  switch (d.type) {
    case k::fixed:
      return int32_t(d.a);
    case k::uniform: {
      const double span = d.b - d.a + 1;
      return int32_t(d.a + std::min(std::floor(g.uniform() * span), span - 1));
    }
    case k::normal:
      return clamp(d.a + d.b * g.normal());
    case k::lognormal: {
      const double s2 = std::log1p(d.b * d.b / (d.a * d.a));
      return clamp(std::exp(std::log(d.a) - s2 / 2 + std::sqrt(s2) * g.normal()));
    }
    case k::mix: {
      double total = 0;
      for (const auto& [w, _] : d.parts)
        total += w;
      double x = g.uniform() * total;
      for (const auto& [w, part] : d.parts) {
        if (x < w)
          return sample(part, g);
        x -= w;
      }
      return sample(d.parts.back().dist, g);
    }
  }
  return 1;
}

} // namespace

double length_distribution::mean() const {
  switch (type) {
    case kind::fixed:
    case kind::normal:
    case kind::lognormal:
      return a;
    case kind::uniform:
      return (a + b) / 2;
    case kind::mix: {
      double sw = 0, s = 0;
      for (const auto& [w, p] : parts) {
        sw += w;
        s += w * p.mean();
      }
      return sw > 0 ? s / sw : 0;
    }
  }
  return 0;
}

length_distribution parse_length_distribution(std::string_view text, const std::string& param) {
  using k = length_distribution::kind;
  length_distribution d;
  const auto colon = text.find(':');
  const auto name = text.substr(0, colon);
  const auto rest = colon == text.npos ? std::string_view{} : text.substr(colon + 1);
  if (name == "mix") {
    d.type = k::mix;
    if (rest.empty())
      throw workload_error(param, "mix needs components: mix:W*DIST|W*DIST");
    for (auto part : split(rest, '|')) {
      double w = 1;
      // A weight prefix "W*" (the '*' never occurs inside a DIST).
      if (const auto star = part.find('*'); star != part.npos) {
        w = number(part.substr(0, star), param + " (mix weight)");
        part = part.substr(star + 1);
      }
      if (!(w > 0))
        throw workload_error(param, "mix weights must be > 0");
      auto sub = parse_length_distribution(part, param);
      if (sub.type == k::mix)
        throw workload_error(param, "a mix cannot contain a mix");
      d.parts.push_back({w, std::move(sub)});
    }
    return d;
  }
  const auto args = rest.empty() ? std::vector<std::string_view>{} : split(rest, ':');
  auto want = [&](size_t lo, size_t hi, const char* form) {
    if (args.size() < lo || args.size() > hi)
      throw workload_error(param, "'" + std::string(text) + "': expected " + form);
  };
  if (name == "fixed") {
    want(1, 1, "fixed:N");
    d.type = k::fixed;
    d.a = token_count(args[0], param);
  } else if (name == "uniform") {
    want(2, 2, "uniform:MIN:MAX");
    d.type = k::uniform;
    d.a = token_count(args[0], param);
    d.b = token_count(args[1], param);
    if (d.b < d.a)
      throw workload_error(param, "'" + std::string(text) + "': MAX is below MIN");
  } else if (name == "normal" || name == "lognormal") {
    want(2, 4, (std::string(name) + ":MEAN:SD[:MIN:MAX]").c_str());
    d.type = name == "normal" ? k::normal : k::lognormal;
    d.a = number(args[0], param);
    d.b = number(args[1], param);
    if (!(d.a >= 1) || !(d.b >= 0))
      throw workload_error(param, "'" + std::string(text) + "': MEAN must be >= 1 and SD >= 0");
    if (args.size() >= 3)
      d.min = token_count(args[2], param);
    if (args.size() == 4)
      d.max = token_count(args[3], param);
    if (d.max < d.min)
      throw workload_error(param, "'" + std::string(text) + "': MAX is below MIN");
  } else {
    throw workload_error(param, "unknown distribution '" + std::string(name)
                                  + "' (fixed, uniform, normal, lognormal, mix)");
  }
  return d;
}

double workload_spec::rate_multiplier(double t) const {
  double m = 1;
  if (diurnal_amplitude > 0)
    m *= 1 + diurnal_amplitude * std::sin(2 * std::numbers::pi * t / diurnal_period_s);
  if (burst_every_s > 0 && std::fmod(t, burst_every_s) < burst_length_s)
    m *= burst_factor;
  return m;
}

workload_spec parse_workload(std::string_view text) {
  workload_spec s;
  s.text = std::string(text);
  const auto colon = text.find(':');
  const auto kind = text.substr(0, colon);
  if (kind == "poisson")
    s.arrival = workload_spec::arrival_kind::poisson;
  else if (kind == "gamma")
    s.arrival = workload_spec::arrival_kind::gamma;
  else if (kind == "constant")
    s.arrival = workload_spec::arrival_kind::constant;
  else
    throw workload_error("arrival", "unknown arrival process '" + std::string(kind)
                                      + "' (poisson, gamma, constant)");
  if (colon == text.npos || colon + 1 == text.size())
    throw workload_error("rate", "missing (e.g. " + std::string(kind) + ":rate=10,n=100)");
  bool have_rate = false, have_cv = false, have_burstiness = false;
  for (auto item : split(text.substr(colon + 1), ',')) {
    const auto eq = item.find('=');
    if (eq == item.npos)
      throw workload_error(std::string(item), "expected KEY=VALUE");
    const std::string key(item.substr(0, eq));
    const auto value = item.substr(eq + 1);
    if (key == "rate") {
      s.rate = number(value, key);
      if (!(s.rate > 0))
        throw workload_error(key, "must be > 0");
      have_rate = true;
    } else if (key == "cv" || key == "burstiness") {
      if (s.arrival != workload_spec::arrival_kind::gamma)
        throw workload_error(key, "only for gamma arrivals");
      const double v = number(value, key);
      if (!(v > 0))
        throw workload_error(key, "must be > 0");
      s.shape = key == "cv" ? 1 / (v * v) : v;
      (key == "cv" ? have_cv : have_burstiness) = true;
    } else if (key == "n") {
      s.n = integer(value, key);
      if (s.n < 1 || s.n > max_requests)
        throw workload_error(key, "must be in 1..10000000");
    } else if (key == "duration") {
      s.duration_s = number(value, key);
      if (!(s.duration_s > 0))
        throw workload_error(key, "must be > 0 seconds");
    } else if (key == "prompt") {
      s.prompt = parse_length_distribution(value, key);
    } else if (key == "output") {
      s.output = parse_length_distribution(value, key);
    } else if (key == "seed") {
      const auto v = integer(value, key);
      if (v < 0)
        throw workload_error(key, "must be >= 0");
      s.seed = uint64_t(v);
    } else if (key == "diurnal") {
      const auto args = split(value, ':');
      if (args.size() != 2)
        throw workload_error(key, "expected diurnal=AMPLITUDE:PERIOD_S");
      s.diurnal_amplitude = number(args[0], key);
      s.diurnal_period_s = number(args[1], key);
      if (!(s.diurnal_amplitude >= 0 && s.diurnal_amplitude < 1))
        throw workload_error(key, "the amplitude must be in [0, 1)");
      // The generator integrates the rate in steps of period / 2000.
      if (!(s.diurnal_period_s >= 0.1))
        throw workload_error(key, "the period must be at least 0.1 seconds");
    } else if (key == "burst") {
      const auto args = split(value, ':');
      if (args.size() != 3)
        throw workload_error(key, "expected burst=EVERY_S:LENGTH_S:FACTOR");
      s.burst_every_s = number(args[0], key);
      s.burst_length_s = number(args[1], key);
      s.burst_factor = number(args[2], key);
      // The generator integrates the rate in steps of LENGTH_S / 100.
      if (!(s.burst_length_s >= 0.01 && s.burst_length_s < s.burst_every_s))
        throw workload_error(key, "needs 0.01 <= LENGTH_S < EVERY_S");
      if (!(s.burst_factor > 0))
        throw workload_error(key, "FACTOR must be > 0");
    } else {
      throw workload_error(key, "unknown parameter (rate, cv, burstiness, n, duration, prompt, "
                                "output, seed, diurnal, burst)");
    }
  }
  if (!have_rate)
    throw workload_error("rate", "missing (e.g. rate=10)");
  if (have_cv && have_burstiness)
    throw workload_error("cv", "give cv or burstiness, not both");
  if (s.n == 0 && s.duration_s == 0)
    throw workload_error("n", "give n=COUNT or duration=SECONDS (or both)");
  return s;
}

trace generate_workload(const workload_spec& s) {
  // Design note. Arrivals come from a renewal process of rate `rate` in
  // "operational time" u; the modulation (diurnal, bursts) maps u to wall
  // time t through the cumulative multiplier L(t) = integral of
  // rate_multiplier over [0, t]: a request at u arrives at L^-1(u) (time
  // rescaling, which keeps the gap distribution's shape and turns its rate
  // into rate x multiplier(t)). L is integrated forward in small steps
  // (midpoint rule), which suits arrivals made in increasing order.
  rng arrivals(s.seed, 1), prompts(s.seed, 2), outputs(s.seed, 3);
  const bool modulated = s.diurnal_amplitude > 0 || s.burst_every_s > 0;
  double dt = 0.01;
  if (s.diurnal_amplitude > 0)
    dt = std::min(dt, s.diurnal_period_s / 2000);
  if (s.burst_every_s > 0)
    dt = std::min(dt, s.burst_length_s / 100);
  double t_now = 0, l_now = 0; // L(t_now) = l_now
  auto wall_time = [&](double u) {
    if (!modulated)
      return u;
    while (true) {
      const double m = s.rate_multiplier(t_now + dt / 2);
      if (l_now + m * dt >= u)
        return t_now + (u - l_now) / m;
      t_now += dt;
      l_now += m * dt;
    }
  };
  auto gap = [&] {
    switch (s.arrival) {
      case workload_spec::arrival_kind::poisson:
        return arrivals.exponential(1 / s.rate);
      case workload_spec::arrival_kind::gamma:
        return arrivals.gamma(s.shape, 1 / (s.rate * s.shape));
      case workload_spec::arrival_kind::constant:
        break;
    }
    return 1 / s.rate;
  };
  trace t;
  t.name = s.text.empty() ? "workload" : s.text;
  double u = 0; // the first request at 0
  for (int64_t i = 0; s.n == 0 || i < s.n; ++i) {
    const double at = wall_time(u);
    if (s.duration_s > 0 && at >= s.duration_s)
      break;
    if (i >= max_requests)
      throw workload_error("duration", fmt::format("more than {} requests", max_requests));
    trace_request r;
    r.arrival_s = at;
    r.prompt_tokens = sample(s.prompt, prompts);
    r.output_tokens = sample(s.output, outputs);
    t.requests.push_back(r);
    u += gap();
  }
  return t;
}

trace make_workload(std::string_view text) {
  return generate_workload(parse_workload(text));
}

} // namespace metronome::sim
