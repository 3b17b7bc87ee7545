#!/usr/bin/env python3
"""policy_check: judge a scheduling policy against fcfs in `metronome replay`.

The one command behind the scheduling acceptance conditions (docs/scheduling.md).
Python 3 standard library only (it runs in CI on Debian 12 without pip).

What it does, per workload:

  1. The knee. fcfs alone is replayed at rate scales found by geometric steps
     (x2) and then geometric bisection, until the smallest rate scale at which
     fcfs P95 TTFT reaches 4x its unloaded value is bracketed within 5% (20%
     with --quick). "Unloaded" is the report's own `unloaded.ttft_ms.p95`: the
     P95 over requests of each request's TTFT alone on the engine, the exact
     low-load limit. The knee is the smallest rate scale tried that reached 4x.
  2. At 30%, 50%, 70%, 90% and 100% of the knee (30%, 70%, 100% with
     --quick) fcfs and each candidate policy are replayed and judged:
       no harm    at every load: candidate P95 TTFT <= 1.05x fcfs,
                  P95 e2e <= 1.05x fcfs, throughput >= 0.97x fcfs;
       win        at the knee: P95 TTFT <= 0.5x fcfs, P95 e2e <= 0.8x fcfs;
       certainty  at 70% of the knee: candidate P95 TTFT <= 2x its P50 TTFT.
     Every replay is cached (fcfs runs are shared by all candidates).

Workloads and the two sets. Constants of a policy (its `--set ladb.*`
values) are chosen on the TUNING set only; the HELD-OUT set is then run once
and its results are reported as they come, never used to pick a constant.
Anything tuned while looking at held-out numbers is no longer held out.

  tuning:   azure-code-1st-half      first half (by time) of the Azure code trace
            mooncake-1st-half        first half of the Mooncake synthetic trace
            synth-chat               Poisson arrivals, prompts U(130,900),
                                     outputs U(64,448)
  heldout:  azure-code, mooncake     the whole shared traces
            azure-code-2nd-half, mooncake-2nd-half
            synth-rag                gamma arrivals (CV 3, bursty), prompts
                                     lognormal around 2,000 (cap 8,000),
                                     outputs 8-96
            synth-diurnal            sinusoidal rate (one period over the
                                     trace, +-80%), prompts 32-256, outputs
                                     256-1,024 (generation-heavy)
            synth-bimodal            90% prompts 64-512, 10% 8,000-24,000;
                                     outputs 16-256
  all:      both (the default)

Synthetic traces are generated deterministically from --seed
(random.Random) and written, like the halves and truncated traces, as
csv traces (arrival_s,prompt_tokens,output_tokens) to a temporary folder.

Usage:
  tools/policy_check.py [--policy ladb[,srpt]] [--set tuning|heldout|all]
      [--metronome build/metronome] [--traces DIR] [--cost-model FILE]
      [--set-opt KEY=VALUE]... [--jobs 2] [--quick] [--max-requests N]
      [--seed N] [--json OUT] [--markdown] [--no-fail] [-v]
  tools/policy_check.py --candidate 'LABEL=POLICY[;KEY=VALUE]...' ... [...]
      judges a named candidate: POLICY with replay --set KEY=VALUE for its own
      replays only (fcfs keeps the shared --set-opt values). Used to measure a
      mechanism on and off, e.g. --candidate 'ladb+groups=ladb;batching.token_groups=32,128'
      beside --policy ladb; POLICY may be fcfs ('fcfs+groups=fcfs;...').
      Reports carry replay's scheduling_events counters per candidate.
  tools/policy_check.py --validate-json OUT [--quick] [--set ...] [--policy ...]
      checks that OUT (written by --json) has every workload of the set, every
      load and every policy with finite numbers (used by CTest).

Exit status: 0 all conditions pass (or --no-fail), 1 a condition failed,
2 usage error, 3 a replay failed or the results are incomplete.
"""

import argparse
import calendar
import concurrent.futures
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

KNEE_FACTOR = 4.0          # fcfs P95 TTFT / unloaded P95 TTFT at the knee
LOADS_FULL = (0.3, 0.5, 0.7, 0.9, 1.0)
LOADS_QUICK = (0.3, 0.7, 1.0)
CERTAINTY_LOAD = 0.7
WIN_LOAD = 1.0
HARM_TTFT = 1.05
HARM_E2E = 1.05
HARM_TPUT = 0.97
WIN_TTFT = 0.5
WIN_E2E = 0.8
CERTAINTY_RATIO = 2.0
BISECT_TOL_FULL = 1.05     # stop when hi / lo <= this
BISECT_TOL_QUICK = 1.2
QUICK_MAX_REQUESTS = 600
DEFAULT_POLICY = "ladb"    # `metronome serve` starts fcfs (engine.policy);
                           # fcfs against itself says nothing, so the
                           # candidate defaults to the project's policy.

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class UsageError(Exception):
    pass


class ReplayError(Exception):
    pass


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sig(x, digits=6):
    """x rounded to `digits` significant digits (rate scales are passed and
    cached as these strings)."""
    return float(f"{x:.{digits}g}")


# -- traces ---------------------------------------------------------------------

