#!/usr/bin/env bash
# A/B of two builds on the device machine, in one call: the decode figures of
# both shapes (gpu_bench --decode-only --max-batch 64 --quick), the variants
# alternating, REPS rounds, one summary line per run; the rows and logs in
# $OUT/ab-runs.tar.xz (the device tool brings back at most 8 files).
#
#   bench/gpu/ab_h200.sh REPS [MODEL...]     (default: llama3-1b llama3-8b)
#
# AB_VARIANTS lists "label:binary[:VAR=VALUE,VAR=VALUE[:--arg,value,...]]"
# (default: the build
# in .device/ as "new" against .device/base/gpu_bench as "base"). The model
# folders are made on first use under /tmp/metronome-bench/models, as
# run_h200.sh makes them.
set -u
reps=${1:-2}
shift || true
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(llama3-1b llama3-8b)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-$root/out}
work=${METRONOME_BENCH_WORK:-/tmp/metronome-bench}
mkdir -p "$out" "$work/models"
cub=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcublas.so.13" ] && { cub=$d; break; }
done
export LD_LIBRARY_PATH=$root/.device/lib:$cub
for m in "${models[@]}"; do
  [ -e "$work/models/$m/config.json" ] \
    || timeout 200 "$root/.device/gpu_bench" --make-preset "$m" --make-out "$work/models/$m" >/dev/null
done
variants=(${AB_VARIANTS:-new:.device/gpu_bench base:.device/base/gpu_bench})
for rep in $(seq "$reps"); do
  for v in "${variants[@]}"; do
    for m in "${models[@]}"; do
      label=${v%%:*} rest=${v#*:}
      bin=${rest%%:*} envs=() args=()
      if [ "$rest" != "$bin" ]; then
        rest=${rest#*:}
        [ -n "${rest%%:*}" ] && IFS=, read -r -a envs <<< "${rest%%:*}"
        [ "$rest" != "${rest%%:*}" ] && IFS=, read -r -a args <<< "${rest#*:}"
      fi
      f=$out/ab-$m-$label-$rep.json
      env ${envs[@]+"${envs[@]}"} timeout 120 "$root/$bin" --model "$work/models/$m" --name "$m/$label" \
        --out "$f" --decode-only --max-batch 64 --quick ${args[@]+"${args[@]}"} > "${f%.json}.log" 2>&1 \
        || echo "FAILED: $m $label (exit $?)"
      python3 - "$f" <<'PY'
import json, sys
r = {x["metric"]: x["value"] for x in json.load(open(sys.argv[1]))}
keys = ["decode_bs1_ms_ctx128", "decode_bs1_graph_replay_ms_ctx128", "decode_bs1_ms_ctx4096",
        "decode_step_ms_bs1_ctx1024", "decode_step_ms_bs8_ctx1024", "decode_step_ms_bs32_ctx1024",
        "decode_step_ms_bs64_ctx1024", "decode_graph_replay_ms_bs64_ctx1024",
        "decode_bs64_over_bs1_ctx1024"]
short = lambda k: k.replace("decode_", "").replace("_ctx", "@").replace("graph_replay", "replay")
print(sys.argv[1].split("/")[-1], " ".join("%s=%.4g" % (short(k), r[k]) for k in keys if k in r))
PY
    done
  done
done
(cd "$out" && ls ab-*.json ab-*.log >/dev/null 2>&1 \
  && tar cJf ab-runs.tar.xz ab-*.json ab-*.log && rm -f ab-*.json ab-*.log)
