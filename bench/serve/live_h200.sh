#!/usr/bin/env bash
# Policies against each other under live load on the GPU machine: the
# llama3-8b shape served by `metronome serve --device cuda:0` once per policy,
# `metronome bench-serve` sending the same workloads to each,
# and `metronome replay` of the same workloads with the cost model for the
# simulator-vs-live comparison.
#
#   bench/serve/live_h200.sh BIN_DIR TOKENIZER_DIR OUT_DIR [POLICY...]
#
# BIN_DIR holds metronome and lib/ (its non-CUDA shared libraries). POLICY
# is NAME, NAME:FACTOR (with batching.step_time_factor) or
# NAME:FACTOR:SHARE (and batching.long_step_share). Workloads
# (METRONOME_LIVE_WORKLOADS, NAME=SPEC in sim/workload.hpp's grammar) by
# default: issue 33's chat mix (prompts of 130-900 tokens cut from a corpus,
# outputs of 64-448 with ignore_eos, Poisson) at 21 and 27 requests/s, and a
# bursty mix of long and short prompts (gamma arrivals, cv 2, lognormal
# prompts around 1,200 tokens) at 22/s, near its knee in replay. Reports:
# OUT_DIR/live-POLICY-NAME.json, the server's /metrics after each (counters
# accumulate over a server's runs), sim-POLICY-NAME.json from replay. With
# METRONOME_LIVE_STEP_TRACE=1 each server also writes its step trace,
# OUT_DIR/steps-POLICY.csv (logging.step_trace; a workload's steps are the
# lines between the metronome:step_duration_seconds_count of the /metrics
# saved before and after it).
set -uo pipefail
bin=$1 tok=$2 out=$3
shift 3
policies=("$@")
[ ${#policies[@]} -eq 0 ] && policies=(fcfs ladb)
secs=${METRONOME_LIVE_SECONDS:-35}
chat="prompt=uniform:130:900,output=uniform:64:448,duration=$secs,seed=1"
mixed="prompt=lognormal:1200:1200:32:8000,output=uniform:32:320,duration=$secs,seed=3"
workloads=(${METRONOME_LIVE_WORKLOADS:-chat21=poisson:rate=21,$chat chat27=poisson:rate=27,$chat mixed22=gamma:rate=22,cv=2,$mixed})
corpus=${METRONOME_LIVE_CORPUS:-$tok/../corpora/moby_dick.txt}
work=${METRONOME_LIVE_WORK:-/tmp/metronome-live}
mkdir -p "$out" "$work" || exit 2
. "$(cd "$(dirname "$0")/../.." && pwd)/tools/device/binary_env.sh" "$bin"
. "$(dirname "$0")/serve_up.sh"
m="$bin/metronome"
stamp() { echo "== [${SECONDS} s] $*"; }

model=$work/llama3-8b
if [ ! -e "$model/config.json" ]; then
  stamp "make-model llama3-8b"
  "$m" make-model --preset llama3-8b --seed 1 --force --tokenizer "$tok/llama3" --out "$model" >/dev/null || exit 1
fi

port=18090
# A policy is NAME, NAME:FACTOR or NAME:FACTOR:SHARE (ladb with
# batching.step_time_factor and batching.long_step_share).
settings() {
  local name factor share
  IFS=: read -r name factor share <<< "$1"
  echo "--set engine.policy=$name"
  [ -n "$factor" ] && echo "--set batching.step_time_factor=$factor"
  [ -n "$share" ] && echo "--set batching.long_step_share=$share"
}
for spec in "${policies[@]}"; do
  policy=${spec/:/-f}
  policy=${policy/:/-s}
  port=$((port + 1))
  stamp "serve $policy"
  trace=()
  [ -n "${METRONOME_LIVE_STEP_TRACE:-}" ] && trace=(--set "logging.step_trace=$out/steps-$policy.csv")
  "$m" serve --model "$model" --device cuda:0 --port $port $(settings "$spec") "${trace[@]}" \
    > "$out/serve-$policy.log" 2>&1 &
  pid=$!
  serve_up $pid $port "$out/serve-$policy.log" || continue
  # A short warm-up outside the figures (first steps of each shape, cuBLAS
  # heuristics, the step-time estimator's first samples).
  "$m" bench-serve --url "http://127.0.0.1:$port" --tokenizer "$tok/llama3" --corpus "$corpus" \
    --workload "poisson:rate=10,prompt=uniform:130:900,output=uniform:16:64,n=40,seed=99" \
    --quiet --report "$work/warmup.json" >/dev/null 2>&1
  curl -s "localhost:$port/metrics" > "$out/metrics-$policy-warmup.txt"
  # Each workload from its own stretch of the corpus: the server's prefix
  # cache would otherwise serve a workload the prompts an earlier one sent.
  wi=0
  for w in "${workloads[@]}"; do
    wname=${w%%=*} spec=${w#*=}
    wi=$((wi + 1))
    stamp "bench-serve $policy, $wname"
    "$m" bench-serve --url "http://127.0.0.1:$port" --tokenizer "$tok/llama3" --corpus "$corpus" \
      --corpus-offset $((wi * 100003)) \
      --workload "$spec" --label "$policy" --slo-ttft-ms 500 --slo-tpot-ms 50 --quiet \
      --report "$out/live-$policy-$wname.json" 2>&1 | tail -3
    curl -s "localhost:$port/metrics" > "$out/metrics-$policy-$wname.txt"
    python3 - "$out/live-$policy-$wname.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
f = lambda k: "%.1f / %.1f" % (r[k]["p50"], r[k]["p95"])
print(f"  {r['policy']}: ok {r.get('succeeded')} failed {r.get('failed')}  TTFT {f('ttft_ms')}  ITL {f('itl_ms')}  e2e p95 {r['e2e_ms']['p95']:.0f}  out tok/s {r['throughput_tokens_per_s']:.0f}")
PY
  done
  kill -TERM $pid; wait $pid
  grep -E "error|warn" "$out/serve-$policy.log" | head -5
done

stamp "replay of the same workloads"
for pspec in "${policies[@]}"; do
  policy=${pspec/:/-f}
  policy=${policy/:/-s}
  IFS=: read -r name factor share <<< "$pspec"
  extra=()
  [ -n "$factor" ] && extra+=(--set "batching.step_time_factor=$factor")
  [ -n "$share" ] && extra+=(--set "batching.long_step_share=$share")
  for w in "${workloads[@]}"; do
    wname=${w%%=*} spec=${w#*=}
    "$m" replay --workload "$spec" --policy "$name" "${extra[@]}" --report "$out/sim-$policy-$wname.json" \
      ${METRONOME_LIVE_COST_MODEL:+--cost-model "$METRONOME_LIVE_COST_MODEL"} --quiet 2>&1 | tail -2
  done
done
stamp "done"
