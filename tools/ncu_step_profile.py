#!/usr/bin/env python3
"""Per-kernel device time of one captured decode step, from Nsight Compute.

bench/gpu/run_h200.sh's `profile` step runs gpu_bench under
`ncu --profile-from-start off` with METRONOME_PROFILE_BATCH=<batch>: the
engine replays that batch size's graph once more on the last step's inputs
inside a profiler range (decode_graph_cache::time), so ncu measures exactly the
kernels of one real step, each on its own (ncu serialises them, so a kernel's
time includes its own ramp-up and tail but no overlap with its neighbours).

  ncu_step_profile.py CSV... [--json OUT]

For each CSV (ncu --csv --page raw with gpu__time_duration.sum,
dram__bytes_read.sum, launch__grid_size) it prints the kernels grouped by
name (count, total and mean time, DRAM bytes and the rate they were read at)
and the first --first kernels in launch order (the default 14 is a layer and
a half on the cuBLAS path, two and a half on the GEMV path), and writes all
of it as JSON with --json. A CSV without a table is reported and skipped.
"""
import argparse
import collections
import csv
import json
import re
import sys

TIME = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
BYTES = {"B": 1e-6, "byte": 1e-6, "KB": 1e-3, "Kbyte": 1e-3, "MB": 1.0, "Mbyte": 1.0,
         "GB": 1e3, "Gbyte": 1e3}


def short_name(full):
    """`void ns::<unnamed>::gemv_split_kernel<1, 2, 1>(args)` -> `gemv_split_kernel<1, 2, 1>`."""
    name = full.replace("<unnamed>::", "").replace("(anonymous namespace)::", "")
    name = re.sub(r"\(.*$", "", name)
    name = re.sub(r"^void\s+", "", name)
    head, _, args = name.partition("<")
    return head.split("::")[-1] + ("<" + args if args else "")


def read(path):
    rows = list(csv.reader(open(path, newline="")))
    try:
        start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    except StopIteration:
        print(f"{path}: no ncu table (did the profiled range run?)", file=sys.stderr)
        return None
    head, units = rows[start], rows[start + 1]
    col = {k: head.index(k) for k in ("Kernel Name", "gpu__time_duration.sum",
                                      "dram__bytes_read.sum", "launch__grid_size")}
    t_scale = TIME[units[col["gpu__time_duration.sum"]]]
    b_scale = BYTES[units[col["dram__bytes_read.sum"]]]
    kernels = []
    for r in rows[start + 2:]:
        if len(r) < len(head):
            continue
        kernels.append({
            "kernel": short_name(r[col["Kernel Name"]]),
            "us": float(r[col["gpu__time_duration.sum"]].replace(",", "")) * t_scale,
            "mb_read": float(r[col["dram__bytes_read.sum"]].replace(",", "")) * b_scale,
            "grid": int(float(r[col["launch__grid_size"]].replace(",", ""))),
        })
    return kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--json", help="write the grouped and ordered kernels here")
    ap.add_argument("--first", type=int, default=14, help="kernels listed in launch order")
    a = ap.parse_args()
    report = {}
    for path in a.csv:
        kernels = read(path)
        if kernels is None:
            continue
        groups = collections.OrderedDict()
        for k in kernels:
            g = groups.setdefault(k["kernel"], {"kernel": k["kernel"], "count": 0, "us": 0.0,
                                                "mb_read": 0.0})
            g["count"] += 1
            g["us"] += k["us"]
            g["mb_read"] += k["mb_read"]
        total = sum(k["us"] for k in kernels)
        print(f"== {path}: {len(kernels)} kernels, {total:.1f} us")
        for g in sorted(groups.values(), key=lambda g: -g["us"]):
            rate = g["mb_read"] / g["us"] * 1e3 if g["us"] else 0.0
            print(f"  {g['kernel'][:56]:56s} n={g['count']:4d} total={g['us']:9.1f} us "
                  f"mean={g['us'] / g['count']:8.2f} us  read={g['mb_read']:9.1f} MB "
                  f"at {rate:5.0f} GB/s")
        print("  in launch order:")
        for k in kernels[:a.first]:
            print(f"    {k['kernel'][:56]:56s} {k['us']:8.2f} us {k['mb_read']:8.2f} MB "
                  f"grid {k['grid']}")
        report[path] = {"total_us": total, "groups": list(groups.values()),
                        "kernels": kernels}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
