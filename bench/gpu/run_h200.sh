#!/usr/bin/env bash
# The GPU executor on the H200, in one command: correctness (GPU tests,
# compute-sanitizer memcheck and racecheck), then the benchmark of the
# llama3-1b and llama3-8b shapes (made here by make-model, never carried)
# against the device's floors and against Hugging Face transformers on the
# same folders.
#
#   bench/gpu/run_h200.sh [tests] [sanitize|memcheck] [bench] [fp8] [grid] [kernels] [v1] [pdlon] [pdllate] [pdloff]
#                         [paths] [sweep] [ncu] [profile] [mixed] [hf|hfeager] [quick]
#   (default: tests sanitize bench grid kernels hf). kernels: per-kernel timings
#   (both kernel generations); v1: the target figures again with the first
#   generation of the GEMV and attention kernels (METRONOME_KERNELS), as model
#   "<name>/v1", for a before/after in one run; fp8: the target figures again
#   with the fp8 KV cache (engine.kv_cache_dtype: fp8), as model "<name>/fp8-kv",
#   each against the floor of that cache's bytes; pdlon: the decode figures again
#   with programmatic dependent launch on (and the runner tests with it);
#   pdllate: the runner tests with PDL on and late triggers (METRONOME_PDL=late);
#   pdloff: the runner tests and the target figures with PDL off everywhere
#   (METRONOME_PDL=0, model "<name>/pdl-off"; the default, auto, turns it on
#   for prompt steps and lets the engine choose per decode graph);
#   paths: the decode figures again with every decode projection on cuBLAS
#   ("<name>/cublas-path") and on the skinny GEMM ("<name>/skinny-path"),
#   against the default per-size choice; sweep: the decode figures once per
#   environment setting listed in METRONOME_SWEEP (see below);
#   ncu: per-kernel durations of the GEMV and attention kernels from Nsight
#   Compute (8B shapes, ncu.csv); profile: every kernel of one captured decode
#   step (batch 1, and batch 64 on each decode path; METRONOME_PROFILE_SPECS="1:auto
#   64:cublas 64:skinny", batch:path pairs) from Nsight Compute, both
#   shapes (profile.txt, profile.json); memcheck: sanitize without racecheck;
#   hfeager: the transformers side without torch.compile. Steps run in this
#   order: tests, bench (and fp8, v1, pdlon, pdloff, paths, sweep) per model, sanitizers,
#   ncu, profile, hf.
#
# Binaries come from $METRONOME_DEVICE_BIN (default .device/ in the repo:
# gpu_tests, gpu_bench and lib/ with the non-CUDA shared libraries they need;
# bench/gpu/pack_device.sh fills it on the build machine). Results go to
# $OUT (default out/): log.txt, tests.json, results.json (rows
# {"engine","model","metric","value","unit","floor"}), grid.json (step times
# for the scheduler's cost model), table.md, ncu.csv (with ncu), profile.txt
# and profile.json (with profile).
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
stamp() { echo "== [${SECONDS} s] $*"; }
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
  stamp "gpu_tests"
  timeout $(left 240) env LD_LIBRARY_PATH="$ldp" "$bin/gpu_tests" --gtest_output=json:"$out/tests.json" \
    || { echo "gpu_tests FAILED (exit $?)"; status=1; }
fi
# The runner end to end with programmatic dependent launch, and the kernel
# tests that launch on a stream (the GEMV chain, the skinny GEMM's graph; the
# other kernel tests launch on the legacy stream, where PDL is never used).
pdl_filter='presets/gpu_runner.*:gpu_runner_plans.*:presets/overlapped_steps.*:gpu_kernels.gemv_chain*:gpu_skinny_gemm.split_launches*'
if want pdlon; then
  stamp "gpu_tests, runner, PDL on"
  METRONOME_PDL=1 timeout $(left 120) env LD_LIBRARY_PATH="$ldp" "$bin/gpu_tests" \
    --gtest_filter="$pdl_filter" || { echo "gpu_tests (PDL on) FAILED (exit $?)"; status=1; }
fi
if want pdllate; then
  # PDL on everywhere with late triggers (the residual-adding GEMVs launched
  # early too; the default lets each decode graph choose), and the graph-edge
  # test that covers them.
  stamp "gpu_tests, runner, PDL late"
  METRONOME_PDL=late timeout $(left 120) env LD_LIBRARY_PATH="$ldp" "$bin/gpu_tests" \
    --gtest_filter="$pdl_filter:gpu_launch.*" || { echo "gpu_tests (PDL late) FAILED (exit $?)"; status=1; }
