#!/usr/bin/env bash
# Fills .device/ (git-ignored) with what bench/gpu/run_h200.sh runs on the GPU
# machine: gpu_tests, gpu_bench, kv_quality (where built) and the shared
# libraries they need that are neither glibc nor CUDA's (the device has its
# own cuBLAS and driver).
#   bench/gpu/pack_device.sh [BUILD_DIR]   (default build-gpu)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build-gpu}
dest=$root/.device
rm -rf "$dest"
mkdir -p "$dest/lib" "$dest/lib-fallback"
cp "$build/tests/gpu/gpu_tests" "$build/bench/gpu_bench" "$dest/"
# kv_quality only where it was built (ninja ... kv_quality).
[ -x "$build/bench/kv_quality" ] && cp "$build/bench/kv_quality" "$dest/"
for b in "$dest"/gpu_tests "$dest"/gpu_bench "$dest"/kv_quality; do
  [ -e "$b" ] || continue
  ldd "$b" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libcublas*|libcuda.so*|libcudart*) ;;
      libstdc++.so*|libgcc_s.so*) cp -L -n "$lib" "$dest/lib-fallback/" ;; # only if the device's are too old
      *) cp -L -n "$lib" "$dest/lib/" ;;
    esac
  done
done
du -sh "$dest"; ls "$dest" "$dest/lib" "$dest/lib-fallback"
