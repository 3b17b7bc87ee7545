#!/usr/bin/env bash
# Installs the build into a scratch prefix (cmake --install) and builds
# examples/embed_engine.cpp as another project would: a CMakeLists.txt of its
# own with find_package(metronome), in a scratch folder outside the tree,
# against the prefix alone. Then runs it on the installed default model and
# checks the embedded engine streamed an answer. The same project compiles
# every installed header (one source including them all), so none needs a
# file left uninstalled. Fails when the installed package, or the consumer's compile
# lines, name the source or build tree.
# Usage: check_install.sh BUILD_DIR SOURCE_DIR CMAKE GENERATOR CXX_COMPILER
set -euo pipefail
build=$(cd "$1" && pwd -P)
src=$(cd "$2" && pwd -P)
cmake=$3
generator=$4
cxx=$5

fail() { echo "check_install: $*" >&2; exit 1; }
step() { echo "check_install: $* ($((SECONDS - start)) s)"; }
start=$SECONDS

work=$(mktemp -d "${TMPDIR:-/tmp}/metronome-install.XXXXXX")
work=$(cd "$work" && pwd -P)
case "$work/" in "$src/"*) fail "the scratch folder $work is inside the source tree" ;; esac
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
consumer=$work/consumer

"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" \
  || { cat "$work/install.log" >&2; fail "cmake --install failed"; }
step "installed into $prefix"
package=$prefix/lib/cmake/metronome
for f in metronomeConfig.cmake metronomeConfigVersion.cmake metronomeTargets.cmake FindCAF.cmake; do
  [ -f "$package/$f" ] || fail "no $package/$f"
done
[ -x "$prefix/bin/metronome" ] || fail "no $prefix/bin/metronome"
[ -f "$prefix/include/metronome/actors/engine.hpp" ] || fail "no include/metronome/actors/engine.hpp"
[ -f "$prefix/share/metronome/models/default/config.json" ] || fail "no installed default model"
if grep -rlF -e "$src" "$package" >&2; then
  fail "the package above names the source or build tree ($src)"
fi

# The consumer: its own project, the example copied beside its CMakeLists.txt,
# and a source including every installed header.
mkdir -p "$consumer"
cp "$src/examples/embed_engine.cpp" "$consumer/"
(cd "$prefix/include/metronome" && find . -name '*.hpp' | sed 's|^\./||' | sort) \
  | sed 's|.*|#include "&"|' >"$consumer/all_headers.cpp"
headers=$(wc -l <"$consumer/all_headers.cpp")
[ "$headers" -gt 50 ] || fail "only $headers headers installed"
cat >"$consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(embed_consumer LANGUAGES CXX)
find_package(metronome 0.1 REQUIRED)
add_executable(embed_engine embed_engine.cpp)
target_link_libraries(embed_engine PRIVATE metronome::actors)
add_library(all_headers OBJECT all_headers.cpp)
target_link_libraries(all_headers PRIVATE metronome::net metronome::sim metronome::bench_serve)
CMAKE
"$cmake" -S "$consumer" -B "$consumer/build" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$work/configure.log" 2>&1 \
  || { cat "$work/configure.log" >&2; fail "configuring the consumer failed"; }
found=$(sed -n 's/^metronome_DIR:PATH=//p' "$consumer/build/CMakeCache.txt")
[ "$found" = "$package" ] || fail "find_package found metronome at '$found', not $package"
step "configured the consumer"
if grep -F -e "$src" "$consumer/build/compile_commands.json" >&2; then
  fail "the consumer's compile line above names the source tree ($src)"
fi
"$cmake" --build "$consumer/build" >"$work/build.log" 2>&1 \
  || { cat "$work/build.log" >&2; fail "building the consumer failed"; }
step "built embed_engine and compiled the $headers installed headers"

# stdout: the streamed text, then "[N tokens, finish_reason=..., ...]"
# (spdlog's default logger, the engine's log, writes "[date] [info] ..."
# lines there too).
timeout 120 "$consumer/build/embed_engine" "$prefix/share/metronome/models/default" \
  "The sea was calm" >"$work/run.out" 2>"$work/run.err" \
  || { cat "$work/run.out" "$work/run.err" >&2; fail "embed_engine failed"; }
cat "$work/run.out"
summary=$(grep -E '^\[[0-9]+ tokens, finish_reason=[a-z_]+, ttft=' "$work/run.out") \
  || { cat "$work/run.err" >&2; fail "embed_engine printed no '[N tokens, finish_reason=...]'"; }
tokens=$(sed -E 's/^\[([0-9]+) tokens.*/\1/' <<<"$summary")
[ "$tokens" -gt 0 ] || fail "the engine generated no tokens"
text=$(grep -v '^\[' "$work/run.out" | head -n 1)
[ -n "${text// /}" ] || fail "no streamed text before the summary"
step "embed_engine answered ($tokens tokens)"
