#!/usr/bin/env bash
# Strict offline check of unit files: `systemd-analyze verify` with no output allowed.
#
#   verify-units.sh UNIT_FILE...
#
# systemd-analyze verify reports an unknown key, a value it cannot parse or a missing
# executable as a warning and still exits 0, so a typo in a unit would pass a plain exit
# code check; here any line it prints is a failure. Needs systemd-analyze, no running
# systemd. Prints `verify: clean (N units)` and exits 0, or the findings and exits 1.
set -u
if [ $# -eq 0 ]; then
  echo "usage: verify-units.sh UNIT_FILE..." >&2
  exit 2
fi
command -v systemd-analyze >/dev/null || { echo "verify: systemd-analyze is not installed (Debian: apt-get install systemd)" >&2; exit 2; }
# notice keeps the findings (warnings) and drops the info chatter of some versions; --man=no
# because a Documentation= man page may well not be installed on a test machine.
findings=$(SYSTEMD_LOG_LEVEL=notice SYSTEMD_COLORS=0 timeout 60 systemd-analyze verify --man=no "$@" 2>&1)
rc=$?
if [ $rc -eq 0 ] && [ -z "$findings" ]; then
  echo "verify: clean ($# units)"
  exit 0
fi
[ -z "$findings" ] || printf '%s\n' "$findings"
echo "verify: FAILED (systemd-analyze exit $rc, $(printf '%s' "$findings" | grep -c '') lines of findings)"
exit 1
