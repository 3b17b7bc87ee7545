#!/usr/bin/env bash
# Installs those of the named Debian packages that are not installed yet
# (sudo where not root), quietly; installs nothing when all are there.
#   tools/apt_install_missing.sh WHO PACKAGE...   (WHO names the caller in the log line)
set -euo pipefail
who=$1
shift
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0
echo "$who: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
