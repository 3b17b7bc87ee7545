#!/usr/bin/env python3
"""Policies at N = 1, 2, 4 replicas behind the router, in replay.

Runs `metronome replay --replicas N --policy fcfs,srpt,ladb` on one trace at
one rate scale for each N (the same arrivals for every N: more replicas take
the same load), optionally also at rate scale x N (the same load per
replica), and prints one markdown table: latency percentiles over all
requests (ms), output tokens per second, how the router spread the requests,
the prefix cache's share of prompt tokens, and the executors' mean busy
fraction; then any drift supervisor switches (it runs at N = 1 only).
This is the simulator (sim/, the fitted H200 cost model unless
--cost-model), not a live run.

    python3 tools/replay_replicas.py --metronome build/metronome \\
        --trace ../shared/testdata/traces/AzureLLMInferenceTrace_code.csv \\
        --rate-scale 0.522 --per-replica-load

The knee line above the table gives fcfs' P95 TTFT at N = 1 over its
unloaded P95 (tools/policy_check.py calls the rate scale where that reaches
4 the knee).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile


def replay(args, n, scale, report):
    cmd = [args.metronome, "replay", "--trace", args.trace, "--policy", args.policy,
           "--rate-scale", f"{scale:g}", "--replicas", str(n), "--report", report, "--quiet"]
    if args.cost_model:
        cmd += ["--cost-model", args.cost_model]
    for kv in args.set or []:
        cmd += ["--set", kv]
    subprocess.run(cmd, check=True)
    with open(report) as f:
        doc = json.load(f)
    return doc["runs"] if "runs" in doc else [doc]


def spread(run):
    placed = [r["placed"] for r in run["per_replica"]]
    return "/".join(str(p) for p in placed)


def row(n, scale, run):
    t, e = run["ttft_ms"], run["e2e_ms"]
    return (f"| {n} | {scale:g} | {run['policy']} | {t['p50']:.0f} | {t['p95']:.0f} | "
            f"{t['p99']:.0f} | {e['p50']:.0f} | {e['p95']:.0f} | "
            f"{run['throughput_tokens_per_s']:.0f} | {spread(run)} | "
            f"{100 * run['prefix_cache_hit_rate']:.1f} | {run['busy_fraction']:.2f} |")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--metronome", default="build/metronome", help="the metronome binary")
    p.add_argument("--trace", required=True, help="trace file (Azure CSV, Mooncake JSONL, CSV)")
    p.add_argument("--rate-scale", type=float, required=True,
                   help="arrival rate multiplier at N = 1 (near its knee)")
    p.add_argument("--replicas", default="1,2,4", help="replica counts (default 1,2,4)")
    p.add_argument("--policy", default="fcfs,srpt,ladb", help="policies (default fcfs,srpt,ladb)")
    p.add_argument("--per-replica-load", action="store_true",
                   help="also run each N > 1 at rate scale x N (the same load per replica)")
    p.add_argument("--cost-model", help="step-time model (default: the replay's)")
    p.add_argument("--set", action="append", help="KEY=VALUE passed to replay --set")
    args = p.parse_args(argv)
    counts = [int(x) for x in args.replicas.split(",")]
    jobs = [(n, args.rate_scale) for n in counts]
    if args.per_replica_load:
        jobs += [(n, args.rate_scale * n) for n in counts if n > 1]
    rows, switched = [], []
    knee_ratio = None
    with tempfile.TemporaryDirectory() as tmp:
        for i, (n, scale) in enumerate(jobs):
            for run in replay(args, n, scale, os.path.join(tmp, f"{i}.json")):
                rows.append(row(n, scale, run))
                if run["supervisor"]["switches"]:
                    switched.append((n, scale, run))
                if n == 1 and run["policy"] == "fcfs":
                    knee_ratio = run["ttft_ms"]["p95"] / run["unloaded"]["ttft_ms"]["p95"]
    if knee_ratio is not None:
        print(f"fcfs at N = 1, rate scale {args.rate_scale:g}: P95 TTFT {knee_ratio:.1f}x its "
              "unloaded P95\n")
    print("| N | rate scale | policy | TTFT p50 | TTFT p95 | TTFT p99 | e2e p50 | e2e p95 "
          "| tok/s | placed per replica | cached % | busy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(r)
    for n, scale, run in switched:
        print(f"\n{run['policy']} at N = {n}, rate scale {scale:g}: "
              f"{run['supervisor']['switches']} drift supervisor switches")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
