#!/usr/bin/env bash
# Boots a throw-away systemd as PID 1 of fresh pid/mount/cgroup/uts/ipc namespaces, runs one
# command against it, and tears it all down. For testing units on machines (developers',
# CI's) that run as root but whose own PID 1 is not systemd. See docs/testing.md.
#
#   UNIT_DIR=dir [APP_DIR=dir] timeout -k 5 180 test/tools/systemd-lab.sh 'systemctl start x.service'
#
# The command runs with bash -c inside the lab's namespaces (nsenter), as root; the exit code
# is the command's. Run it under `timeout -k`: unshare ignores SIGTERM, and the cleanup here
# runs from the EXIT trap.
#
# Environment:
#   UNIT_DIR      units under test; with generated stand-ins for the standard targets it is
#                 systemd's whole unit path (required)
#   APP_DIR       a directory shown inside at APP_MOUNT (default /opt/agent-connectors)
#   WORK          scratch directory (default: a new mktemp -d); holds console.log, systemd's
#                 own console output, and the stand-in units
#   BOOT_TIMEOUT  seconds to wait for systemd to be up (30)
#   RUN_TIMEOUT   seconds the command may take (120)
#   LOGLEVEL      systemd's log level, info or debug (info)
#   LAB_OVERLAY   1: the lab's /etc, /usr and /var/lib/dpkg are writable overlays of the
#                 host's (changes land in WORK/overlay), so a package can be installed,
#                 upgraded and purged inside; default: /etc read-only, /usr the host's
#   LAB_ROOT      a root file system (test/tools/debian-root.sh makes stock Debian ones):
#                 a writable overlay of it is the lab's / and its own systemd boots, so a
#                 package meets that distribution as it ships (changes land in WORK/overlay)
#
# Exit codes besides the command's: 2 cannot run here (not root, a tool missing),
# 3 systemd did not come up.
set -euo pipefail

die() { echo "systemd-lab: $2" >&2; exit "$1"; }

TOOLS=$(cd "$(dirname "$0")" && pwd)
: "${UNIT_DIR:?set UNIT_DIR to the directory of the units under test}"
[ "$(id -u)" = 0 ] || die 2 "needs root (namespaces, cgroups, mounts)"
SYSTEMD=/lib/systemd/systemd
[ -x "$SYSTEMD" ] || die 2 "no $SYSTEMD (Debian: apt-get install systemd)"
for tool in unshare nsenter script timeout systemctl; do
  command -v "$tool" >/dev/null || die 2 "$tool is not installed"
done

UNIT_DIR=$(cd "$UNIT_DIR" && pwd)
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
APP_DIR=${APP_DIR:-}
[ -z "$APP_DIR" ] || APP_DIR=$(cd "$APP_DIR" && pwd)
APP_MOUNT=${APP_MOUNT:-/opt/agent-connectors}
BOOT_TIMEOUT=${BOOT_TIMEOUT:-30}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
LOGLEVEL=${LOGLEVEL:-info}
CONSOLE=$WORK/console.log
PIDFILE=$WORK/systemd.pid
COMMAND=${1:-systemctl --no-pager status}
rm -f "$PIDFILE"
: >"$CONSOLE"

# Stand-ins: the standard targets as empty units, so units with default dependencies,
# After=network.target or WantedBy=multi-user.target load unchanged, while nothing that
# sysinit.target would pull in on a real boot (tmpfiles, sysctl, udev, modules, clock) is
# even known to this systemd: the lab cannot change the host. Journald is the host's real
# one (journalctl -u is part of what tests check); lab.target is what gets booted.
STUBS=$WORK/stubs
rm -rf "$STUBS"
mkdir -p "$STUBS"
for target in basic emergency final getty graphical local-fs local-fs-pre multi-user network \
  network-online network-pre nss-lookup nss-user-lookup paths remote-fs rescue shutdown slices \
  sockets swap sysinit time-set time-sync timers umount; do
  printf '[Unit]\nDescription=systemd-lab stand-in for %s.target\nDefaultDependencies=no\n' "$target" >"$STUBS/$target.target"
done
printf '[Unit]\nDescription=systemd-lab boot target\nDefaultDependencies=no\nWants=systemd-journald.service\nAfter=systemd-journald.service\n' >"$STUBS/lab.target"
for unit in systemd-journald.service systemd-journald.socket systemd-journald-dev-log.socket; do
  ln -s "/lib/systemd/system/$unit" "$STUBS/$unit"
done

