#!/usr/bin/env bash
# Two data-parallel replicas sharing one GPU (issue 38, item 1), under the
# live load client: the llama3-8b shape served by `metronome serve --device
# cuda:0 --data-parallel 2` and by one replica alone, the same chat workload
# sent to each by `metronome bench-serve`. Checks that no request is lost
# (every one succeeds) and that /metrics has each replica's series.
#
#   bench/serve/replicas_h200.sh BIN_DIR TOKENIZER_DIR CORPUS OUT_DIR
#
# BIN_DIR holds metronome and lib/ (its non-CUDA shared libraries).
# Reports: OUT_DIR/replicas-N.json (bench-serve), metrics-N.txt, serve-N.log.
set -uo pipefail
bin=$1 tok=$2 corpus=$3 out=$4
secs=${METRONOME_REPLICA_SECONDS:-25}
rate=${METRONOME_REPLICA_RATE:-12}
work=${METRONOME_LIVE_WORK:-/tmp/metronome-replicas}
mkdir -p "$out" "$work" || exit 2
. "$(cd "$(dirname "$0")/../.." && pwd)/tools/device/binary_env.sh" "$bin"
. "$(dirname "$0")/serve_up.sh"
m="$bin/metronome"
stamp() { echo "== [${SECONDS} s] $*"; }

model=$work/llama3-8b
if [ ! -e "$model/config.json" ]; then
  stamp "make-model llama3-8b"
  "$m" make-model --preset llama3-8b --seed 1 --force --tokenizer "$tok" --out "$model" >/dev/null || exit 1
fi
workload="poisson:rate=$rate,prompt=uniform:130:900,output=uniform:64:448,duration=$secs,seed=1"
port=18190
status=0
for n in 1 2; do
  port=$((port + 1))
  stamp "serve, $n replica(s)"
  "$m" serve --model "$model" --device cuda:0 --data-parallel $n --port $port \
    > "$out/serve-$n.log" 2>&1 &
  pid=$!
  serve_up $pid $port "$out/serve-$n.log" || { status=1; continue; }
  # /health is 200 once one replica is up; replicas of one device start one
  # at a time, so wait for all of them (up to 120 s) before measuring.
  for _ in $(seq 1 240); do
    up=$(curl -s "localhost:$port/metrics" | grep -c '^metronome:replica_up{.*} 1' || true)
    [ $n -eq 1 ] || [ "${up:-0}" -ge $n ] && break
    sleep 0.5
  done
  stamp "bench-serve, $n replica(s)"
  "$m" bench-serve --url "http://127.0.0.1:$port" --tokenizer "$tok" --corpus "$corpus" \
    --workload "$workload" --label "replicas-$n" --quiet --report "$out/replicas-$n.json" 2>&1 | tail -3
  curl -s "localhost:$port/metrics" > "$out/metrics-$n.txt"
  kill -TERM $pid
  wait $pid
  python3 - "$out/replicas-$n.json" "$out/metrics-$n.txt" "$n" <<'PY' || status=1
import json, re, sys
r = json.load(open(sys.argv[1]))
metrics = open(sys.argv[2]).read()
n = int(sys.argv[3])
f = lambda k: "%.1f / %.1f" % (r[k]["p50"], r[k]["p95"])
print(f"  {n} replica(s): sent {r.get('requests')} ok {r.get('succeeded')} failed {r.get('failed')}"
      f"  TTFT {f('ttft_ms')}  ITL {f('itl_ms')}  out tok/s {r['throughput_tokens_per_s']:.0f}")
ok = r.get("failed", 1) == 0 and r.get("succeeded", 0) > 0
routed = {}
for m in re.finditer(r'^(metronome:\w*routed\w*)\{[^}]*replica="(\d+)"[^}]*\}\s+(\S+)', metrics, re.M):
    routed[m.group(2)] = float(m.group(3))
print("  routed per replica:", routed or "(no per-replica series)")
if n > 1:
    ok = ok and len(routed) == n and all(v > 0 for v in routed.values())
print("  PASS" if ok else "  FAIL")
sys.exit(0 if ok else 1)
PY
done
stamp "done (status $status)"
exit $status
