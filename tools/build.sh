#!/usr/bin/env bash
# Builds Metronome into build/ (or $METRONOME_BUILD_DIR), first installing the
# Debian 12 packages it needs when they are missing. Extra arguments go to the
# CMake configure step (e.g. -DMETRONOME_CUDA=OFF). With METRONOME_DEPS_ONLY=1
# it stops after installing the packages.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${METRONOME_BUILD_DIR:-$root/build}

packages=(
  cmake ninja-build g++ pkg-config git
  libcaf-dev libboost1.81-dev libyaml-cpp-dev libspdlog-dev libfmt-dev
  nlohmann-json3-dev libsimdjson-dev libcli11-dev libpcre2-dev libgtest-dev libgmock-dev libssl-dev openssl
  python3 python3-prometheus-client
  chromium prometheus
)
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
"$root/tools/apt_install_missing.sh" build.sh "${packages[@]}"

# Node packages of the end-to-end tests (the official openai client, ws,
# playwright-core driving Debian's chromium above), again whenever
# package-lock.json is newer than the installed tree.
e2e="$root/tests/e2e"
if [ -f "$e2e/package.json" ] && ! [ "$e2e/node_modules/.package-lock.json" -nt "$e2e/package-lock.json" ]; then
  (cd "$root/tests/e2e" && npm ci --no-audit --no-fund --loglevel=error)
fi

# METRONOME_DEPS_ONLY=1: the packages only (tools/check_sanitizers.sh).
[ -z "${METRONOME_DEPS_ONLY:-}" ] || exit 0

cmake -S "$root" -B "$build" -G Ninja "$@"
cmake --build "$build" -j"$(nproc)"
