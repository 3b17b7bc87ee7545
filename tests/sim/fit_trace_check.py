#!/usr/bin/env python3
"""tools/fit_cost_model.py --trace recovers the cost model a step trace was made with.

`metronome replay --step-trace` writes each simulated step with the time a
known cost model gives it; fitting to that trace must give back the model's
coefficients. It fails when the trace's columns and the replay's cost model
disagree about a step's features (the same columns serve's logging.step_trace
writes for live steps), or when the fit mishandles them.

    fit_trace_check.py METRONOME FIT_SCRIPT WORK_DIR
"""

import json
import os
import subprocess
import sys

KNOWN = {"base": 3.1, "per_decode_seq": 0.021, "per_kv_token": 4.5e-05,
         "per_prefill_token": 0.031, "per_prefill_attention_pair": 3.3e-06,
         "per_mixed_kv_token": 1.7e-05, "per_prompt_step": 0.42}


def main():
    metronome, fit_script, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "known_cost_model.json")
    with open(model, "w") as f:
        json.dump({"name": "known", "step_ms": KNOWN, "kv_cache_tokens": 400000,
                   "max_model_len": 32768}, f)
    trace = os.path.join(work, "known_steps.csv")
    # Long and short prompts at a load that mixes decodes with chunks.
    subprocess.run([metronome, "replay", "--policy", "fcfs", "--quiet",
                    "--workload", "poisson:rate=12,prompt=lognormal:900:900:16:6000,"
                                  "output=uniform:8:200,n=300,seed=5",
                    "--cost-model", model, "--step-trace", trace,
                    "--report", os.path.join(work, "known_report.json")], check=True)
    fitted_path = os.path.join(work, "fitted_cost_model.json")
    subprocess.run([sys.executable, fit_script, "--trace", trace, "-o", fitted_path], check=True)
    with open(fitted_path) as f:
        fitted = json.load(f)
    kinds = fitted["fit"]["by_kind"]
    bad = []
    for kind in ("live decode", "live mixed"):
        if kinds.get(kind, {}).get("rows", 0) < 20:
            bad.append(f"too few {kind} steps in the trace to identify the model: {kinds}")
    for k, want in KNOWN.items():
        got = fitted["step_ms"][k]
        # The trace rounds times to 0.1 us: the fit recovers to well under 1%.
        if abs(got - want) > 0.01 * want:
            bad.append(f"{k}: fitted {got:.6g}, made with {want:.6g}")
    if bad:
        print("\n".join(bad))
        return 1
    print("recovered every coefficient within 1%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
