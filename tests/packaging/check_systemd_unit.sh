#!/usr/bin/env bash
# Checks examples/metronome.service: systemd-analyze verify accepts it (with
# ExecStart pointed at the built binary, which verify requires to exist), and
# it keeps the settings docs/operations.md promises. Exits 77 (skipped) when
# systemd-analyze is not installed.
# Usage: check_systemd_unit.sh UNIT METRONOME_BIN
set -euo pipefail
unit=$1
bin=$2

fail() { echo "check_systemd_unit: $*" >&2; exit 1; }

setting() { # the value of the last KEY= line
  grep -E "^$1=" "$unit" | tail -n 1 | cut -d= -f2-
}
[ "$(setting Restart)" = on-failure ] || fail "Restart must be on-failure"
[ "$(setting KillSignal)" = SIGTERM ] || fail "KillSignal must be SIGTERM (the drain)"
[ "$(setting NoNewPrivileges)" = true ] || fail "NoNewPrivileges must be true"
[ "$(setting ProtectSystem)" = strict ] || fail "ProtectSystem must be strict"
user=$(setting User)
[ -n "$user" ] && [ "$user" != root ] || fail "User must name a dedicated user, got '$user'"
stop=$(setting TimeoutStopSec)
# The drain's default (server.drain_timeout_s, 30 s) plus the 3 s the
# connections get to close.
[[ "$stop" =~ ^[0-9]+$ ]] && [ "$stop" -gt 33 ] \
  || fail "TimeoutStopSec must exceed the 30 s drain plus 3 s, got '$stop'"

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "check_systemd_unit: systemd-analyze is not installed: skipping verify (settings checked)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed "s|/usr/local/bin/metronome|$bin|" "$unit" > "$work/metronome.service"
grep -q "^ExecStart=$bin " "$work/metronome.service" || fail "ExecStart does not run /usr/local/bin/metronome"
out=$(systemd-analyze verify "$work/metronome.service" 2>&1) || { echo "$out" >&2; fail "systemd-analyze verify failed"; }
# verify exits 0 on some warnings; any line about our unit is a problem.
if grep -F "metronome.service" <<<"$out" >&2; then
  fail "systemd-analyze verify warned about the unit"
fi
echo "check_systemd_unit: $unit verified"
