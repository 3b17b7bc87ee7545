#!/usr/bin/env bash
# Installs Debian 12's clang 19 with its sanitizer and libFuzzer runtimes when
# missing (bench/fuzz/run.sh, tools/check_sanitizers.sh). clang 19 rather than
# the default clang 14: libstdc++ 12's <expected>, which the code uses, needs
# the C++20 concepts of clang 16 or newer.
set -euo pipefail
packages=(clang-19 libclang-rt-19-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install_clang.sh: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