def days_from_civil(y, m, d):
    return (calendar.timegm((y, m, d, 0, 0, 0)) // 86400)


def parse_azure_ts(s):
    """'YYYY-MM-DD hh:mm:ss[.fraction]' as seconds, like sim/trace.cpp."""
    s = s.strip().strip('"')
    secs = days_from_civil(int(s[0:4]), int(s[5:7]), int(s[8:10])) * 86400.0
    secs += int(s[11:13]) * 3600 + int(s[14:16]) * 60 + int(s[17:19])
    if len(s) > 19 and s[19] == ".":
        secs += float("0" + s[19:])
    return secs


def read_azure(path):
    out = []
    with open(path, newline="") as f:
        header = [c.strip().strip('"') for c in f.readline().strip().split(",")]
        col = {name: i for i, name in enumerate(header)}
        for name in ("TIMESTAMP", "ContextTokens", "GeneratedTokens"):
            if name not in col:
                raise UsageError(f"{path}: header lacks {name}")
        for line in f:
            line = line.strip()
            if not line:
                continue
            cells = line.split(",")
            out.append((parse_azure_ts(cells[col["TIMESTAMP"]]),
                        int(cells[col["ContextTokens"]]),
                        int(cells[col["GeneratedTokens"]])))
    return out


def read_mooncake(path):
    out = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            j = json.loads(line)
            # hash_ids ride along (the prefix cache shares their blocks).
            out.append((j["timestamp"] / 1e3, int(j["input_length"]), int(j["output_length"]),
                        tuple(j.get("hash_ids", ()))))
    return out


def normalise(reqs):
    """Sorted by arrival (stable), arrivals from 0."""
    reqs = sorted(reqs, key=lambda r: r[0])
    if not reqs:
        return reqs
    t0 = reqs[0][0]
    return [(r[0] - t0,) + tuple(r[1:]) for r in reqs]


def write_csv(path, reqs):
    with open(path, "w") as f:
        f.write("arrival_s,prompt_tokens,output_tokens\n")
        for r in reqs:
            f.write(f"{r[0]:.6f},{r[1]},{r[2]}\n")


def write_mooncake(path, reqs):
    """Mooncake JSON lines, hash_ids kept (arrivals in ms)."""
    with open(path, "w") as f:
        for r in reqs:
            f.write(json.dumps({"timestamp": round(r[0] * 1e3, 3), "input_length": r[1],
                                "output_length": r[2], "hash_ids": list(r[3])}) + "\n")


def halves(reqs):
    """First and second half by time (the midpoint of the time span)."""
    mid = reqs[-1][0] / 2 if reqs else 0
    first = [r for r in reqs if r[0] < mid]
    second = [r for r in reqs if r[0] >= mid]
    return first, normalise(second)


# -- synthetic workloads ----------------------------------------------------------

def synth_chat(rng, n):
    """(a) chat-like: Poisson arrivals, prompts U(130,900), outputs U(64,448)."""
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(4.0)
        out.append((t, rng.randint(130, 900), rng.randint(64, 448)))
    return out


def synth_rag(rng, n):
    """(b) RAG-like: gamma inter-arrivals with CV 3 (shape 1/9), prompts
    lognormal around 2,000 (capped at 8,000), short outputs 8-96."""
    cv, mean_gap = 3.0, 0.5
    shape = 1.0 / (cv * cv)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.gammavariate(shape, mean_gap / shape)
        p = int(min(8000, max(64, rng.lognormvariate(math.log(2000), 0.6))))
        out.append((t, p, rng.randint(8, 96)))
    return out


def synth_diurnal(rng, n):
    """(c) generation-heavy: rate lam0*(1 - 0.8 cos(2 pi t / T)) (trough at
    both ends, peak mid-trace; one period over the trace, by thinning),
    prompts 32-256, outputs 256-1,024."""
    lam0, amp = 1.0, 0.8
    period = n / lam0
    lam_max = lam0 * (1 + amp)
    t, out = 0.0, []
    while len(out) < n:
        t += rng.expovariate(lam_max)
        lam = lam0 * (1 - amp * math.cos(2 * math.pi * t / period))
        if rng.random() * lam_max <= lam:
            out.append((t, rng.randint(32, 256), rng.randint(256, 1024)))
    return out


def synth_bimodal(rng, n):
    """(d) bimodal: Poisson arrivals, 90% prompts 64-512, 10% 8,000-24,000;
    outputs 16-256."""
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(1.0)
        p = rng.randint(8000, 24000) if rng.random() < 0.1 else rng.randint(64, 512)
        out.append((t, p, rng.randint(16, 256)))
    return out


SYNTHETIC = {
    "synth-chat": (synth_chat, 3000),
    "synth-rag": (synth_rag, 2000),
    "synth-diurnal": (synth_diurnal, 2000),
    "synth-bimodal": (synth_bimodal, 2000),
}

AZURE_FILE = "AzureLLMInferenceTrace_code.csv"
MOONCAKE_FILE = "synthetic_trace.jsonl"

# name -> (set, kind, detail)
WORKLOADS = [
    ("azure-code-1st-half", "tuning"),
    ("mooncake-1st-half", "tuning"),
    ("synth-chat", "tuning"),
    ("azure-code", "heldout"),
    ("azure-code-2nd-half", "heldout"),
    ("mooncake", "heldout"),
    ("mooncake-2nd-half", "heldout"),
    ("synth-rag", "heldout"),
    ("synth-diurnal", "heldout"),
    ("synth-bimodal", "heldout"),
]


def workload_names(which):
    return [name for name, s in WORKLOADS if which in ("all", s)]


def set_of(name):
    return dict(WORKLOADS)[name]


def build_workloads(names, traces_dir, tmp, max_requests, seed):
    """Writes the traces the workloads need; returns name -> dict(path,
    format, requests, duration_s, reqs)."""
    sources = {}

    def source(kind):
        if kind not in sources:
            if kind == "azure":
                path = os.path.join(traces_dir, AZURE_FILE)
                if not os.path.exists(path):
                    raise UsageError(f"{path}: no such file (use --traces DIR)")
                reqs = normalise(read_azure(path))
            else:
                path = os.path.join(traces_dir, MOONCAKE_FILE)
                if not os.path.exists(path):
                    raise UsageError(f"{path}: no such file (use --traces DIR)")
                reqs = normalise(read_mooncake(path))
            truncated = max_requests and len(reqs) > max_requests
            if truncated:
                reqs = reqs[:max_requests]
            sources[kind] = (path, reqs, truncated)
        return sources[kind]

    out = {}
    for name in names:
        if name in SYNTHETIC:
            gen, n = SYNTHETIC[name]
            if max_requests:
                n = min(n, max_requests)
            reqs = normalise(gen(random.Random(f"{seed}:{name}"), n))
            path, fmt = os.path.join(tmp, name + ".csv"), "csv"
            write_csv(path, reqs)
        else:
            kind = "azure" if name.startswith("azure") else "mooncake"
            orig, reqs, truncated = source(kind)
            if name.endswith("-1st-half") or name.endswith("-2nd-half"):
                first, second = halves(reqs)
                reqs = first if name.endswith("-1st-half") else second
                if kind == "mooncake":
                    path, fmt = os.path.join(tmp, name + ".jsonl"), "mooncake"
                    write_mooncake(path, reqs)
                else:
                    path, fmt = os.path.join(tmp, name + ".csv"), "csv"
                    write_csv(path, reqs)
            elif truncated:
                ext = ".jsonl" if kind == "mooncake" else ".csv"
                path, fmt = os.path.join(tmp, name + ext), ("mooncake" if kind == "mooncake" else "csv")
                (write_mooncake if kind == "mooncake" else write_csv)(path, reqs)
            else:
                # The file itself, so the figures equal docs/scheduling.md's.
                path, fmt = orig, ("azure" if kind == "azure" else "mooncake")
        if not reqs:
            raise UsageError(f"workload {name}: no requests")
        out[name] = {"path": path, "format": fmt, "requests": len(reqs),
                     "duration_s": reqs[-1][0], "reqs": reqs}
    return out


def initial_guess(reqs, duration, cost_model_path):
    """A rate scale at which the engine is roughly 30% busy by a rough
    estimate from the cost model (only where the knee search starts)."""
    try:
        with open(cost_model_path) as f:
            c = json.load(f)["step_ms"]
    except (OSError, ValueError, KeyError):
        return 1.0
    g = lambda k: float(c.get(k, 0.0))
    work_ms = 0.0
    for _, p, o, *_ in reqs:
        work_ms += p * g("per_prefill_token") + 0.5 * p * p * g("per_prefill_attention_pair")
        work_ms += o * (g("base") / 32 + g("per_decode_seq") + g("per_kv_token") * (p + o / 2))
    if work_ms <= 0 or duration <= 0:
        return 1.0
    busy_at_1 = work_ms / 1e3 / duration
    return sig(min(1e5, max(1e-4, 0.3 / busy_at_1)), 3)


# -- replays --------------------------------------------------------------------

class Runner:
    """Runs `metronome replay` for one (workload, policy, rate scale), at most
    `jobs` at a time, caching every result."""

    def __init__(self, args, tmp):
        self.args = args
        self.tmp = tmp
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs)
        self.cache = {}
        self.lock = threading.Lock()
        self.count = 0
        self.seconds = 0.0

    def base_cmd(self, trace, fmt, label, scale, report):
        policy, opts = self.args.candidates.get(label, (label, []))
        cmd = [self.args.metronome, "replay", "--trace", trace, "--format", fmt,
               "--policy", policy, "--rate-scale", f"{scale:.6g}", "--report", report, "--quiet"]
        if self.args.cost_model:
            cmd += ["--cost-model", self.args.cost_model]
        for kv in self.args.set_opt + opts:
            cmd += ["--set", kv]
        return cmd

    def _run(self, wl_name, wl, policy, scale):
        fd, report = tempfile.mkstemp(prefix="r-", suffix=".json", dir=self.tmp)
        os.close(fd)
        cmd = self.base_cmd(wl["path"], wl["format"], policy, scale, report)
        last = ""
        for attempt in range(6):
            if not os.path.exists(self.args.metronome):
                last = f"{self.args.metronome}: not found (being rebuilt?)"
                time.sleep(10)
                continue
            start = time.monotonic()
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=self.args.timeout)
            except subprocess.TimeoutExpired:
                raise ReplayError(f"{wl_name} {policy} x{scale:.6g}: replay ran past "
                                  f"{self.args.timeout} s")
            except OSError as e:  # e.g. "text file busy" while the binary is replaced
                last = str(e)
                time.sleep(5 * (attempt + 1))
                continue
            elapsed = time.monotonic() - start
            if p.returncode == 0:
                try:
                    with open(report) as f:
                        doc = json.load(f)
                except (OSError, ValueError) as e:
                    last = f"unreadable report: {e}"
                    time.sleep(2)
                    continue
                os.unlink(report)
                with self.lock:
                    self.count += 1
                    self.seconds += elapsed
                if self.args.verbose:
                    log(f"  {wl_name:22s} {policy:6s} x{scale:<10.6g} {elapsed:6.1f} s")
                return doc
            last = (p.stderr or p.stdout).strip()[-2000:]
            # A binary being replaced fails in odd ways; try again a few times.
            time.sleep(5 * (attempt + 1))
        raise ReplayError(f"{wl_name} {policy} x{scale:.6g}: {' '.join(cmd)}\n{last}")

    def submit(self, wl_name, wl, policy, scale):
        key = (wl_name, policy, f"{scale:.6g}")
        with self.lock:
            fut = self.cache.get(key)
            if fut is None:
                fut = self.pool.submit(self._run, wl_name, wl, policy, scale)
                self.cache[key] = fut
        return fut

    def get(self, wl_name, wl, policy, scale):
        return self.submit(wl_name, wl, policy, scale).result()


