#!/usr/bin/env bash
# Checks that the Dockerfile installs exactly the Debian packages of
# tools/build.sh less those its "# test-only: ..." line names (chromium for
# the browser test, prometheus for the scrape test), so the two cannot
# drift: a package added to build.sh must go into the image or be declared
# test-only there. Also that it builds from debian:bookworm and serves on
# 0.0.0.0.
# Usage: check_dockerfile.sh SOURCE_DIR
set -euo pipefail
src=$1

fail() { echo "check_dockerfile: $*" >&2; exit 1; }

# The Dockerfile's "# test-only: a b" line.
test_only=$(sed -n 's/^# test-only: *//p' "$src/Dockerfile" | tr -s ' \t' '\n' | sed '/^$/d')
[ -n "$test_only" ] || fail "no '# test-only: ...' line in the Dockerfile"

# build.sh: the words of its `packages=( ... )` array, less the test-only ones.
build_sh=$(sed -n '/^packages=(/,/^)/p' "$src/tools/build.sh" | sed 's/^packages=(//; s/)$//' \
  | tr -s ' \t\n' '\n' | sed '/^$/d' | grep -vxF -f <(echo "$test_only") | sort)
[ -n "$build_sh" ] || fail "no packages=( ... ) array in tools/build.sh"

# Dockerfile: the words after --no-install-recommends up to the next &&.
docker=$(sed -n '/apt-get install/,/&&/p' "$src/Dockerfile" | tr -d '\\' | tr -s ' \t\n' '\n' \
  | sed -n '/^--no-install-recommends$/,/^&&$/p' | sed '1d;$d' | sort)
[ -n "$docker" ] || fail "no apt-get install ... --no-install-recommends list in the Dockerfile"

if [ "$build_sh" != "$docker" ]; then
  echo "tools/build.sh (less test-only: $(echo $test_only)) vs Dockerfile:" >&2
  diff <(echo "$build_sh") <(echo "$docker") >&2 || true
  fail "the Dockerfile's packages differ from tools/build.sh's (a build.sh package that only tests need goes on the Dockerfile's test-only line)"
fi
grep -qx 'ARG BASE_IMAGE=debian:bookworm' "$src/Dockerfile" || fail "the base image must default to debian:bookworm"
grep -q -- '-DMETRONOME_CUDA=${METRONOME_CUDA}' "$src/Dockerfile" || fail "the CUDA switch is not passed to cmake"
grep -qx 'ARG METRONOME_CUDA=OFF' "$src/Dockerfile" || fail "CUDA must be off by default"
grep -q '"serve", "--host", "0.0.0.0"' "$src/Dockerfile" || fail "the entry point must serve on 0.0.0.0"
echo "check_dockerfile: $(wc -l <<<"$docker") packages, as tools/build.sh"
