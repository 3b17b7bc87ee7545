#!/usr/bin/env python3
"""Fit the replay's step-time cost model to step times measured on a GPU.

    step_ms = base + per_decode_seq * decode_seqs + per_kv_token * decode_kv_tokens
                   + per_prefill_token * prefill_tokens
                   + per_prefill_attention_pair * prefill_attention_pairs
                   + per_mixed_kv_token * (decode_kv_tokens if the step also has a prompt chunk)
                   + per_prompt_step (if the step has a prompt chunk)

The last term is what a decode costs beyond a pure decode step when it shares
the step with a prompt chunk (the runner then attends for it in the prefill
path): on the H200 grid it is several times the pure decode's KV cost, and
most steps of a loaded engine are mixed. The prompt step term is the fixed
cost of carrying any chunk (its attention launches, the general GEMM path in
place of the decode path's fused kernels): what makes the smallest chunk a
step-time limit admits cost more than its tokens.

Input: the step-time grid of bench/gpu/gpu_bench (--grid), rows
{"kind": "decode"|"prefill"|"mixed", "num_seqs", "kv_tokens", "prefill_tokens", "ms"},
as a JSON list or an object holding it under "grid" or "rows". How each kind
maps to the model's features (what gpu_bench measures):
  decode:  num_seqs sequences decode one token each; kv_tokens is the sum of
           their contexts (each reads its context plus the new token).
  prefill: num_seqs sequences (1 in gpu_bench) compute prefill_tokens prompt
           tokens in total, ending at kv_tokens tokens of context in total, so
           each chunk starts at (kv_tokens - prefill_tokens) / num_seqs.
  mixed:   num_seqs - 1 decodes next to one prompt chunk of prefill_tokens;
           gpu_bench repeats the chunk three times on one growing sequence
           (context 0, n, 2n before it) and reports the median time and the
           KV of the last repetition, so the chunk is taken to start at
           context n and the decodes to read kv_tokens - 3n.

The fit is weighted least squares on relative error (weight 1/ms^2), by hand
(normal equations, Gaussian elimination); a coefficient that comes out
negative is dropped and the rest refitted, so every term stays physical.

    python3 tools/fit_cost_model.py bench/results/h200-step-times-2026-11-30.json \\
        -o sim/cost_models/h200-llama3-8b.json
    python3 tools/fit_cost_model.py --provisional -o sim/cost_models/h200-llama3-8b.json

Live steps: --trace CSV (repeatable) fits to the step traces that `serve`
writes with logging.step_trace (sched/step_trace.hpp), alone or with a grid:
each traced step is a row with its own features (the scheduler's step_shape,
exactly what the replay's cost model sees) and its wall time on the step
clock (--trace-time device: its device time), steps of more than
--trace-max-ms left out (a step that waited on something else). --judge CSV
(repeatable) reports the fitted model's error on other traces that took no
part in the fit (choose constants on some workloads, report others).

Rows that name a "model" (gpu_bench writes llama3-1b and llama3-8b into one
grid) are kept only for --model (default llama3-8b). --steps adds the step
figures of a later benchmark run (bench/gpu's results.json rows
{"engine": "metronome", "model", "metric", "value"}: decode_bs1_ms_ctxC,
decode_step_ms_bsB_ctxC, prefill_ms_N) as rows of the grid; with
--steps-replace those replace the grid's rows of the same kind (when the
kernels changed after the grid was measured).
"""

import argparse
import json
import math
import re
import sys

FEATURES = ["base", "per_decode_seq", "per_kv_token", "per_prefill_token",
            "per_prefill_attention_pair", "per_mixed_kv_token", "per_prompt_step"]

# The llama3-8b shape (Llama-3.1-8B) and the H200, for the provisional model
# and for the notes.
LAYERS, KV_HEADS, HEADS, HEAD_DIM = 32, 8, 32, 128
PARAMS = 8.03e9
WEIGHT_BYTES = PARAMS * 2                      # bf16
KV_BYTES_PER_TOKEN = LAYERS * 2 * KV_HEADS * HEAD_DIM * 2   # K and V, bf16: 131072
HBM_BYTES_PER_S = 4.0e12                       # achievable of 4.8 TB/s
GEMM_FLOPS_PER_S = 700e12                      # achievable bf16 dense
ATTN_FLOPS_PER_S = 350e12                      # flash attention reaches about half
DEVICE_BYTES = 139 * 2**30                     # what the H200 reports
MEMORY_FRACTION = 0.9
WORKSPACE_BYTES = 4e9                          # activations, logits, graphs
MAX_MODEL_LEN = 131072


def fail(msg):
    sys.exit("fit_cost_model: " + msg)


