#!/usr/bin/env bash
# Builds CAF 0.17.6, the release Debian 12's libcaf-dev packages, with
# ThreadSanitizer into PREFIX, for the TSan job (tools/check_sanitizers.sh
# tsan). TSan only sees synchronisation in code it instruments: against
# Debian's CAF every message handed from one scheduler thread to another
# through CAF's mailbox atomics reads as a race (docs/reliability.md).
#
#   tools/build_caf_tsan.sh PREFIX
#
# The source is the orig tarball of Debian's source package actor-framework
# 0.17.6-2.1, from Debian's archive, checked against the SHA-256 its .dsc
# lists. Built with clang 19 (tools/install_clang.sh) against libstdc++, as
# the TSan build of Metronome is: libcaf_core and libcaf_io, the Debian
# package's build settings that change the code (log level QUIET, memory
# management and exceptions on, no runtime checks), no OpenSSL, OpenCL,
# tools or tests. `-include limits`: 0.17.6's receive_buffer.hpp uses
# std::numeric_limits without including <limits>, which libstdc++ 12 no
# longer includes through other headers. Does nothing when PREFIX already
# holds the result.
set -euo pipefail

prefix=${1:?usage: tools/build_caf_tsan.sh PREFIX}
jobs=${METRONOME_SANITIZE_JOBS:-$(nproc)}
stamp=$prefix/.caf-0.17.6-tsan
[ -f "$stamp" ] && exit 0

url=${METRONOME_CAF_SOURCE_URL:-http://deb.debian.org/debian/pool/main/a/actor-framework/actor-framework_0.17.6.orig.tar.gz}
sha256=e2bf5bd243f08bb7d8adde197cfe3e6d71314ed3378fe0692f8932f4c3b3928c

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "build_caf_tsan: fetching $url"
curl -fsSL --retry 3 -o "$work/caf.tar.gz" "$url"
echo "$sha256  $work/caf.tar.gz" | sha256sum -c --quiet -
tar -xzf "$work/caf.tar.gz" -C "$work"
src=$work/actor-framework-0.17.6

CC=clang-19 CXX=clang++-19 cmake -S "$src" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="-std=c++17 -include limits -fsanitize=thread -gline-tables-only" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib \
  -DCAF_NO_AUTO_LIBCPP=yes -DCAF_NO_COMPILER_CHECK=yes -DCAF_NO_EXAMPLES=yes \
  -DCAF_NO_UNIT_TESTS=yes -DCAF_NO_OPENSSL=yes -DCAF_NO_OPENCL=yes -DCAF_NO_TOOLS=yes \
  -DCAF_NO_PYTHON=yes -DCAF_NO_SUMMARY=yes -DCAF_LOG_LEVEL=QUIET > "$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
ninja -C "$work/build" -j"$jobs" > "$work/build.log" || { tail -40 "$work/build.log"; exit 1; }
ninja -C "$work/build" install > /dev/null
touch "$stamp"
echo "build_caf_tsan: CAF 0.17.6 with TSan in $prefix"
