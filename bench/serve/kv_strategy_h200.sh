#!/usr/bin/env bash
# The KV strategies side by side under live load on the GPU machine: the
# llama3-8b shape served by `metronome serve --device cuda:0` once with
# engine.kv_strategy paged and once bucketed, each sent the same chat mix
# (prompts of 130-900 tokens, outputs of 64-448, Poisson 21/s, 20 s) by
# `metronome bench-serve`. Reports: OUT_DIR/live-STRATEGY.json and the
# server's /metrics after each (kv_bucket_* counters).
#
#   bench/serve/kv_strategy_h200.sh BIN_DIR TOKENIZER_DIR OUT_DIR
#
# BIN_DIR holds metronome and lib/ (its non-CUDA shared libraries).
set -uo pipefail
bin=$1 tok=$2 out=$3
corpus=${METRONOME_LIVE_CORPUS:-$tok/../corpora/moby_dick.txt}
work=${METRONOME_LIVE_WORK:-/tmp/metronome-live}
mkdir -p "$out" "$work" || exit 2
. "$(cd "$(dirname "$0")/../.." && pwd)/tools/device/binary_env.sh" "$bin"
. "$(dirname "$0")/serve_up.sh"
m="$bin/metronome"
model=$work/llama3-8b
[ -e "$model/config.json" ] \
  || "$m" make-model --preset llama3-8b --seed 1 --tokenizer "$tok/llama3" --out "$model" >/dev/null \
  || exit 1
port=18200
for st in paged bucketed; do
  port=$((port + 1))
  "$m" serve --model "$model" --device cuda:0 --port $port --set engine.kv_strategy=$st \
    > "$out/serve-$st.log" 2>&1 &
  pid=$!
  serve_up $pid $port "$out/serve-$st.log" || continue
  # Warm-up outside the figures, then the measured run on its own prompts.
  "$m" bench-serve --url "http://127.0.0.1:$port" --tokenizer "$tok/llama3" --corpus "$corpus" \
    --workload "poisson:rate=10,prompt=uniform:130:900,output=uniform:16:64,n=30,seed=99" \
    --quiet --report "$work/warmup.json" >/dev/null 2>&1
  "$m" bench-serve --url "http://127.0.0.1:$port" --tokenizer "$tok/llama3" --corpus "$corpus" \
    --corpus-offset 100003 --label "$st" --quiet --report "$out/live-$st.json" \
    --workload "poisson:rate=21,prompt=uniform:130:900,output=uniform:64:448,duration=20,seed=1"
  curl -s "localhost:$port/metrics" > "$out/metrics-$st.txt"
  grep -E "^metronome:(kv_bucket|num_preemptions)" "$out/metrics-$st.txt"
  kill -TERM $pid
  wait $pid
done
