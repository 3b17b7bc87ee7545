#!/usr/bin/env bash
# The fuzz and sanitizer jobs of CI (docs/reliability.md, "Fuzzing and
# sanitizers"), called by .ci/run after the normal build and tests:
#   asan  clang 19 with ASan + UBSan (+ libFuzzer's coverage) into build-fuzz:
#         the unit tests and the actor tests,
#         then every fuzz target for METRONOME_FUZZ_SECONDS (30) from the same
#         build through bench/fuzz/run.sh
#   tsan  clang 19 with TSan into build-tsan, against CAF 0.17.6 built with
#         TSan into build-tsan-caf (tools/build_caf_tsan.sh): model_tests
#         (the CPU runner's threads), the server tests (net_tests) and every
#         actor test
# Usage: tools/check_sanitizers.sh [asan] [tsan]   (default: both)
# Environment: METRONOME_SANITIZE_JOBS (compile jobs, default nproc),
#   METRONOME_FUZZ_SECONDS (default 30), METRONOME_SANITIZER_TEST_LIMIT
#   (seconds one test executable may run, default 900: a hang fails with
#   every thread's stack in its log, not at CI's own limit).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=${METRONOME_SANITIZE_JOBS:-$(nproc)}
test_limit=${METRONOME_SANITIZER_TEST_LIMIT:-900}
jobs_to_run=("$@")
((${#jobs_to_run[@]})) || jobs_to_run=(asan tsan)

# The Debian packages of the normal build, then clang 19 and its runtimes.
METRONOME_DEPS_ONLY=1 "$root/tools/build.sh"
"$root/tools/install_clang.sh"
# Symbolized reports when an llvm-symbolizer is installed (any version).
if sym=$(command -v llvm-symbolizer-19 || command -v llvm-symbolizer); then
  export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$(readlink -f "$sym")}
fi

configure() { # <dir> <cmake options...>
  local dir=$1
  shift
  [ -f "$dir/build.ninja" ] && return 0
  CC=clang-19 CXX=clang++-19 cmake -S "$root" -B "$dir" -G Ninja -DMETRONOME_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="-gline-tables-only" "$@" >/dev/null
}

# The tests of each job. Both need the CLI (tests run it), which every
# metronome_test depends on.
actor_tests=(engine_tests executor_tests scheduler_actor_tests drift_actor_tests
             request_lifecycle_tests executor_faults_tests engine_supervisor_tests
             data_parallel_tests workers_tests kv_precision_tests)
unit_tests=(model_tests tokenizer_test config_tests metrics_tests sched_tests sim_tests
            workload_tests net_tests bench_serve_tests replica_router_tests)

# Runs each test executable whole (one process for all its cases: faster
# than ctest's process per case under a sanitizer), two at a time, each
# into <dir>/sanitizer-logs/<name>.log; prints the logs of those that
# failed and fails.
run_tests() { # <build dir> <targets...>
  local dir=$1 t bin logs=$1/sanitizer-logs
  shift
  mkdir -p "$logs"
  rm -f "$logs"/*.failed
  for t in "$@"; do
    bin=$(find "$dir/tests" -name "$t" -type f -perm -u+x | head -1)
    if [ -z "$bin" ]; then
      echo "check_sanitizers: no executable $t" >&2
      touch "$logs/$t.failed"
      continue
    fi
    while (($(jobs -rp | wc -l) >= 2)); do wait -n || true; done
    (
      s=$SECONDS
      (cd "$dir" && exec "$bin" --gtest_brief=1) >"$logs/$t.log" 2>&1 &
      pid=$!
      while kill -0 "$pid" 2>/dev/null && ((SECONDS - s < test_limit)); do sleep 1; done
      if kill -0 "$pid" 2>/dev/null; then
        # A hang: every thread's stack into the log, then the test ends.
        echo "check_sanitizers: $t TIMED OUT after $test_limit s"
        if command -v gdb >/dev/null; then
          gdb -p "$pid" -batch -ex "thread apply all bt" >>"$logs/$t.log" 2>&1 || true
        fi
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        touch "$logs/$t.failed"
      elif wait "$pid"; then
        echo "check_sanitizers: $t passed ($((SECONDS - s)) s)"
      else
        echo "check_sanitizers: $t FAILED ($((SECONDS - s)) s)"
        touch "$logs/$t.failed"
      fi
    ) &
  done
  wait
  local failed=()
  for t in "$@"; do
    if [ -f "$logs/$t.failed" ]; then
      failed+=("$t")
      echo "---- $t" >&2
      tail -200 "$logs/$t.log" >&2
    fi
  done
  if ((${#failed[@]})); then
    echo "check_sanitizers: failed: ${failed[*]}" >&2
    return 1
  fi
}

timed() { # <label> <command...>: runs it and prints how long it took
  local label=$1 start=$SECONDS
  shift
  "$@"
  echo "check_sanitizers: $label took $((SECONDS - start)) s"
}

for job in "${jobs_to_run[@]}"; do
  case $job in
    asan)
      # The fuzz targets' build (bench/fuzz/run.sh configures it the same
      # way): one sanitized build of the libraries serves both.
      dir=${METRONOME_FUZZ_BUILD_DIR:-$root/build-fuzz}
      configure "$dir" -DMETRONOME_FUZZ=ON
      timed "asan build" ninja -C "$dir" -j"$jobs" "${unit_tests[@]}" "${actor_tests[@]}" fuzz_targets
      export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
      export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
      # The live drift test needs the tiny model to serve a jump in
      # lengths within 60 s of wall clock; under ASan on a busy 2-core
      # machine it may not (a timing bound, not a finding). It runs in the
      # normal build. Also left to the normal build: the longest model
      # tests, which run the code of shorter ones over more tokens (the
      # default model's held-out perplexity, the quality report's precisions
      # against each other, fp8_e5m2 logits under every chunking): about
      # 270 s of ASan's model_tests, the longest path of this job.
      export GTEST_FILTER='-live_drift_test.*:default_model.perplexity_on_held_out_windows_equals_transformers:quality_eval.the_baseline_against_itself_is_exact_and_every_precision_differs:*fp8_e5m2_engine_test.chunking_and_pages_do_not_change_the_logits/*'
      timed "asan+ubsan tests" run_tests "$dir" "${unit_tests[@]}" "${actor_tests[@]}"
      METRONOME_FUZZ_BUILD_DIR=$dir METRONOME_FUZZ_JOBS=$jobs timed "fuzz" "$root/bench/fuzz/run.sh" "${METRONOME_FUZZ_SECONDS:-30}"
      ;;
    tsan)
      # Every unit test with threads of its own (model_tests: the CPU
      # runner's workers, model/parallel.cpp, 4 of them whatever the cores;
      # net_tests: the servers' io threads and CAF's) and every actor test,
      # on CAF's threaded scheduler and its deterministic coordinator,
      # against CAF 0.17.6 built with TSan (tools/build_caf_tsan.sh): TSan
      # only sees the synchronisation of code it instruments, and Debian's
      # CAF is not, so against it every message handed between scheduler
      # threads would read as a race.
      tsan_tests=(model_tests net_tests "${actor_tests[@]}")
      export METRONOME_THREADS=4
      caf=$root/build-tsan-caf
      timed "caf tsan build" "$root/tools/build_caf_tsan.sh" "$caf"
      dir=$root/build-tsan
      # A build folder configured against another CAF starts again.
      if [ -f "$dir/CMakeCache.txt" ] &&
         ! grep -q "^CAF_CORE_LIBRARY:FILEPATH=$caf/" "$dir/CMakeCache.txt"; then
        rm -rf "$dir"
      fi
      configure "$dir" -DMETRONOME_TSAN=ON -DCMAKE_PREFIX_PATH="$caf"
      timed "tsan build" ninja -C "$dir" -j"$jobs" "${tsan_tests[@]}"
      export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
      [ -z "${ASAN_SYMBOLIZER_PATH:-}" ] ||
        TSAN_OPTIONS+=" external_symbolizer_path=$ASAN_SYMBOLIZER_PATH"
      # The live drift test's 60 s wall-clock bound and the longest model
      # tests, as in the asan job.
      export GTEST_FILTER='-live_drift_test.*:default_model.perplexity_on_held_out_windows_equals_transformers:quality_eval.the_baseline_against_itself_is_exact_and_every_precision_differs:*fp8_e5m2_engine_test.chunking_and_pages_do_not_change_the_logits/*'
      timed "tsan tests" run_tests "$dir" "${tsan_tests[@]}"
      ;;
    *)
      echo "check_sanitizers: unknown job '$job' (asan, tsan)" >&2
      exit 2
      ;;
  esac
done