def metrics(doc):
    return {
        "requests": doc["requests"],
        "refused": doc.get("refused", 0),
        "ttft_p50_ms": doc["ttft_ms"]["p50"],
        "ttft_p95_ms": doc["ttft_ms"]["p95"],
        "ttft_p99_ms": doc["ttft_ms"]["p99"],
        "e2e_p50_ms": doc["e2e_ms"]["p50"],
        "e2e_p95_ms": doc["e2e_ms"]["p95"],
        "itl_p50_ms": doc["itl_ms"]["p50"],
        "itl_p95_ms": doc["itl_ms"]["p95"],
        "queue_p95_ms": doc["queue_ms"]["p95"],
        "throughput_tokens_per_s": doc["throughput_tokens_per_s"],
        "busy_fraction": doc.get("busy_fraction"),
        "preemptions": doc.get("preemptions", 0),
        "scheduling_events": doc.get("scheduling_events", {}),
        "unloaded_ttft_p50_ms": doc["unloaded"]["ttft_ms"]["p50"],
        "unloaded_ttft_p95_ms": doc["unloaded"]["ttft_ms"]["p95"],
        "unloaded_e2e_p95_ms": doc["unloaded"]["e2e_ms"]["p95"],
    }


def ratio(a, b):
    return a / b if b > 0 else (1.0 if a == 0 else math.inf)


