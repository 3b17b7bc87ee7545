#!/usr/bin/env bash
# Puts what tools/device/train_default.sh left in its OUT_DIR into the
# checkout: models/metronome-tiny/ (the folder CMake copies to
# build/models/default) and tools/golden/default-model.json (the golden file
# of tests/model/default_model_test.cpp). Checks the folder against the
# golden file's sha256 sums and the 16 MiB limit first.
#   tools/device/install_default_model.sh OUT_DIR
set -euo pipefail
from=${1:?usage: tools/device/install_default_model.sh OUT_DIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
for f in model.safetensors metronome-tiny-files.tar default-model.json training_report.json; do
  [ -s "$from/$f" ] || { echo "install_default_model.sh: no $from/$f" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -C "$work" -xf "$from/metronome-tiny-files.tar"
cp "$from/model.safetensors" "$work/metronome-tiny/"
python3 - "$work/metronome-tiny" "$from/default-model.json" <<'PY'
import hashlib, json, os, sys
folder, golden = sys.argv[1], json.load(open(sys.argv[2]))
def sha(name):
    return hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
assert sha("model.safetensors") == golden["weights_sha256"], "weights differ from the golden file's"
assert sha("tokenizer.json") == golden["tokenizer_sha256"], "tokenizer differs from the golden file's"
size = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
assert size <= 16 * 2**20, f"{size} bytes: over 16 MiB"
print(f"{folder}: {sorted(os.listdir(folder))}, {size / 2**20:.2f} MiB")
PY
rm -rf "$root/models/metronome-tiny"
rm -f "$root/tools/golden/default-model.json"
mkdir -p "$root/models"
cp -r "$work/metronome-tiny" "$root/models/metronome-tiny"
cp "$from/default-model.json" "$root/tools/golden/default-model.json"
# A device run's files come back read-only; the copies need not be.
chmod -R u+w "$root/models/metronome-tiny" "$root/tools/golden/default-model.json"
echo "installed models/metronome-tiny and tools/golden/default-model.json; rebuild (the build"
echo "reconfigures and copies the model to build/models/default), then run"
echo "  ctest --test-dir build -R 'default_model' --output-on-failure"
