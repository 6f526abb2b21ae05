#!/usr/bin/env bash
# A stock Debian root file system for the package lab (contract-tests/labs/deb-debian.ts),
# made by mmdebstrap from Debian's own packages and cached between runs. Prints its path.
#
#   test/tools/debian-root.sh bookworm|trixie
#
# What is in it: variant minbase, systemd, and what a host already has where the package
# is installed (passwd for useradd, procps, curl for the lab's own checks), and the
# distribution's own nodejs: on bookworm (18) to show the package does not use it, on
# trixie (20.19) for the previous release, which ran on the system's Node.
#
# The cache: $AGENT_CONNECTORS_ROOT_CACHE, else $XDG_CACHE_HOME/agent-connectors-lab, else
# /var/cache/agent-connectors-lab; one directory per suite and UTC day
# (<suite>-<YYYYMMDD>/root), so a machine rebuilds a root at most once a day and picks up
# Debian's updates then; older roots of the suite are deleted when a new one is made. A
# root is built aside and renamed into place: a half-built one is never used.
#
# Exit codes: 2 cannot run here (not root, no mmdebstrap), 1 mmdebstrap failed.
set -euo pipefail

die() { echo "debian-root: $2" >&2; exit "$1"; }

SUITE=${1:?usage: debian-root.sh bookworm|trixie}
case "$SUITE" in
  bookworm | trixie) ;;
  *) die 2 "unknown suite $SUITE (bookworm or trixie)" ;;
esac
[ "$(id -u)" = 0 ] || die 2 "needs root (mmdebstrap --mode=root)"
command -v mmdebstrap >/dev/null || die 2 "mmdebstrap is not installed (Debian: apt-get install mmdebstrap)"

CACHE=${AGENT_CONNECTORS_ROOT_CACHE:-${XDG_CACHE_HOME:+$XDG_CACHE_HOME/agent-connectors-lab}}
CACHE=${CACHE:-/var/cache/agent-connectors-lab}
KEY=$SUITE-$(date -u +%Y%m%d)
DIR=$CACHE/$KEY
if [ -d "$DIR/root" ]; then
  echo "$DIR/root"
  exit 0
fi

mkdir -p "$CACHE"
# One builder per suite at a time (two test runs, two checkouts).
exec 9>"$CACHE/$SUITE.lock"
flock 9
if [ -d "$DIR/root" ]; then
  echo "$DIR/root"
  exit 0
fi
NEW=$CACHE/.$KEY.$$
rm -rf "$NEW"
mkdir -p "$NEW"
trap 'rm -rf "$NEW"' EXIT
start=$(date +%s)
# The host's own apt sources name the mirror this machine reaches; the suite is ours.
mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)\/\{0,1\}$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
mirror=${mirror:-http://deb.debian.org/debian}
mmdebstrap --mode=root --variant=minbase --format=directory \
  --include=systemd,systemd-sysv,dbus,passwd,procps,curl,ca-certificates,nodejs \
  --dpkgopt=force-unsafe-io --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  "$SUITE" "$NEW/root" "$mirror" >"$NEW/mmdebstrap.log" 2>&1 || { tail -n 30 "$NEW/mmdebstrap.log" >&2; die 1 "mmdebstrap $SUITE failed"; }
echo "$SUITE root built in $(($(date +%s) - start)) s from $mirror" >"$NEW/built"
for old in "$CACHE/$SUITE"-*; do [ -d "$old" ] && rm -rf "$old"; done
mv "$NEW" "$DIR"
trap - EXIT
echo "$DIR/root"