def find_knee(runner, name, wl, guess, tol):
    """Smallest fcfs rate scale with P95 TTFT >= KNEE_FACTOR x unloaded."""
    search = []

    def probe(s):
        m = metrics(runner.get(name, wl, "fcfs", s))
        unl = m["unloaded_ttft_p95_ms"]
        r = ratio(m["ttft_p95_ms"], unl)
        search.append({"rate_scale": s, "ttft_p95_ms": m["ttft_p95_ms"], "vs_unloaded": r})
        return r, m

    s = sig(guess)
    r, first = probe(s)
    lo = hi = None
    for _ in range(40):
        if r >= KNEE_FACTOR:
            hi = s
            if lo is not None:
                break
            s = sig(s / 2)
        else:
            lo = s
            if hi is not None:
                break
            s = sig(s * 2)
        if s > 1e6 or s < 1e-6:
            raise ReplayError(f"{name}: fcfs P95 TTFT never crosses {KNEE_FACTOR}x unloaded "
                              f"(searched to rate scale {s:.3g})")
        r, _ = probe(s)
    if lo is None or hi is None:
        raise ReplayError(f"{name}: knee not bracketed")
    while hi / lo > tol:
        mid = sig(math.sqrt(lo * hi))
        if mid <= lo or mid >= hi:
            break
        r, _ = probe(mid)
        if r >= KNEE_FACTOR:
            hi = mid
        else:
            lo = mid
    return hi, first, search


def judge(load, fc, cand):
    """Conditions at one load; None where a condition does not apply."""
    r = {
        "ttft_p95_vs_fcfs": ratio(cand["ttft_p95_ms"], fc["ttft_p95_ms"]),
        "ttft_p50_vs_fcfs": ratio(cand["ttft_p50_ms"], fc["ttft_p50_ms"]),
        "e2e_p95_vs_fcfs": ratio(cand["e2e_p95_ms"], fc["e2e_p95_ms"]),
        "itl_p95_vs_fcfs": ratio(cand["itl_p95_ms"], fc["itl_p95_ms"]),
        "throughput_vs_fcfs": ratio(cand["throughput_tokens_per_s"], fc["throughput_tokens_per_s"]),
        "ttft_p95_over_p50": ratio(cand["ttft_p95_ms"], cand["ttft_p50_ms"]),
    }
    c = {
        "no_harm": (r["ttft_p95_vs_fcfs"] <= HARM_TTFT and r["e2e_p95_vs_fcfs"] <= HARM_E2E
                    and r["throughput_vs_fcfs"] >= HARM_TPUT),
        "win": None,
        "certainty": None,
    }
    if abs(load - WIN_LOAD) < 1e-9:
        c["win"] = r["ttft_p95_vs_fcfs"] <= WIN_TTFT and r["e2e_p95_vs_fcfs"] <= WIN_E2E
    if abs(load - CERTAINTY_LOAD) < 1e-9:
        c["certainty"] = r["ttft_p95_over_p50"] <= CERTAINTY_RATIO
    return r, c