# The lab's cgroups: a new leaf under this shell's cgroup in every hierarchy, entered before
# anything is started, so systemd (in its own cgroup namespace) sees that leaf as its root,
# and everything it starts can be found and removed afterwards.
LEAF=systemd-lab-$$
leaves=()
SD_PID=""
BOOT_PID=""
cleanup() {
  set +e
  # SIGKILL to a namespace's PID 1 ends every process in that pid namespace at once.
  [ -n "$SD_PID" ] && kill -KILL "$SD_PID" 2>/dev/null
  [ -n "$BOOT_PID" ] && { kill -KILL "$BOOT_PID" 2>/dev/null; wait "$BOOT_PID" 2>/dev/null; }
  local i leaf
  for leaf in "${leaves[@]}"; do
    echo $$ >"$(dirname "$leaf")/cgroup.procs" 2>/dev/null
    # A cgroup can only be removed once its processes are gone, which takes a moment after
    # the kill; the innermost first (find -depth).
    for i in $(seq 1 50); do
      find "$leaf" -depth -type d -exec rmdir {} + 2>/dev/null
      [ -d "$leaf" ] || break
      sleep 0.1
    done
    [ -d "$leaf" ] && echo "systemd-lab: could not remove cgroup $leaf" >&2
  done
}
trap cleanup EXIT

if [ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ]; then V2=/sys/fs/cgroup; else V2=/sys/fs/cgroup/unified; fi
# Read in full first: /proc/self/cgroup changes under a reader as this shell moves.
mapfile -t memberships </proc/self/cgroup
for membership in "${memberships[@]}"; do
  IFS=: read -r _ controllers path <<<"$membership"
  case "$controllers" in
    "") base=$V2 ;;
    name=systemd) base=/sys/fs/cgroup/systemd ;;
    *) base=/sys/fs/cgroup/$controllers ;;
  esac
  [ -f "$base/cgroup.procs" ] || continue
  leaf=$base${path%/}/$LEAF
  mkdir "$leaf"
  leaves+=("$leaf")
  # A v1 cpuset cgroup starts with no cpus and no memory nodes and takes no process until
  # it has both.
  if [ -f "$leaf/cpuset.cpus" ]; then
    cat "$(dirname "$leaf")/cpuset.cpus" >"$leaf/cpuset.cpus"
    cat "$(dirname "$leaf")/cpuset.mems" >"$leaf/cpuset.mems"
  fi
  echo $$ >"$leaf/cgroup.procs"
done

# script(1) gives the lab a pty; the init script makes it systemd's /dev/console, so boot
# and unit status messages land in console.log. unshare --kill-child: should unshare die,
# the lab's PID 1 goes with it.
LAB_OVERLAY=${LAB_OVERLAY:-}
LAB_ROOT=${LAB_ROOT:-}
[ -z "$LAB_ROOT" ] || [ -x "$LAB_ROOT/lib/systemd/systemd" ] || die 2 "LAB_ROOT $LAB_ROOT has no /lib/systemd/systemd"
export UNIT_DIR WORK APP_DIR APP_MOUNT LOGLEVEL STUBS PIDFILE LAB_OVERLAY LAB_ROOT
script -qfec "exec unshare --pid --fork --mount --cgroup --uts --ipc --propagation private --kill-child bash '$TOOLS/systemd-lab-init.sh'" \
  "$CONSOLE" </dev/null >/dev/null 2>&1 &
BOOT_PID=$!

# The init script writes its host pid (which becomes systemd's) before it execs systemd.
state=""
for _ in $(seq 1 $((BOOT_TIMEOUT * 10))); do
  if [ -z "$SD_PID" ] && [ -s "$PIDFILE" ]; then SD_PID=$(cat "$PIDFILE"); fi
  # The exe is the host's systemd, or with LAB_ROOT that root's (its path as seen inside).
  if [ -n "$SD_PID" ] && case "$(readlink "/proc/$SD_PID/exe" 2>/dev/null)" in */systemd) true ;; *) false ;; esac; then
    state=$(nsenter -t "$SD_PID" -p -m -C -u -r -w timeout 2 systemctl is-system-running 2>/dev/null || true)
    case "$state" in running | degraded) break ;; esac
  fi
  kill -0 "$BOOT_PID" 2>/dev/null || die 3 "the lab exited while booting; see $CONSOLE"
  sleep 0.1
done
[ -n "$SD_PID" ] || die 3 "systemd did not start within ${BOOT_TIMEOUT}s; see $CONSOLE"
echo "# systemd-lab host-pid=$SD_PID state=${state:-unknown}"

set +e
timeout -k 5 "$RUN_TIMEOUT" nsenter -t "$SD_PID" -p -m -C -u -r -w bash -c "$COMMAND"
rc=$?
echo "# systemd-lab command rc=$rc"
exit $rc
