#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/) with clang, ASan and UBSan, and
# runs each for SECONDS (default 60), starting from the committed seed corpus
# plus what earlier runs in the same build folder found. Prints one row per
# target: executions, executions per second, coverage (libFuzzer's cov: edges
# and ft: features) and corpus size; exits non-zero when any target crashed,
# leaked, tripped a sanitizer or a FUZZ_CHECK, or timed out on one input (the
# input is saved as <work>/<target>/crash-*, leak-*, timeout-*, moved to
# <work>/<target>/earlier/ by the next run; reproduce with
# `<build>/tests/fuzz/<target>_fuzz <that file>`).
#
# Usage: bench/fuzz/run.sh [SECONDS] [TARGET...]
#   TARGET: openai_request ws_protocol http_request tokenizer safetensors
#           model_config config_yaml (default: all)
# Environment:
#   METRONOME_FUZZ_BUILD_DIR  build folder (default build-fuzz; configured here
#                             when it has no build.ninja)
#   METRONOME_FUZZ_JOBS       parallel compile jobs (default: nproc)
#   METRONOME_FUZZ_FORKS      libFuzzer processes per target (default 1)
#   METRONOME_TESTDATA        shared/testdata (the tokenizer target reads it)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
seconds=${1:-60}
shift || true
all=(openai_request ws_protocol http_request tokenizer safetensors model_config config_yaml)
targets=("$@")
((${#targets[@]})) || targets=("${all[@]}")
build=${METRONOME_FUZZ_BUILD_DIR:-$root/build-fuzz}
jobs=${METRONOME_FUZZ_JOBS:-$(nproc)}
forks=${METRONOME_FUZZ_FORKS:-1}

# clang 19 and its runtimes (libFuzzer, ASan, UBSan): Debian 12's clang 14
# cannot compile the code (libstdc++ 12's std::expected needs C++20
# concepts it lacks).
"$root/tools/install_clang.sh"
# Symbolized reports when an llvm-symbolizer is installed (any version).
if sym=$(command -v llvm-symbolizer-19 || command -v llvm-symbolizer); then
  export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$(readlink -f "$sym")}
fi

if [ ! -f "$build/build.ninja" ]; then
  CC=clang-19 CXX=clang++-19 cmake -S "$root" -B "$build" -G Ninja \
    -DMETRONOME_CUDA=OFF -DMETRONOME_FUZZ=ON -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS="-gline-tables-only" >/dev/null
fi
ninja -C "$build" -j"$jobs" $(printf '%s_fuzz ' "${targets[@]}") >/dev/null

work=$build/fuzz-work
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
rows=()
for t in "${targets[@]}"; do
  dir=$work/$t
  mkdir -p "$dir/corpus" "$dir/earlier"
  # Findings of earlier runs stay for replaying, out of this run's way.
  for f in "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-*; do
    [ -e "$f" ] && mv "$f" "$dir/earlier/"
  done
  log=$dir/last.log
  args=(-max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1
        -artifact_prefix="$dir/")
  ((forks > 1)) && args+=(-fork="$forks" -ignore_crashes=0)
  case $t in
    openai_request | ws_protocol | http_request | safetensors | model_config)
      args+=(-dict="$root/tests/fuzz/json.dict") ;;
  esac
  rc=0
  (cd "$dir" && "$build/tests/fuzz/${t}_fuzz" "${args[@]}" "$dir/corpus" \
     "$root/tests/fuzz/corpus/$t") >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  if [ -z "$execs" ]; then
    # -fork mode prints no final stats; its last status line counts them all.
    execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  fi
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
  ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || true)
  corpus=$(ls "$dir/corpus" | wc -l)
  result=ok
  if ((rc != 0)) || compgen -G "$dir/crash-*" >/dev/null || compgen -G "$dir/leak-*" >/dev/null ||
     compgen -G "$dir/timeout-*" >/dev/null || compgen -G "$dir/oom-*" >/dev/null; then
    result="FAILED (rc $rc, see $log)"
    failed+=("$t")
  fi
  rows+=("$(printf '%-16s %8s %12s %10s %7s %7s %7s  %s' "$t" "${seconds}s" "${execs:-?}" \
    "$(( ${execs:-0} / (seconds > 0 ? seconds : 1) ))" "${cov:-?}" "${ft:-?}" "$corpus" "$result")")
  echo "${rows[-1]}" >&2
done

printf '\n%-16s %8s %12s %10s %7s %7s %7s  %s\n' target time executions exec/s cov ft corpus result
printf '%s\n' "${rows[@]}"
if ((${#failed[@]})); then
  echo "fuzz: failures in ${failed[*]}" >&2
  exit 1
fi