def check_workload(runner, name, wl, policies, loads, tol, cost_model_path):
    t0 = time.monotonic()
    guess = initial_guess(wl["reqs"], wl["duration_s"], cost_model_path)
    knee, first, search = find_knee(runner, name, wl, guess, tol)
    log(f"{name}: knee at rate scale {knee:.6g} ({len(search)} fcfs replays)")
    scales = [sig(knee * l) if l != 1.0 else knee for l in loads]
    futs = []
    for s in scales:
        futs.append([runner.submit(name, wl, p, s) for p in ["fcfs"] + policies])
    rows = []
    for load, s, fl in zip(loads, scales, futs):
        fc = metrics(fl[0].result())
        row = {"load": load, "rate_scale": s, "fcfs": fc, "policies": {}}
        for p, f in zip(policies, fl[1:]):
            m = metrics(f.result())
            r, c = judge(load, fc, m)
            row["policies"][p] = dict(m, ratios=r, conditions=c)
        rows.append(row)
    verdict = {}
    for p in policies:
        harm = all(row["policies"][p]["conditions"]["no_harm"] for row in rows)
        win = all(row["policies"][p]["conditions"]["win"] for row in rows
                  if row["policies"][p]["conditions"]["win"] is not None)
        cert = all(row["policies"][p]["conditions"]["certainty"] for row in rows
                   if row["policies"][p]["conditions"]["certainty"] is not None)
        verdict[p] = {"no_harm": harm, "win": win, "certainty": cert,
                      "pass": harm and win and cert}
    return {
        "name": name, "set": set_of(name), "trace": wl["path"], "format": wl["format"],
        "requests": wl["requests"], "duration_s": round(wl["duration_s"], 3),
        "unloaded_ttft_p50_ms": first["unloaded_ttft_p50_ms"],
        "unloaded_ttft_p95_ms": first["unloaded_ttft_p95_ms"],
        "unloaded_e2e_p95_ms": first["unloaded_e2e_p95_ms"],
        "knee": {"rate_scale": knee, "factor": KNEE_FACTOR, "initial_guess": guess,
                 "search": search},
        "loads": rows, "verdict": verdict,
        "seconds": round(time.monotonic() - t0, 1),
    }


# -- output ---------------------------------------------------------------------

def fmt_ms(x):
    if x >= 10000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.0f}"
    return f"{x:.1f}"


def pf(b):
    return "-" if b is None else ("pass" if b else "FAIL")


COLUMNS = ["load", "rate", "fcfs TTFT p50/p95", "{p} TTFT p50/p95", "fcfs e2e p95",
           "{p} e2e p95", "ITL p95 fcfs/{p}", "tok/s fcfs/{p}", "TTFT95 x", "e2e95 x",
           "tput x", "{p} TTFT 95/50", "no harm", "win", "certainty"]


def table_rows(res, p):
    out = []
    for row in res["loads"]:
        fc, c = row["fcfs"], row["policies"][p]
        r, k = c["ratios"], c["conditions"]
        out.append([
            f"{row['load'] * 100:.0f}%", f"{row['rate_scale']:.4g}",
            f"{fmt_ms(fc['ttft_p50_ms'])} / {fmt_ms(fc['ttft_p95_ms'])}",
            f"{fmt_ms(c['ttft_p50_ms'])} / {fmt_ms(c['ttft_p95_ms'])}",
            fmt_ms(fc["e2e_p95_ms"]), fmt_ms(c["e2e_p95_ms"]),
            f"{fmt_ms(fc['itl_p95_ms'])} / {fmt_ms(c['itl_p95_ms'])}",
            f"{fc['throughput_tokens_per_s']:.1f} / {c['throughput_tokens_per_s']:.1f}",
            f"{r['ttft_p95_vs_fcfs']:.2f}", f"{r['e2e_p95_vs_fcfs']:.2f}",
            f"{r['throughput_vs_fcfs']:.3f}", f"{r['ttft_p95_over_p50']:.1f}",
            pf(k["no_harm"]), pf(k["win"]), pf(k["certainty"]),
        ])
    return out


def print_table(res, p, markdown):
    head = [h.format(p=p) for h in COLUMNS]
    rows = table_rows(res, p)
    v = res["verdict"][p]
    ul50, ul95 = res["unloaded_ttft_p50_ms"], res["unloaded_ttft_p95_ms"]
    title = (f"{res['name']} [{res['set']}] {p} vs fcfs: {res['requests']} requests over "
             f"{res['duration_s']:.0f} s, unloaded TTFT P50/P95 {fmt_ms(ul50)} / {fmt_ms(ul95)} ms "
             f"(95/50 {ratio(ul95, ul50):.1f}), knee at rate scale {res['knee']['rate_scale']:.4g} "
             f"(fcfs P95 TTFT >= {KNEE_FACTOR:g}x unloaded) -> "
             f"{'PASS' if v['pass'] else 'FAIL'}")
    if markdown:
        print(f"**{title}**\n")
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
        print()
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        print(title)
        print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
        for r in rows:
            print("  ".join(x.rjust(w) for x, w in zip(r, widths)))
        print()


