#!/usr/bin/env python3
"""Merges the GPU benchmark's row files (gpu_bench and gpu_hf_bench.py) into
one JSON list and prints a markdown table with the issue's targets.

    gpu_report.py --out results.json --table table.md rows-*.json hf-*.json
    gpu_report.py --grid-out grid.json --grid llama3-8b=grid-8b.json ...
"""

import argparse
import json
import sys

# (model, metric) -> (kind, bound): "fraction_min": floor / value >= bound;
# "max": value <= bound; "floor_ratio_max": value <= bound * floor.
TARGETS = {
    ("llama3-8b", "decode_bs1_ms_ctx128"): ("fraction_min", 0.85),
    ("llama3-8b", "decode_bs1_ms_ctx4096"): ("fraction_min", 0.85),
    ("llama3-1b", "decode_bs1_ms_ctx128"): ("fraction_min", 0.70),
    ("llama3-1b", "decode_bs1_ms_ctx4096"): ("fraction_min", 0.70),
    ("llama3-8b", "decode_bs64_over_bs1_ctx1024"): ("max", 1.6),
    ("llama3-1b", "decode_bs64_over_bs1_ctx1024"): ("max", 1.6),
    ("llama3-8b", "prefill_ms_2048"): ("floor_ratio_max", 1.4),
}


def verdict(model, metric, value, floor):
    # A variant ("llama3-8b/fp8-kv", "llama3-8b/v1") is held to its shape's
    # targets, against its own floor.
    t = TARGETS.get((model.split("/")[0], metric))
    if t is None or value is None:
        return ""
    kind, bound = t
    if kind == "fraction_min":
        ok = floor is not None and floor / value >= bound
        return f"{'met' if ok else 'MISSED'} (>= {bound:.0%} of floor: {floor / value:.0%})"
    if kind == "max":
        return f"{'met' if value <= bound else 'MISSED'} (<= {bound}x)"
    ok = floor is not None and value <= bound * floor
    return f"{'met' if ok else 'MISSED'} (<= {bound}x floor: {value / floor:.2f}x)"


def fmt(v):
    if v is None:
        return "n/a"
    return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--table")
    ap.add_argument("--grid-out")
    ap.add_argument("--grid", action="append", default=[], help="MODEL=grid.json")
    ap.add_argument("rows", nargs="*")
    a = ap.parse_args()

    rows = []
    for path in a.rows:
        try:
            with open(path) as f:
                rows.extend(json.load(f))
        except (OSError, ValueError) as e:
            print(f"gpu_report: skipping {path}: {e}", file=sys.stderr)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)

    if a.grid_out:
        merged = []
        for spec in a.grid:
            model, path = spec.split("=", 1)
            try:
                with open(path) as f:
                    for r in json.load(f):
                        merged.append(dict(model=model, **r))
            except (OSError, ValueError) as e:
                print(f"gpu_report: skipping {path}: {e}", file=sys.stderr)
        with open(a.grid_out, "w") as f:
            json.dump(merged, f, indent=1)

    # One line per (model, metric): metronome with its floor, then the peers.
    engines = ["hf-eager", "hf-static-compile"]
    keyed = {}
    order = []
    for r in rows:
        key = (r["model"], r["metric"])
        if key not in keyed:
            keyed[key] = {}
            order.append(key)
        keyed[key][r["engine"]] = r
    lines = ["| model | metric | metronome | unit | floor | of floor | hf eager | hf static+compile | target |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key in order:
        by = keyed[key]
        m = by.get("metronome")
        if m is None:
            continue
        v, fl = m["value"], m.get("floor")
        frac = ""
        if v and fl and m["unit"] == "ms":
            frac = f"{fl / v:.0%}"
        peers = [fmt(by[e]["value"]) if e in by else "" for e in engines]
        lines.append(f"| {key[0]} | {key[1]} | {fmt(v)} | {m['unit']} | {fmt(fl)} | {frac} | "
                     f"{peers[0]} | {peers[1]} | {verdict(key[0], key[1], v, fl)} |")
    # Per-kernel timings against their own floors.
    klines = []
    for r in rows:
        if r["engine"] != "metronome-kernel" or r["value"] is None:
            continue
        fl = r.get("floor")
        share = f"{fl / r['value']:.0%}" if fl else ""
        klines.append(f"| {r['model']} | {r['metric']} | {fmt(r['value'])} | {fmt(fl)} | {share} |")
    if klines:
        lines += ["", "| model | kernel | us | floor us | of floor |", "|---|---|---|---|---|"] + klines
    table = "\n".join(lines) + "\n"
    print(table)
    if a.table:
        with open(a.table, "w") as f:
            f.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
