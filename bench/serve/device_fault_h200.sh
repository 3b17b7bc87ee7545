#!/usr/bin/env bash
# The lost-device drill on a GPU (docs/reliability.md, "Executor faults"):
# `metronome serve --device cuda:0` on the default model with
# engine.fault_injection device_fault_after:N, so that each executor's step
# N + 1 is preceded on the device by a kernel reading an unmapped address (a
# real sticky CUDA error, not a simulated one). Two streamed completions run
# at once; the drill checks what a service manager and a client see: both
# streams end with an error event and [DONE] (none hangs), /health stops
# answering 200, and the process exits 75 on its own within the drain
# deadline.
#
#   bench/serve/device_fault_h200.sh BIN_DIR OUT_DIR [STEPS_BEFORE_FAULT]
#
# Writes OUT_DIR/device-fault.log (the server's log) and prints one line per
# check; exits non-zero when one fails.
set -uo pipefail
bin=$1 out=$2 after=${3:-40}
mkdir -p "$out" || exit 2
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tools/device/binary_env.sh" "$bin"
. "$(dirname "$0")/serve_up.sh"
port=18230
log=$out/device-fault.log
"$bin/metronome" serve --model "$root/models/metronome-tiny" --device cuda:0 --port $port --set server.drain_timeout_s=5 \
  --set "engine.fault_injection=device_fault_after:$after" > "$log" 2>&1 &
pid=$!
serve_up $pid $port "$log" || exit 1
start=$(date +%s.%N)
python3 - "$port" "$out/streams.json" <<'PY'
import http.client, json, sys, threading
port, path = int(sys.argv[1]), sys.argv[2]
results = [None, None]
def stream(i):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps({"prompt": "Call me Ishmael.", "max_tokens": 400,
              "ignore_eos": True, "stream": True}), {"Content-Type": "application/json"})
    r = c.getresponse()
    body = r.read().decode(errors="replace")
    events = [l[6:] for l in body.split("\n") if l.startswith("data: ")]
    errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and "error" in json.loads(e)]
    results[i] = {"status": r.status, "chunks": len(events), "done": bool(events) and events[-1] == "[DONE]",
                  "error": errors[0] if errors else None}
ts = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
[t.start() for t in ts]; [t.join(90) for t in ts]
json.dump(results, open(path, "w"), indent=1)
print(json.dumps(results))
PY
health=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "localhost:$port/health")
rc=none
for _ in $(seq 1 60); do
  kill -0 $pid 2>/dev/null || { wait $pid; rc=$?; break; }
  sleep 0.5
done
end=$(date +%s.%N)
[ "$rc" = none ] && { kill -KILL $pid; wait $pid; }
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }
check "both streams end with an error event and [DONE]" \
  "python3 -c 'import json,sys; r=json.load(open(\"$out/streams.json\")); sys.exit(0 if all(x and x[\"error\"] and x[\"done\"] for x in r) else 1)'"
check "/health no longer answers 200 (got $health)" "[ '$health' != 200 ]"
check "the process exits 75 on its own (rc $rc, $(python3 -c "print(f'{$end - $start:.1f}')") s after the requests began)" "[ '$rc' = 75 ]"
check "the log names the lost device" "grep -q 'device lost' '$log'"
grep -E "device lost|illegal|injected|exit" "$log" | head -5
exit $fail
