#!/usr/bin/env bash
# The GPU executor on the H200, in one command: correctness (GPU tests,
# compute-sanitizer memcheck and racecheck), then the benchmark of the
# llama3-1b and llama3-8b shapes (made here by make-model, never carried)
# against the device's floors and against Hugging Face transformers on the
# same folders.
#
#   bench/gpu/run_h200.sh [tests] [sanitize] [bench] [grid] [kernels] [pdlon] [hf|hfeager] [quick]
#   (default: tests sanitize bench grid kernels hf). kernels: per-kernel timings;
#   pdlon: the decode figures again with programmatic dependent launch on;
#   hfeager: the transformers side without torch.compile.
#
# Binaries come from $METRONOME_DEVICE_BIN (default .device/ in the repo:
# gpu_tests, gpu_bench and lib/ with the non-CUDA shared libraries they need;
# bench/gpu/pack_device.sh fills it on the build machine). Results go to
# $OUT (default out/): log.txt, tests.json, results.json (rows
# {"engine","model","metric","value","unit","floor"}), grid.json (step times
# for the scheduler's cost model), table.md.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bin=${METRONOME_DEVICE_BIN:-$root/.device}
out=${OUT:-$root/out}
work=${METRONOME_BENCH_WORK:-/tmp/metronome-bench}
mkdir -p "$out" "$work"
exec > >(tee -a "$out/log.txt") 2>&1

# Every step gets min(its own limit, what is left of the run's budget), so the
# whole command ends inside the device call's limit with its files written.
budget=${METRONOME_RUN_BUDGET:-560}
left() { local l=$((budget - SECONDS - 15)); local cap=$1; [ $l -lt $cap ] && cap=$l; [ $cap -lt 1 ] && cap=1; echo $cap; }

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests sanitize bench grid kernels hf)
want() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
quick=""
want quick && quick="--quick"

# -- the machine ---------------------------------------------------------------------------
echo "== machine $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
cublas_dir=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s) for p in nvidia.__path__ for s in ("cu13/lib", "cublas/lib")))' 2>/dev/null); do
  if [ -e "$d/libcublas.so.13" ]; then cublas_dir=$d; break; fi
done
echo "cuBLAS from: ${cublas_dir:-not found}"
export METRONOME_SOURCE_DIR=$root METRONOME_WORK_DIR=$work/test-work
# Our binaries see the carried libraries and the device's cuBLAS; Python does not.
ldp="$bin/lib:$cublas_dir"
if env LD_LIBRARY_PATH="$ldp" "$bin/gpu_bench" --help 2>&1 | grep -q -E "GLIBCXX|not found|cannot open"; then
  ldp="$bin/lib:$bin/lib-fallback:$cublas_dir"
  echo "using the carried libstdc++"
fi
env LD_LIBRARY_PATH="$ldp" ldd "$bin/gpu_tests" | grep -E "cublas|gomp|stdc|not found"
run() { env LD_LIBRARY_PATH="$ldp" "$@"; }
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)

# -- correctness ---------------------------------------------------------------------------
status=0
if want tests; then
  echo "== gpu_tests"
  timeout $(left 240) env LD_LIBRARY_PATH="$ldp" "$bin/gpu_tests" --gtest_output=json:"$out/tests.json" \
    || { echo "gpu_tests FAILED (exit $?)"; status=1; }
fi
# -- sanitizers (quick shapes) ---------------------------------------------------------------
if want sanitize && [ -n "$sanitizer" ]; then
  echo "== compute-sanitizer memcheck (quick shapes)"
  METRONOME_GPU_TEST_QUICK=1 timeout $(left 110) env LD_LIBRARY_PATH="$ldp" "$sanitizer" --tool memcheck \
    --error-exitcode 9 --print-limit 20 "$bin/gpu_tests" \
    --gtest_filter='gpu_kernels.*:gpu_attention.*:gpu_sampling.*:presets/gpu_runner.greedy_ids_and_logits_match_transformers/*:presets/gpu_runner.a_mixed_batch*/tiny_mistral:gpu_runner_plans.*' \
    > "$work/memcheck.log" 2>&1; echo "memcheck exit $?"
  grep -E "ERROR SUMMARY|FAILED|PASSED|OK \]" "$work/memcheck.log"
  grep -m 5 -B2 -A12 -E "^========= (Invalid|Program hit|Uninit|Leaked)" "$work/memcheck.log"
  echo "== compute-sanitizer racecheck (quick shapes)"
  METRONOME_GPU_TEST_QUICK=1 timeout $(left 80) env LD_LIBRARY_PATH="$ldp" "$sanitizer" --tool racecheck \
    --racecheck-report hazard --error-exitcode 9 --print-limit 20 "$bin/gpu_tests" \
    --gtest_filter='gpu_kernels.*:gpu_attention.*:gpu_sampling.ties*' \
    > "$work/racecheck.log" 2>&1; echo "racecheck exit $?"
  grep -E "RACECHECK SUMMARY|ERROR SUMMARY|FAILED|PASSED|OK \]" "$work/racecheck.log"
  grep -m 5 -B2 -A12 -E "hazard" "$work/racecheck.log"
fi

# -- benchmark -----------------------------------------------------------------------------
rows=() grids=()
models=(llama3-1b llama3-8b)
if want bench || want hf || want hfeager; then
  for m in "${models[@]}"; do
    dir=$work/models/$m
    if [ ! -e "$dir/config.json" ]; then
      run "$bin/gpu_bench" --make-preset "$m" --make-out "$dir" || { echo "make-model $m failed"; continue; }
    fi
    if want bench; then
      g=""
      want grid && g="--grid $work/grid-$m.json" && grids+=("$m=$work/grid-$m.json")
      want kernels && g="$g --kernels"
      timeout $(left 200) env LD_LIBRARY_PATH="$ldp" "$bin/gpu_bench" --model "$dir" --name "$m" \
        --out "$work/rows-$m.json" $g $quick \
        || echo "gpu_bench $m FAILED (exit $?)"
      rows+=("$work/rows-$m.json")
    fi
    if want pdlon; then
      METRONOME_PDL=1 timeout $(left 120) env LD_LIBRARY_PATH="$ldp" "$bin/gpu_bench" --model "$dir" \
        --name "$m/pdl-on" --out "$work/rows-$m-pdlon.json" --decode-only $quick \
        || echo "gpu_bench $m (PDL on) FAILED (exit $?)"
      rows+=("$work/rows-$m-pdlon.json")
    fi
  done
  # The peer second: whatever time is left goes to it.
  for m in "${models[@]}"; do
    dir=$work/models/$m
    if want hf || want hfeager; then
      nc="--compile-contexts ${METRONOME_HF_COMPILE_CONTEXTS:-128}"
      want hfeager && nc="--no-compile"
      PYTHONUNBUFFERED=1 timeout $(left 240) python3 "$root/tools/gpu_hf_bench.py" --model "$dir" \
        --name "$m" --out "$work/hf-$m.json" --batches 8,64 $quick $nc \
        || echo "gpu_hf_bench $m FAILED (exit $?)"
      rows+=("$work/hf-$m.json")
    fi
  done
  grid_args=()
  for g in "${grids[@]}"; do grid_args+=(--grid "$g"); done
  python3 "$root/tools/gpu_report.py" --out "$out/results.json" --table "$out/table.md" \
    ${grids:+--grid-out "$out/grid.json"} "${grid_args[@]}" "${rows[@]}"
fi
echo "== done (status $status) after ${SECONDS} s"
exit $status