fi
if want pdloff; then
  # The same with PDL off everywhere (the default lets each decode graph choose).
  stamp "gpu_tests, runner, PDL off"
  METRONOME_PDL=0 timeout $(left 120) env LD_LIBRARY_PATH="$ldp" "$bin/gpu_tests" \
    --gtest_filter="$pdl_filter" || { echo "gpu_tests (PDL off) FAILED (exit $?)"; status=1; }
fi
# -- benchmark -----------------------------------------------------------------------------
rows=() grids=()
models=(${METRONOME_MODELS:-llama3-1b llama3-8b})
make_model() { # the model folder of $1, made here on first use
  local dir=$work/models/$1
  [ -e "$dir/config.json" ] || run "$bin/gpu_bench" --make-preset "$1" --make-out "$dir" \
    || { echo "make-model $1 failed"; return 1; }
}
report() {
  local grid_args=() g
  for g in "${grids[@]}"; do grid_args+=(--grid "$g"); done
  python3 "$root/tools/gpu_report.py" --out "$out/results.json" --table "$out/table.md" \
    ${grids:+--grid-out "$out/grid.json"} "${grid_args[@]}" "${rows[@]}"
}
if want bench || want fp8 || want v1 || want pdlon || want pdloff || want paths || want sweep; then
  for m in "${models[@]}"; do
    dir=$work/models/$m
    make_model "$m" || continue
    if want bench; then
      stamp "gpu_bench $m"
      g=""
      want grid && g="--grid $work/grid-$m.json" && grids+=("$m=$work/grid-$m.json")
      want kernels && g="$g --kernels"
      timeout $(left 200) env LD_LIBRARY_PATH="$ldp" "$bin/gpu_bench" --model "$dir" --name "$m" \
        --out "$work/rows-$m.json" $g $quick \
        || echo "gpu_bench $m FAILED (exit $?)"
      rows+=("$work/rows-$m.json")
    fi
    if want fp8; then
      stamp "gpu_bench $m (fp8 KV cache)"
      timeout $(left 150) env LD_LIBRARY_PATH="$ldp" "$bin/gpu_bench" --model "$dir" \
        --name "$m/fp8-kv" --out "$work/rows-$m-fp8.json" --headline --kv-cache-dtype fp8 \
        $quick || echo "gpu_bench $m (fp8 KV cache) FAILED (exit $?)"
      rows+=("$work/rows-$m-fp8.json")
    fi
    if want v1; then
      stamp "gpu_bench $m (first-generation kernels)"
      METRONOME_KERNELS=gemv=1,decode=1,prefill=1 timeout $(left 120) env LD_LIBRARY_PATH="$ldp" \
        "$bin/gpu_bench" --model "$dir" --name "$m/v1" --out "$work/rows-$m-v1.json" --headline \
        $quick || echo "gpu_bench $m (v1) FAILED (exit $?)"
      rows+=("$work/rows-$m-v1.json")
    fi
    if want paths; then
      stamp "gpu_bench $m (decode projections forced to cuBLAS)"
      timeout $(left 120) env LD_LIBRARY_PATH="$ldp" "$bin/gpu_bench" --model "$dir" \
        --name "$m/cublas-path" --out "$work/rows-$m-cublas.json" --decode-only --path cublas \
        $quick || echo "gpu_bench $m (cublas path) FAILED (exit $?)"
      rows+=("$work/rows-$m-cublas.json")
      stamp "gpu_bench $m (decode projections forced to the skinny GEMM)"
      timeout $(left 120) env LD_LIBRARY_PATH="$ldp" "$bin/gpu_bench" --model "$dir" \
        --name "$m/skinny-path" --out "$work/rows-$m-skinny.json" --decode-only --path skinny \
        $quick || echo "gpu_bench $m (skinny path) FAILED (exit $?)"
      rows+=("$work/rows-$m-skinny.json")
    fi
    if want sweep; then
      # The decode figures (up to batch 64) once per entry of METRONOME_SWEEP,
      # "label:VAR=VALUE,VAR=VALUE" (label alone: the defaults), e.g.
      # "base: nohints:METRONOME_STREAM_HINTS=0 pdl:METRONOME_PDL=1"; the
      # first entry again at the end, for the drift within the call.
      sweep=(${METRONOME_SWEEP:-base: nohints:METRONOME_STREAM_HINTS=0})
      for entry in "${sweep[@]}" "${sweep[0]}"; do
        label=${entry%%:*} assigns=()
        IFS=, read -r -a assigns <<< "${entry#*:}"
        f="$work/rows-$m-$label-$SECONDS.json"
        stamp "gpu_bench $m ($label: ${assigns[*]})"
        timeout $(left 90) env "${assigns[@]}" LD_LIBRARY_PATH="$ldp" "$bin/gpu_bench" \
          --model "$dir" --name "$m/$label" --out "$f" --decode-only --max-batch 64 $quick \
          || echo "gpu_bench $m ($label) FAILED (exit $?)"
        rows+=("$f")
      done
    fi
    # pdlon / pdloff: the target figures with PDL forced on / off everywhere.
    for mode in on off; do
      want "pdl$mode" || continue
      value=1
      [ "$mode" = off ] && value=0
      stamp "gpu_bench $m (PDL $mode)"
      METRONOME_PDL=$value timeout $(left 120) env LD_LIBRARY_PATH="$ldp" "$bin/gpu_bench" \
        --model "$dir" --name "$m/pdl-$mode" --out "$work/rows-$m-pdl$mode.json" --headline $quick \
        || echo "gpu_bench $m (PDL $mode) FAILED (exit $?)"
      rows+=("$work/rows-$m-pdl$mode.json")
    done
  done
  report > /dev/null
