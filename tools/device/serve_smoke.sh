#!/usr/bin/env bash
# The whole server on the GPU machine: `metronome generate` and `metronome
# serve` with --device cuda:0 on the three tiny families (greedy ids against
# the CPU engine; again with the fp8 KV cache), then the llama3-8b shape
# served over HTTP with streaming latency measured by a client (TTFT,
# inter-token gaps), with the bf16 and the fp8 KV cache.
#   tools/device/serve_smoke.sh BIN_DIR TOKENIZER_DIR OUT_DIR
# BIN_DIR holds metronome and lib/ (its non-CUDA shared libraries);
# TOKENIZER_DIR holds llama3/, qwen3/, mistral/ tokenizer folders.
set -uo pipefail
bin=$1
tok=$2
out=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
mkdir -p "$out" || exit 2
. "$here/binary_env.sh" "$bin"
m="$bin/metronome"
say() { printf '\n== %s\n' "$*"; }

same_ids() { # ids-a ids-b
  python3 -c "a=$1; b=$2; print(sum(x==y for x,y in zip(a,b)), 'of', len(a), 'equal; first difference at', next((i for i,(x,y) in enumerate(zip(a,b)) if x!=y), None))"
}
ids_of() { python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])'; }

# 4-bit weights: GPTQ and AWQ checkpoints (the goldens' folders, made by
# tools/golden from transformers) and --quantize int4, CPU against cuda:0,
# then the 8B shape served in 4 bits. METRONOME_SMOKE=int4 runs this part alone;
# METRONOME_SMOKE_8B names an 8B-shape folder made earlier (else made here).
smoke_int4() {
  say "generate, 4-bit checkpoints: the goldens' prompts, greedy, CPU and cuda:0 vs transformers"
  tar -xJf "$here/../golden/int4_goldens.tar.xz" -C "$work"
  for v in gptq-g128-sym gptq-actorder-g32-asym awq-g128; do
    local g="$work/int4_goldens/$v.json"
    local prompt n want
    prompt=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['runs'][0]['prompt'])))" "$g")
    want=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['runs'][0]['greedy_ids'])" "$g")
    n=$(python3 -c "print(len($want))")
    local args=(generate --model "$work/int4_goldens/$v" --prompt-ids "$prompt" -n "$n"
                --temperature 0 --ignore-eos --json)
    echo "$v, cpu: $(same_ids "$want" "$("$m" "${args[@]}" | ids_of)")"
    echo "$v, cuda:0: $(same_ids "$want" "$("$m" "${args[@]}" --device cuda:0 | ids_of)")"
  done
  say "serve --device cuda:0, llama3-8b shape, --quantize int4"
  local m8=${METRONOME_SMOKE_8B:-$work/llama3-8b}
  [ -e "$m8/config.json" ] ||
    "$m" make-model --preset llama3-8b --seed 1 --tokenizer "$tok/llama3" --out "$m8" >/dev/null
  serve_and_probe "$m8" 18083 --set engine.max_batch_size=64 --quantize int4
}

serve_and_probe() { # model_dir port extra-args...
  local dir=$1 port=$2; shift 2
  "$m" serve --model "$dir" --device cuda:0 --port "$port" "$@" > "$out/serve-$port.log" 2>&1 &
  local pid=$!
  local up=0
  for _ in $(seq 1 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$port/health")" = 200 ] && { up=1; break; }
    kill -0 $pid 2>/dev/null || break # it exited: its log says why
    sleep 0.5
  done
  if [ $up = 0 ]; then
    echo "the server on port $port did not come up; its log:"
    tail -5 "$out/serve-$port.log"
    kill -TERM $pid 2>/dev/null; wait $pid
    return 1
  fi
  python3 "$here/stream_probe.py" "localhost:$port" "$@" 2>&1
  curl -s "localhost:$port/metrics" | grep -E '^metronome:(kv_cache_usage_perc|num_requests_running|request_actors_alive|request_success_total|time_to_first_token_seconds_(sum|count)|inter_token_latency_seconds_(sum|count)|step_duration_seconds_(sum|count))' 
  kill -TERM $pid; wait $pid
  grep -E "executor ready|error|warn" "$out/serve-$port.log" | head -5
}

if [ "${METRONOME_SMOKE:-all}" = int4 ]; then
  smoke_int4
  rm -rf "$work"
  exit 0
fi

say "generate: CPU vs cuda:0, greedy, 24 tokens"
for spec in "tiny-llama3 llama3" "tiny-qwen2 qwen3" "tiny-mistral mistral"; do
  set -- $spec
  "$m" make-model --preset "$1" --seed 7 --tokenizer "$tok/$2" --out "$work/$1" >/dev/null
  cpu=$("$m" generate --model "$work/$1" --prompt "The history of the city begins" -n 24 \
        --temperature 0 --ignore-eos --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')
  gpu=$("$m" generate --model "$work/$1" --prompt "The history of the city begins" -n 24 \
        --temperature 0 --ignore-eos --json --device cuda:0 | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')
  same=$(python3 -c "a=$cpu; b=$gpu; print(sum(x==y for x,y in zip(a,b)), 'of', len(a), 'equal; first difference at', next((i for i,(x,y) in enumerate(zip(a,b)) if x!=y), None))")
  echo "$1: $same"
  gpu8=$("$m" generate --model "$work/$1" --prompt "The history of the city begins" -n 24 \
        --temperature 0 --ignore-eos --json --device cuda:0 --kv-cache-dtype fp8 | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')
  same=$(python3 -c "a=$cpu; b=$gpu8; print(sum(x==y for x,y in zip(a,b)), 'of', len(a), 'equal; first difference at', next((i for i,(x,y) in enumerate(zip(a,b)) if x!=y), None))")
  echo "$1, fp8 KV cache: $same"
done

say "serve --device cuda:0, tiny-llama3"
serve_and_probe "$work/tiny-llama3" 18080

say "serve --device cuda:0, llama3-8b shape"
"$m" make-model --preset llama3-8b --seed 1 --tokenizer "$tok/llama3" --out "$work/llama3-8b" >/dev/null
serve_and_probe "$work/llama3-8b" 18081 --set engine.max_batch_size=64

say "serve --device cuda:0, llama3-8b shape, fp8 KV cache"
serve_and_probe "$work/llama3-8b" 18082 --set engine.max_batch_size=64 --kv-cache-dtype fp8
smoke_int4
rm -rf "$work"