def features(row, where):
    for key in ("kind", "num_seqs", "kv_tokens", "prefill_tokens", "ms"):
        if key not in row:
            fail(f"{where}: missing '{key}'")
    kind = row["kind"]
    b, kv, n, ms = row["num_seqs"], row["kv_tokens"], row["prefill_tokens"], row["ms"]
    for key, v in (("num_seqs", b), ("kv_tokens", kv), ("prefill_tokens", n), ("ms", ms)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or not math.isfinite(v):
            fail(f"{where}: {key}: expected a number >= 0, got {v!r}")
    if ms <= 0:
        fail(f"{where}: ms: must be > 0")
    if kind == "decode":
        return [1.0, b, kv + b, 0.0, 0.0, 0.0, 0.0], ms
    if kind == "prefill":
        seqs = max(b, 1)
        per = n / seqs
        ctx = max(kv - n, 0) / seqs
        return [1.0, 0.0, 0.0, n, seqs * per * (ctx + (per + 1) / 2), 0.0, 1.0], ms
    if kind == "mixed":
        decodes = max(b - 1, 0)
        dkv = max(kv - 3 * n, 0) + decodes
        return [1.0, decodes, dkv, n, n * (n + (n + 1) / 2), dkv, 1.0], ms
    fail(f"{where}: kind: expected decode, prefill or mixed, got {kind!r}")


STEP_METRICS = [
    (re.compile(r"^decode_bs1_ms_ctx(\d+)$"), lambda m: ("decode", 1, int(m[1]))),
    (re.compile(r"^decode_step_ms_bs(\d+)_ctx(\d+)$"), lambda m: ("decode", int(m[1]), int(m[2]))),
    (re.compile(r"^prefill_ms_(\d+)$"), lambda m: ("prefill", 1, int(m[1]))),
]


def step_rows(path, model):
    """Grid rows from a benchmark results file's step figures."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        fail(f"{path}: {e}")
    if not isinstance(doc, list):
        fail(f"{path}: expected a list of result rows")
    rows = []
    for r in doc:
        if not isinstance(r, dict) or r.get("engine") != "metronome" or r.get("model") != model:
            continue
        for pattern, shape in STEP_METRICS:
            m = pattern.match(str(r.get("metric", "")))
            if not m:
                continue
            kind, seqs, n = shape(m)
            value = r.get("value")
            if not isinstance(value, (int, float)) or value <= 0:
                fail(f"{path}: {r.get('metric')}: value: expected a positive number")
            if kind == "decode":
                rows.append({"kind": "decode", "num_seqs": seqs, "kv_tokens": seqs * n,
                             "prefill_tokens": 0, "ms": value})
            else:
                rows.append({"kind": "prefill", "num_seqs": 1, "kv_tokens": n,
                             "prefill_tokens": n, "ms": value})
    if not rows:
        fail(f"{path}: no step figures of model {model}")
    return rows


TRACE_COLUMNS = ("decode_seqs", "decode_kv_tokens", "prefill_seqs", "prefill_tokens",
                 "prefill_attention_pairs", "wall_ms", "device_ms")


def trace_rows(path, time_key, max_ms):
    """(features, ms, kind) of each step of a step trace (CSV)."""
    import csv
    out = []
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                fail(f"{path}: not a step trace (missing columns {', '.join(missing)})")
            for line, r in enumerate(reader, start=2):
                try:
                    v = {c: float(r[c]) for c in TRACE_COLUMNS}
                except (TypeError, ValueError):
                    fail(f"{path}: line {line}: expected numbers in {', '.join(TRACE_COLUMNS)}")
                ms = v[time_key]
                if not (ms > 0 and ms <= max_ms):
                    continue
                b, kv, n = v["decode_seqs"], v["decode_kv_tokens"], v["prefill_tokens"]
                prompt = 1.0 if n > 0 else 0.0
                kind = "decode" if n == 0 else ("mixed" if b > 0 else "prefill")
                x = [1.0, b, kv, n, v["prefill_attention_pairs"], kv * prompt, prompt]
                out.append((x, ms, kind))
    except OSError as e:
        fail(f"{path}: {e}")
    if not out:
        fail(f"{path}: no steps with a {time_key} in (0, {max_ms}] ms")
    return out


def error_stats(coef, xs, ys, kinds):
    errs = {}
    signed = []
    for x, y, k in zip(xs, ys, kinds):
        e = (predict(coef, x) - y) / y
        errs.setdefault(k, []).append(abs(e))
        signed.append(e)
    every = [e for v in errs.values() for e in v]
    return {"rows": len(xs),
            "mean_abs_rel_error": sum(every) / len(every),
            "mean_rel_error": sum(signed) / len(signed),
            "max_abs_rel_error": max(every),
            "predicted_over_measured_total": sum(predict(coef, x) for x in xs) / sum(ys),
            "by_kind": {k: {"rows": len(v), "mean_abs_rel_error": sum(v) / len(v),
                            "max_abs_rel_error": max(v)} for k, v in sorted(errs.items())}}


def solve(a, y):
    """Solves the square system a x = y (lists) by Gaussian elimination."""
    n = len(y)
    m = [list(a[i]) + [y[i]] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col and m[r][col] != 0:
                f = m[r][col] / m[col][col]
                for k in range(col, n + 1):
                    m[r][k] -= f * m[col][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def fit(xs, ys, active):
    """Weighted least squares on relative error over the active features."""
    idx = [i for i in range(len(FEATURES)) if active[i]]
    # Scale columns so the normal equations are well conditioned.
    scale = [max(max(abs(x[i]) for x in xs), 1e-30) for i in idx]
    ata = [[0.0] * len(idx) for _ in idx]
    aty = [0.0] * len(idx)
    for x, y in zip(xs, ys):
        w = 1.0 / (y * y)
        row = [x[i] / s for i, s in zip(idx, scale)]
        for p in range(len(idx)):
            aty[p] += w * row[p] * y
            for q in range(len(idx)):
                ata[p][q] += w * row[p] * row[q]
    sol = solve(ata, aty)
    if sol is None:
        return None
    coef = [0.0] * len(FEATURES)
    for p, i in enumerate(idx):
        coef[i] = sol[p] / scale[p]
    return coef


def predict(coef, x):
    return sum(c * v for c, v in zip(coef, x))


def fit_nonnegative(xs, ys):
    active = [any(x[i] != 0 for x in xs) for i in range(len(FEATURES))]
    while True:
        coef = fit(xs, ys, active)
        if coef is None:
            fail("the grid does not determine the model (too few distinct rows)")
        negative = [i for i in range(len(FEATURES)) if active[i] and coef[i] < 0]
        if not negative:
            return coef
        worst = min(negative, key=lambda i: coef[i])
        if worst == 0:
            coef[0] = 0.0
        active[worst] = False


def provisional():
    base = WEIGHT_BYTES / HBM_BYTES_PER_S * 1e3 + 0.3      # weights once + launch/sampling
    per_token = 2 * PARAMS / GEMM_FLOPS_PER_S * 1e3
    # A decode's FLOPs mostly hide under the weight read: count half of them.
    per_decode = per_token / 2
    per_kv = KV_BYTES_PER_TOKEN / HBM_BYTES_PER_S * 1e3
    per_pair = 4 * HEAD_DIM * HEADS * LAYERS / ATTN_FLOPS_PER_S * 1e3
    kv_bytes = DEVICE_BYTES * MEMORY_FRACTION - WEIGHT_BYTES - WORKSPACE_BYTES
    kv_tokens = int(kv_bytes / KV_BYTES_PER_TOKEN) // 16 * 16
    # Mixed steps: no first-principles estimate (an implementation property).
    coef = [base, per_decode, per_kv, per_token, per_pair, 0.0, 0.0]
    note = ("PROVISIONAL: derived from first principles, not measured. llama3-8b shape "
            "(8.03e9 parameters, bf16, 32 layers, 8 KV heads x 128) on an H200: base = 16.06 GB "
            "of weights read once per step at ~4 TB/s + 0.3 ms launch and sampling; prompt "
            "tokens 2 x 8.03e9 FLOPs at ~700 TFLOP/s; a decoding sequence half of that (it "
            "overlaps the weight read); KV read 131072 bytes/token at ~4 TB/s; causal attention "
            "4 x 128 x 32 x 32 FLOPs per (query, key) pair at ~350 TFLOP/s; KV capacity 0.9 x "
            "139 GiB less weights and 4 GB workspace. Re-fit from the measured grid with "
            "tools/fit_cost_model.py once bench/results/h200-step-times-*.json exists.")
    return coef, kv_tokens, note, None


def grid_rows(args):
    """The rows of the step-time grid args.grid, for args.model."""
    try:
        with open(args.grid) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        fail(f"{args.grid}: {e}")
    rows = doc
    if isinstance(doc, dict):
        rows = doc.get("grid", doc.get("rows"))
    if not isinstance(rows, list) or not rows:
        fail(f"{args.grid}: expected a non-empty list of rows (or an object with 'grid')")
    rows = [r for r in rows if not isinstance(r, dict) or r.get("model", args.model) == args.model]
    if not rows:
        fail(f"{args.grid}: no rows of model {args.model}")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("grid", nargs="?", help="step-time grid JSON from bench/gpu/gpu_bench --grid")
    ap.add_argument("-o", "--out", required=True, help="cost model JSON to write")
    ap.add_argument("--provisional", action="store_true",
                    help="write the first-principles model instead of fitting")
    ap.add_argument("--name", default="h200-llama3-8b")
    ap.add_argument("--kv-cache-tokens", type=int, default=0,
                    help="KV capacity in tokens (default: from the H200's memory)")
    ap.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN)
    ap.add_argument("--device", default="NVIDIA H200",
                    help="the card the steps were measured on (written into the model)")
    ap.add_argument("--model", default="llama3-8b",
                    help="keep grid rows of this model (rows without 'model' are always kept)")
    ap.add_argument("--steps", help="benchmark results whose step figures join the grid")
    ap.add_argument("--steps-replace", action="store_true",
                    help="the --steps figures replace the grid's rows of the same kind")
    ap.add_argument("--trace", action="append", default=[],
                    help="a step trace (serve's logging.step_trace CSV) to fit to; repeatable")
    ap.add_argument("--judge", action="append", default=[],
                    help="a step trace to report the fitted model's error on (not fitted); "
                         "repeatable")
    ap.add_argument("--trace-time", choices=("wall", "device"), default="wall",
                    help="which measured time of a traced step to fit (default wall: the step "
                         "clock the replay advances)")
    ap.add_argument("--trace-max-ms", type=float, default=1000.0,
                    help="leave out traced steps longer than this")
    args = ap.parse_args()

    if args.provisional == bool(args.grid or args.trace):
        fail("give a grid file and/or --trace, or --provisional (not both)")
    time_key = args.trace_time + "_ms"
    if args.provisional:
        coef, kv_tokens, note, stats = provisional()
    else:
        rows, sources = [], []
        if args.grid:
            rows = grid_rows(args)
            sources.append(args.grid)
        if args.steps:
            extra = step_rows(args.steps, args.model)
            if args.steps_replace:
                kinds = {r["kind"] for r in extra}
                rows = [r for r in rows if r.get("kind") not in kinds]
            rows = rows + extra
            sources.append(args.steps)
        xs, ys, kinds = [], [], []
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                fail(f"{args.grid}: row {i}: expected an object")
            x, y = features(row, f"{args.grid}: row {i}")
            xs.append(x)
            ys.append(y)
            kinds.append(row["kind"])
        for path in args.trace:
            for x, y, k in trace_rows(path, time_key, args.trace_max_ms):
                xs.append(x)
                ys.append(y)
                kinds.append("live " + k)
            sources.append(f"{path} ({args.trace_time} time)")
        coef = fit_nonnegative(xs, ys)
        stats = error_stats(coef, xs, ys, kinds)
        if args.judge:
            stats["judged"] = {}
            for path in args.judge:
                rows_j = trace_rows(path, time_key, args.trace_max_ms)
                stats["judged"][path] = error_stats(coef, [r[0] for r in rows_j],
                                                    [r[1] for r in rows_j],
                                                    ["live " + r[2] for r in rows_j])
        _, kv_tokens, _, _ = provisional()
        note = (f"Fitted by tools/fit_cost_model.py to {len(xs)} steps of {args.model} measured "
                f"on the device ({', '.join(sources)}"
                + (", its figures replacing the grid's rows of the same kind" if args.steps_replace else "")
                + "); weighted least squares on relative error, coefficients >= 0.")
    if args.kv_cache_tokens > 0:
        kv_tokens = args.kv_cache_tokens
    out = {"name": args.name,
           "provisional": bool(args.provisional),
           "note": note,
           "model": "llama3-8b shape (Llama-3.1-8B), bf16",
           "device": args.device,
           "step_ms": {k: c for k, c in zip(FEATURES, coef)},
           "kv_cache_tokens": kv_tokens,
           "max_model_len": args.max_model_len}
    if stats:
        out["fit"] = stats
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"{args.out}: " + ", ".join(f"{k}={c:.4g}" for k, c in zip(FEATURES, coef))
          + (f"; mean |rel err| {stats['mean_abs_rel_error']:.3f}" if stats else " (provisional)"))
    for path, j in (stats or {}).get("judged", {}).items():
        print(f"  judged on {path}: mean |rel err| {j['mean_abs_rel_error']:.3f}, predicted / "
              f"measured time {j['predicted_over_measured_total']:.3f} ("
              + ", ".join(f"{k} {v['mean_abs_rel_error']:.3f}" for k, v in j["by_kind"].items())
              + ")")


if __name__ == "__main__":
    main()
