#!/usr/bin/env bash
# Prefix caching live on the GPU machine: the llama3-8b shape served by
# `metronome serve --device cuda:0` with engine.prefix_caching on, then off,
# each measured by bench/serve/prefix_h200.py (a cached 4,000-token prefix
# against its 100-token suffix alone; 32 four-turn conversations on a
# 2,000-token system prompt). Also the server's CPU time over each run
# (process utime + stime from /proc, against the wall time).
#
#   bench/serve/prefix_h200.sh BIN_DIR TOKENIZER_DIR OUT_DIR
#
# Writes OUT_DIR/prefix-V.json, serve-prefix-V.log and steps-V.csv (the
# server's step trace) for each variant V of METRONOME_PREFIX_VARIANTS
# (default "on off": the cache on, then off; "on-fcfs" / "off-fcfs": the same
# with the fcfs policy instead of the default).
set -uo pipefail
bin=$1 tok=$2 out=$3
work=${METRONOME_LIVE_WORK:-/tmp/metronome-live}
mkdir -p "$out" "$work" || exit 2
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tools/device/binary_env.sh" "$bin"
. "$(dirname "$0")/serve_up.sh"
m="$bin/metronome"
stamp() { echo "== [${SECONDS} s] $*"; }
model=$work/llama3-8b
if [ ! -e "$model/config.json" ]; then
  stamp "make-model llama3-8b"
  "$m" make-model --preset llama3-8b --seed 1 --force --tokenizer "$tok/llama3" --out "$model" >/dev/null || exit 1
fi
port=18190
for v in ${METRONOME_PREFIX_VARIANTS:-on off}; do
  port=$((port + 1))
  flag=$(case $v in on*) echo true ;; *) echo false ;; esac)
  policy=()
  case $v in *-fcfs) policy=(--policy fcfs) ;; esac
  stamp "serve, prefix caching $v"
  "$m" serve --model "$model" --device cuda:0 --port $port --served-model-name default \
    --set engine.prefix_caching=$flag --set "logging.step_trace=$out/steps-$v.csv" \
    "${policy[@]}" > "$out/serve-prefix-$v.log" 2>&1 &
  pid=$!
  serve_up $pid $port "$out/serve-prefix-$v.log" || continue
  cpu0=$(awk '{print $14 + $15}' /proc/$pid/stat); t0=$(date +%s.%N)
  python3 "$root/bench/serve/prefix_h200.py" --url "http://127.0.0.1:$port" --label "$v" \
    --out "$out/prefix-$v.json" > /dev/null || echo "prefix_h200.py failed ($v)"
  cpu1=$(awk '{print $14 + $15}' /proc/$pid/stat); t1=$(date +%s.%N)
  python3 - "$out/prefix-$v.json" "$cpu0" "$cpu1" "$t0" "$t1" "$(getconf CLK_TCK)" <<'PY'
import json, sys
p, c0, c1, t0, t1, hz = sys.argv[1:]
r = json.load(open(p))
r["server_cpu_s"] = (float(c1) - float(c0)) / float(hz)
r["wall_s"] = float(t1) - float(t0)
json.dump(r, open(p, "w"), indent=1)
cp, mt = r["cached_prefix"], r["multi_turn"]
print(f"  {r['label']}: 4,100 uncached {cp['uncached_4100_ttft_ms']:.1f} ms; cached prefix "
      f"median {sorted(cp['cached_prefix_ttft_ms'])[2]:.1f} ms vs suffix alone "
      f"{sorted(cp['suffix_alone_ttft_ms'])[2]:.1f} ms ({cp['ratio_cached_prefix_over_suffix_alone']:.2f}x)")
print(f"  multi-turn: TTFT p50/p95 {mt['ttft_ms_p50']:.1f} / {mt['ttft_ms_p95']:.1f} ms, e2e p95 "
      f"{mt['e2e_ms_p95']:.0f} ms, {mt['output_tokens_per_s']:.0f} out tok/s, cached "
      f"{100 * mt['cached_share']:.1f}% of prompt tokens, wall {mt['wall_s']:.1f} s")
print(f"  server CPU {r['server_cpu_s']:.1f} s over {r['wall_s']:.1f} s wall")
PY
  kill -TERM $pid; wait $pid
done
stamp done