fi

# -- sanitizers (quick shapes) ---------------------------------------------------------------
if (want sanitize || want memcheck) && [ -n "$sanitizer" ]; then
  stamp "compute-sanitizer memcheck (quick shapes)"
  METRONOME_GPU_TEST_QUICK=1 timeout $(left 110) env LD_LIBRARY_PATH="$ldp" "$sanitizer" --tool memcheck \
    --error-exitcode 9 --print-limit 20 "$bin/gpu_tests" \
    --gtest_filter='gpu_kernels.*:gpu_gemm_tuner.*:gpu_skinny_gemm.*:gpu_attention.*:gpu_sampling.*:presets/gpu_runner.greedy_ids_and_logits_match_transformers/*:presets/gpu_runner.a_mixed_batch*/tiny_mistral:gpu_runner_plans.*:gpu_runner_bias.*:gpu_runner_head_dim_128.*:presets/overlapped_steps.*/tiny_llama3_*:overlapped_steps_contract.*' \
    > "$work/memcheck.log" 2>&1; echo "memcheck exit $?"
  grep -E "ERROR SUMMARY|FAILED|PASSED|OK \]" "$work/memcheck.log"
  grep -m 5 -B2 -A12 -E "^========= (Invalid|Program hit|Uninit|Leaked)" "$work/memcheck.log"
fi
if want sanitize && [ -n "$sanitizer" ]; then
  stamp "compute-sanitizer racecheck (quick shapes)"
  METRONOME_GPU_TEST_QUICK=1 timeout $(left 80) env LD_LIBRARY_PATH="$ldp" "$sanitizer" --tool racecheck \
    --racecheck-report hazard --error-exitcode 9 --print-limit 20 "$bin/gpu_tests" \
    --gtest_filter='gpu_kernels.gemv*:gpu_skinny_gemm.*:gpu_attention.*:gpu_sampling.ties*' \
    > "$work/racecheck.log" 2>&1; echo "racecheck exit $?"
  grep -E "RACECHECK SUMMARY|ERROR SUMMARY|FAILED|PASSED|OK \]" "$work/racecheck.log"
  grep -m 5 -B2 -A12 -E "hazard" "$work/racecheck.log"
fi

# -- per-kernel durations from the hardware (Nsight Compute), 8B shapes ------------------------
ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
if want ncu && [ -n "$ncu_bin" ] && make_model llama3-8b; then
  stamp "ncu: kernel durations (llama3-8b shapes)"
  METRONOME_KBENCH_REPS=1 timeout $(left 120) env LD_LIBRARY_PATH="$ldp" "$ncu_bin" \
    --clock-control none --csv --page raw \
    --kernel-name regex:"gemv|skinny|decode_attention|prefill_attention" \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread \
    "$bin/gpu_bench" --model "$work/models/llama3-8b" --name llama3-8b --kernels-only \
    > "$out/ncu.csv" 2> "$work/ncu.err"; echo "ncu exit $?"
  tail -3 "$work/ncu.err"
