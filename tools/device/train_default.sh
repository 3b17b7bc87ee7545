#!/usr/bin/env bash
# Trains metronome-tiny, the default model, on the GPU machine and scores it
# with transformers: tools/train_default_model.py, then
# tools/golden/default_model_reference.py (docs/default-model.md).
#   tools/device/train_default.sh CORPORA_DIR [OUT_DIR] [-- extra training arguments]
# OUT_DIR defaults to $OUT. Writes there (5 files, each under 16 MiB):
#   run.log                    everything both scripts printed
#   training_report.json       shape, steps, tokens, time, tokens/s, loss curve
#   model.safetensors          the weights (models/metronome-tiny/)
#   metronome-tiny-files.tar   the folder's other files (config.json,
#                              generation_config.json, tokenizer.json,
#                              tokenizer_config.json, metronome.json)
#   default-model.json         the golden file (tools/golden/default-model.json)
# The model is copied out before the reference runs. Exits non-zero at the
# first failure; what was written so far stays in OUT_DIR.
# tools/device/install_default_model.sh OUT_DIR puts it all in the checkout.
# METRONOME_TRAIN_SMOKE=1 runs the whole flow on a CPU without tokenizers or
# transformers (the scripts' --smoke modes), to test this script.
set -uo pipefail
corpora=${1:?usage: tools/device/train_default.sh CORPORA_DIR [OUT_DIR] [-- training args]}
shift
out=${OUT:-}
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  out=$1
  shift
fi
[ "${1:-}" = "--" ] && shift
[ -n "$out" ] || { echo "train_default.sh: no OUT_DIR and \$OUT is not set" >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$out" || exit 2
log="$out/run.log"
: > "$log"
export PYTHONUNBUFFERED=1
say() { printf '%s\n' "$*" | tee -a "$log"; }
stamp() { say ""; say "== $(date -u +%H:%M:%S)  $*"; }
# Runs a command with its output on the terminal and in run.log; its status.
logged() {
  "$@" 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}

stamp "checks"
for f in kjv_bible.txt moby_dick.txt sotu_all.txt tinyshakespeare.txt; do
  [ -s "$corpora/$f" ] || { say "FAILED: $corpora/$f is missing"; exit 2; }
done
smoke=${METRONOME_TRAIN_SMOKE:-}
train_extra=() ref_extra=()
[ -n "$smoke" ] && train_extra=(--smoke) ref_extra=(--smoke-without-transformers)
if [ -z "$smoke" ]; then
  logged python3 -c '
import sys
import numpy, torch, tokenizers, transformers
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"tokenizers {tokenizers.__version__}, transformers {transformers.__version__}")
assert torch.cuda.is_available(), "torch sees no CUDA device"
print("device:", torch.cuda.get_device_name(0))
' || { say "FAILED: a Python package or the GPU is missing"; exit 2; }
  logged nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu \
    --format=csv,noheader || true
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

stamp "training (tools/train_default_model.py)"
logged python3 -u "$root/tools/train_default_model.py" --corpora "$corpora" --out "$work" \
  "${train_extra[@]}" "$@" || { say "FAILED: training"; exit 1; }
model="$work/metronome-tiny"
logged ls -l "$model"
# The model leaves first: it comes back even if the reference runs out of time.
cp "$work/training_report.json" "$model/model.safetensors" "$out/" || exit 1
tar -C "$work" -cf "$out/metronome-tiny-files.tar" --exclude=model.safetensors metronome-tiny \
  || exit 1

stamp "reference (tools/golden/default_model_reference.py)"
logged python3 -u "$root/tools/golden/default_model_reference.py" --model "$model" \
  --held-out "$work/held_out.json" --report "$work/training_report.json" \
  --out "$out/default-model.json" "${ref_extra[@]}"
ref_rc=$?
logged ls -l "$out"
[ $ref_rc -eq 0 ] || { say "FAILED: the reference script (exit $ref_rc)"; exit $ref_rc; }
stamp "done"
