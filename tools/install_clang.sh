#!/usr/bin/env bash
# Installs Debian 12's clang 19 with its sanitizer and libFuzzer runtimes when
# missing (bench/fuzz/run.sh, tools/check_sanitizers.sh). clang 19 rather than
# the default clang 14: libstdc++ 12's <expected>, which the code uses, needs
# the C++20 concepts of clang 16 or newer.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/apt_install_missing.sh" install_clang.sh clang-19 libclang-rt-19-dev