fi

# -- one decode step per kernel (Nsight Compute), both shapes -------------------------------
# The engine replays the graph of METRONOME_PROFILE_BATCH once more inside a
# profiler range (decode_graph_cache::time, the first replay of that size in
# the process: batch 1 at 128 keys, batch 64 at 1,024); ncu times each of its
# kernels on its own. ncu's serialisation would tilt the engine's per-size
# choice of decode path, so batch 64 is profiled on each path; batch 1 on the
# default.
if want profile && [ -n "$ncu_bin" ]; then
  profiles=()
  for m in "${models[@]}"; do
    make_model "$m" || continue
    for spec in ${METRONOME_PROFILE_SPECS:-1:auto 64:cublas 64:skinny}; do
      b=${spec%%:*} p=${spec#*:} f="$work/profile-$m-bs$b-$p.csv"
      stamp "ncu: one decode step, $m batch $b ($p path)"
      path_arg=(); [ "$p" != auto ] && path_arg=(--path "$p")
      METRONOME_PROFILE_BATCH=$b timeout $(left 90) env LD_LIBRARY_PATH="$ldp" "$ncu_bin" \
        --clock-control none --cache-control none --profile-from-start off --csv --page raw \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
        "$bin/gpu_bench" --model "$work/models/$m" --name "$m" --decode-only --max-batch 64 \
        --quick "${path_arg[@]}" --out "$work/profile-rows.json" > "$f" 2> "$work/ncu.err" \
        && profiles+=("$f") || { echo "ncu exit $?"; tail -3 "$work/ncu.err"; }
    done
  done
  [ ${#profiles[@]} -gt 0 ] && python3 "$root/tools/ncu_step_profile.py" "${profiles[@]}" \
    --json "$out/profile.json" | tee "$out/profile.txt"
fi

# mixed: B decodes at 1,024 keys beside an N-token prompt chunk
# (METRONOME_MIXED_SPECS="64:0 64:32 64:128", B:N; N = 0 the decodes alone,
# uncaptured): wall times with and without graphs, then every kernel of one
# such step from Nsight Compute (mixed.txt, mixed.json), to set the mixed
# step's kernels beside the decode step's.
if want mixed && [ -n "$ncu_bin" ]; then
  mixed=()
  for m in "${models[@]}"; do
    make_model "$m" || continue
    for spec in ${METRONOME_MIXED_SPECS:-64:0 64:32 64:128}; do
      f="$work/mixed-$m-${spec/:/-}.csv"
      stamp "mixed step $spec, $m"
      timeout $(left 60) env LD_LIBRARY_PATH="$ldp" "$bin/gpu_bench" --model "$work/models/$m" \
        --name "$m" --max-batch 128 --profile-mixed "$spec" 2>&1 | grep -E "profile-mixed|rror"
      timeout $(left 90) env LD_LIBRARY_PATH="$ldp" "$ncu_bin" \
        --clock-control none --cache-control none --profile-from-start off --csv --page raw \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
        "$bin/gpu_bench" --model "$work/models/$m" --name "$m" --max-batch 128 \
        --profile-mixed "$spec" > "$f" 2> "$work/ncu.err" \
        && mixed+=("$f") || { echo "ncu exit $?"; tail -3 "$work/ncu.err"; }
    done
  done
  [ ${#mixed[@]} -gt 0 ] && python3 "$root/tools/ncu_step_profile.py" "${mixed[@]}" --first 40 \
    --json "$out/mixed.json" | tee "$out/mixed.txt"
fi

# -- the peer: transformers on the same folders (whatever time is left) --------------------
if want hf || want hfeager; then
  for m in "${models[@]}"; do
    dir=$work/models/$m
    make_model "$m" || continue
    stamp "transformers $m"
    nc="--compile-contexts ${METRONOME_HF_COMPILE_CONTEXTS:-128}"
    want hfeager && nc="--no-compile"
    PYTHONUNBUFFERED=1 timeout $(left 240) python3 "$root/tools/gpu_hf_bench.py" --model "$dir" \
      --name "$m" --out "$work/hf-$m.json" --batches 8,64 $quick $nc \
      || echo "gpu_hf_bench $m FAILED (exit $?)"
    rows+=("$work/hf-$m.json")
  done
fi
if [ ${#rows[@]} -gt 0 ]; then
  report
fi
echo "== done (status $status) after ${SECONDS} s"
exit $status