EVENT_KINDS = ("reclassification", "promotion", "long_step", "relaxed_step", "limited_step",
               "timeout_dispatch", "group_admission", "group_preemption", "group_decode")


def print_comparison(results, policies):
    """One Markdown row per workload and candidate: P95 ratios against fcfs
    at every load, the least throughput ratio, the verdict, and the
    scheduling events (summed over the loads) that were not zero."""
    loads = "/".join(f"{int(round(row['load'] * 100))}" for row in results[0]["loads"])
    print(f"**Candidates against fcfs** (P95 ratios at {loads}% of each knee)\n")
    print("| workload | set | candidate | P95 TTFT x | P95 e2e x | tput x (min) | preemptions "
          "(fcfs / cand.) | no harm / win / certainty | events (sum over loads) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for res in results:
        for p in policies:
            rows = res["loads"]
            t = "/".join(f"{row['policies'][p]['ratios']['ttft_p95_vs_fcfs']:.2f}" for row in rows)
            e = "/".join(f"{row['policies'][p]['ratios']['e2e_p95_vs_fcfs']:.2f}" for row in rows)
            tp = min(row["policies"][p]["ratios"]["throughput_vs_fcfs"] for row in rows)
            pre_f = sum(row["fcfs"].get("preemptions", 0) for row in rows)
            pre_c = sum(row["policies"][p].get("preemptions", 0) for row in rows)
            ev = {k: sum(row["policies"][p].get("scheduling_events", {}).get(k, 0) for row in rows)
                  for k in EVENT_KINDS}
            evs = ", ".join(f"{k} {v}" for k, v in ev.items() if v) or "none"
            v = res["verdict"][p]
            print(f"| {res['name']} | {res['set']} | {p} | {t} | {e} | {tp:.3f} | {pre_f} / {pre_c} "
                  f"| {pf(v['no_harm'])} / {pf(v['win'])} / {pf(v['certainty'])} | {evs} |")
    print()


def summary_lines(results, policies, markdown):
    lines = []
    for p in policies:
        n = len(results)
        passed = [r["name"] for r in results if r["verdict"][p]["pass"]]
        cnt = {c: sum(1 for r in results if r["verdict"][p][c])
               for c in ("no_harm", "win", "certainty")}
        lines.append(f"{p} vs fcfs: {len(passed)}/{n} workloads pass "
                     f"(no harm {cnt['no_harm']}/{n}, win at knee {cnt['win']}/{n}, "
                     f"certainty {cnt['certainty']}/{n})")
    return lines


# -- validation (CTest) -----------------------------------------------------------

def validate_json(path, names, loads, policies):
    """Problems with a --json file: every workload, load and policy present
    with finite numbers."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        return [f"{path}: {e}"]
    probs = []

    def num(x, what):
        if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
            probs.append(f"{what}: {x!r} is not a finite number")

    by_name = {w.get("name"): w for w in doc.get("workloads", [])}
    keys = ("ttft_p50_ms", "ttft_p95_ms", "e2e_p95_ms", "itl_p95_ms", "throughput_tokens_per_s")
    for n in names:
        w = by_name.get(n)
        if w is None:
            probs.append(f"workload {n} missing")
            continue
        num(w.get("knee", {}).get("rate_scale"), f"{n} knee")
        num(w.get("unloaded_ttft_p95_ms"), f"{n} unloaded")
        got = [row.get("load") for row in w.get("loads", [])]
        if got != list(loads):
            probs.append(f"{n}: loads {got}, expected {list(loads)}")
        for row in w.get("loads", []):
            at = f"{n} load {row.get('load')}"
            num(row.get("rate_scale"), at + " rate_scale")
            for k in keys:
                num(row.get("fcfs", {}).get(k), f"{at} fcfs {k}")
            for p in policies:
                c = row.get("policies", {}).get(p)
                if c is None:
                    probs.append(f"{at}: policy {p} missing")
                    continue
                for k in keys:
                    num(c.get(k), f"{at} {p} {k}")
                for k, v in c.get("ratios", {}).items():
                    num(v, f"{at} {p} {k}")
                if not isinstance(c.get("conditions", {}).get("no_harm"), bool):
                    probs.append(f"{at} {p}: no_harm verdict missing")
        for p in policies:
            if not isinstance(w.get("verdict", {}).get(p, {}).get("pass"), bool):
                probs.append(f"{n}: verdict for {p} missing")
    return probs


# -- main -----------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="policy_check.py",
        description="Judge scheduling policies against fcfs in `metronome replay` "
                    "(no harm below the knee, a win at the knee, certainty at 70%%).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit: 0 pass (or --no-fail), 1 a condition failed, 2 usage, 3 error.")
    ap.add_argument("--policy", default=DEFAULT_POLICY,
                    help="candidate policy, or several separated by commas (default ladb)")
    ap.add_argument("--set", dest="which", default="all", choices=("tuning", "heldout", "all"),
                    help="workload set (default all)")
    ap.add_argument("--metronome", default=os.path.join(REPO, "build", "metronome"),
                    help="the metronome binary (default build/metronome)")
    ap.add_argument("--traces", default=None,
                    help="folder with the shared traces (default $METRONOME_TESTDATA/traces "
                         "or ../shared/testdata/traces beside the checkout)")
    ap.add_argument("--cost-model", default=None,
                    help="step-time model passed to replay (default: replay's own)")
    ap.add_argument("--set-opt", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to replay's --set (every replay, fcfs too); repeatable")
    ap.add_argument("--candidate", action="append", default=[], metavar="LABEL=POLICY[;K=V]...",
                    help="a named candidate: POLICY with its own replay --set values "
                         "(separated by ';'); repeatable; beside --policy's")
    ap.add_argument("--jobs", type=int, default=2, help="replays in parallel (default 2)")
    ap.add_argument("--quick", action="store_true",
                    help=f"loads 30/70/100%% only, traces cut to {QUICK_MAX_REQUESTS} requests, "
                         "a coarser knee (CI smoke test)")
    ap.add_argument("--max-requests", type=int, default=None,
                    help="cut every trace to its first N requests (before the halves split)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the synthetic workloads")
    ap.add_argument("--workload", action="append", default=[],
                    help="only this workload (repeatable; a subset of --set)")
    ap.add_argument("--json", default=None, metavar="OUT", help="write all figures here")
    ap.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    ap.add_argument("--no-fail", action="store_true",
                    help="exit 0 when conditions fail (still nonzero on errors)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per replay (default 900)")
    ap.add_argument("--validate-json", default=None, metavar="FILE",
                    help="only check FILE (from --json) has every workload/load/policy")
    ap.add_argument("-v", "--verbose", action="store_true", help="log every replay")
    args = ap.parse_args(argv)
    args.policies = [p for p in args.policy.split(",") if p]
    if "fcfs" in args.policies:
        raise UsageError("--policy: fcfs is the baseline; name a candidate")
    # label -> (policy, its own --set values); plain --policy names map to
    # themselves with none.
    args.candidates = {}
    for spec in args.candidate:
        label, eq, rest = spec.partition("=")
        parts = [x for x in rest.split(";") if x]
        if not eq or not label or not parts:
            raise UsageError(f"--candidate {spec}: expected LABEL=POLICY[;KEY=VALUE]...")
        if label == "fcfs" or label in args.policies or label in args.candidates:
            raise UsageError(f"--candidate {spec}: label {label} is taken")
        for kv in parts[1:]:
            if "=" not in kv:
                raise UsageError(f"--candidate {spec}: {kv}: expected KEY=VALUE")
        args.candidates[label] = (parts[0], parts[1:])
        args.policies.append(label)
    if not args.policies:
        raise UsageError("--policy: no policy given")
    if args.jobs < 1:
        raise UsageError("--jobs must be >= 1")
    if args.max_requests is not None and args.max_requests < 2:
        raise UsageError("--max-requests must be >= 2")
    if args.quick and args.max_requests is None:
        args.max_requests = QUICK_MAX_REQUESTS
    for kv in args.set_opt:
        if "=" not in kv:
            raise UsageError(f"--set-opt {kv}: expected KEY=VALUE")
    names = workload_names(args.which)
    for w in args.workload:
        if w not in names:
            raise UsageError(f"--workload {w}: not in set {args.which} ({', '.join(names)})")
    args.names = [n for n in names if not args.workload or n in args.workload]
    args.loads = LOADS_QUICK if args.quick else LOADS_FULL
    if args.traces is None:
        env = os.environ.get("METRONOME_TESTDATA")
        args.traces = (os.path.join(env, "traces") if env else
                       os.path.join(os.path.dirname(REPO), "shared", "testdata", "traces"))
    return args


def preflight(args, tmp):
    """A three-request replay of every policy with the --set-opt values (and
    of each --candidate with its own): a bad policy name, key or binary is a
    usage error, said once."""
    plain = ["fcfs"] + [p for p in args.policies if p not in args.candidates]
    for label, (policy, opts) in args.candidates.items():
        preflight_one(args, tmp, policy, opts)
    preflight_one(args, tmp, ",".join(plain), [])


def preflight_one(args, tmp, policies, opts):
    path = os.path.join(tmp, "preflight.csv")
    write_csv(path, [(0.0, 100, 4), (0.01, 200, 4), (0.02, 50, 4)])
    report = os.path.join(tmp, "preflight.json")
    cmd = [args.metronome, "replay", "--trace", path, "--format", "csv",
           "--policy", policies, "--report", report, "--quiet"]
    if args.cost_model:
        cmd += ["--cost-model", args.cost_model]
    for kv in args.set_opt + opts:
        cmd += ["--set", kv]
    last = ""
    for attempt in range(6):
        if not os.path.exists(args.metronome):
            # Perhaps being relinked: look again a few times before giving up.
            if attempt >= 2:
                raise UsageError(f"{args.metronome}: not found (build it, or --metronome PATH)")
            time.sleep(5)
            continue
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except OSError as e:
            last = str(e)
            time.sleep(5)
            continue
        if p.returncode == 0:
            return
        last = (p.stderr or p.stdout).strip()
        if "--policy" in last or "--set" in last or "--cost-model" in last:
            break
        time.sleep(5)
    raise UsageError(f"replay refused the options: {last}")


def main(argv):
    t_start = time.monotonic()
    try:
        args = parse_args(argv)
    except UsageError as e:
        print(f"policy_check.py: {e}", file=sys.stderr)
        return EXIT_USAGE

    if args.validate_json:
        probs = validate_json(args.validate_json, args.names, args.loads, args.policies)
        for p in probs:
            print(f"policy_check.py: {p}", file=sys.stderr)
        if not probs:
            print(f"{args.validate_json}: {len(args.names)} workloads x {len(args.loads)} loads "
                  f"x {len(args.policies)} policies, all present")
        return EXIT_ERROR if probs else EXIT_OK

    if args.json:
        # No stale figures survive a failed run (CTest checks this file).
        if os.path.exists(args.json):
            os.unlink(args.json)
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    cost_model_path = args.cost_model or os.path.join(REPO, "sim", "cost_models",
                                                      "h200-llama3-8b.json")
    tmp = tempfile.mkdtemp(prefix="policy_check-")
    runner = None
    try:
        try:
            preflight(args, tmp)
            wls = build_workloads(args.names, args.traces, tmp, args.max_requests, args.seed)
        except UsageError as e:
            print(f"policy_check.py: {e}", file=sys.stderr)
            return EXIT_USAGE
        runner = Runner(args, tmp)
        tol = BISECT_TOL_QUICK if args.quick else BISECT_TOL_FULL
        log(f"policy_check: {', '.join(args.policies)} vs fcfs on {len(args.names)} workloads "
            f"(set {args.which}{', quick' if args.quick else ''}), {args.jobs} jobs")
        # One driver thread per workload; the runner's pool bounds the replays.
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(args.names)) as drivers:
            futs = {n: drivers.submit(check_workload, runner, n, wls[n], args.policies,
                                      args.loads, tol, cost_model_path) for n in args.names}
            results, errors = [], []
            for n in args.names:
                try:
                    results.append(futs[n].result())
                except ReplayError as e:
                    errors.append(f"{n}: {e}")
                    log(f"policy_check.py: {n}: {e}")
        elapsed = time.monotonic() - t_start

        for res in results:
            for p in args.policies:
                print_table(res, p, args.markdown)
        if args.markdown and results:
            print("**Knees** (smallest rate scale where fcfs P95 TTFT >= 4x unloaded)\n")
            print("| workload | set | requests | knee rate scale | unloaded TTFT P50 / P95 (ms) "
                  "| fcfs busy at knee |")
            print("|---|---|---|---|---|---|")
            for res in results:
                print(f"| {res['name']} | {res['set']} | {res['requests']} "
                      f"| {res['knee']['rate_scale']:.4g} | {fmt_ms(res['unloaded_ttft_p50_ms'])} / "
                      f"{fmt_ms(res['unloaded_ttft_p95_ms'])} "
                      f"| {res['loads'][-1]['fcfs']['busy_fraction']:.2f} |")
            print()
        else:
            print("Knees (fcfs P95 TTFT first >= 4x unloaded):")
        for res in results if not args.markdown else []:
            print(f"  {res['name']:22s} [{res['set']:7s}] rate scale {res['knee']['rate_scale']:<9.5g}"
                  f" unloaded P95 TTFT {fmt_ms(res['unloaded_ttft_p95_ms'])} ms,"
                  f" fcfs busy {res['loads'][-1]['fcfs']['busy_fraction']:.2f} at the knee")
        if args.markdown and results:
            print_comparison(results, args.policies)
        lines = summary_lines(results, args.policies, args.markdown)
        ok = not errors and all(r["verdict"][p]["pass"] for r in results for p in args.policies)
        tail = (f"[{runner.count} replays, {runner.seconds:.0f} s of replay, "
                f"{elapsed:.0f} s wall, {args.jobs} jobs]")
        if errors:
            lines.append(f"ERROR: {len(errors)} workload(s) did not complete")
        for l in lines:
            print(l)
        print(("PASS" if ok else ("ERROR" if errors else "FAIL")) + " " + tail)
        if args.json:
            doc = {
                "tool": "tools/policy_check.py",
                "policies": args.policies, "baseline": "fcfs", "set": args.which,
                "quick": args.quick, "max_requests": args.max_requests, "seed": args.seed,
                "cost_model": args.cost_model, "set_opt": args.set_opt,
                "candidates": {k: {"policy": v[0], "set": v[1]}
                               for k, v in args.candidates.items()},
                "loads": list(args.loads),
                "thresholds": {"knee_factor": KNEE_FACTOR, "harm_ttft": HARM_TTFT,
                               "harm_e2e": HARM_E2E, "harm_throughput": HARM_TPUT,
                               "win_ttft": WIN_TTFT, "win_e2e": WIN_E2E,
                               "certainty_p95_over_p50": CERTAINTY_RATIO,
                               "certainty_load": CERTAINTY_LOAD},
                "workloads": results, "errors": errors, "summary": lines, "pass": ok,
                "replays": runner.count, "replay_seconds": round(runner.seconds, 1),
                "elapsed_s": round(elapsed, 1),
            }
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
        if errors:
            return EXIT_ERROR
        if ok or args.no_fail:
            return EXIT_OK
        return EXIT_FAIL
    finally:
        if runner is not None:
            runner.pool.shutdown(wait=False, cancel_futures=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
