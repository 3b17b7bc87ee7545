#!/usr/bin/env bash
# Regenerates the golden files on a machine with torch + transformers (the GPU
# machine): makes each tiny preset with the carried metronome binary, then runs
# hf_reference.py and hf_logprobs.py on it. Usage: tools/golden/make_goldens.sh METRONOME_BIN OUT_DIR
set -euo pipefail
bin=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
for preset in tiny-llama3 tiny-qwen2 tiny-mistral; do
  "$bin" make-model --preset "$preset" --seed 7 --out "$work/$preset"
  python3 "$here/hf_reference.py" --model "$work/$preset" --name "$preset" --seed 7 \
    --out "$out/$preset.json"
  python3 "$here/hf_logprobs.py" --model "$work/$preset" --name "$preset" \
    --out "$out/$preset-logprobs.json"
done
