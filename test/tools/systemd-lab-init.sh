#!/usr/bin/env bash
# PID 1 of the lab's fresh namespaces until it execs systemd (started by systemd-lab.sh).
# Every mount made here belongs to the lab's private mount namespace: the host sees none.
set -euo pipefail

# /proc is still the host's here, so /proc/self/stat gives this shell's host pid, which
# becomes systemd's: the launcher needs it to nsenter and to kill the lab.
read -r host_pid _ </proc/self/stat
echo "$host_pid" >"$PIDFILE"

mount -t proc proc /proc

# systemd needs writable cgroup hierarchies rooted at its own cgroup (the launcher's leaf):
# fresh mounts inside the cgroup namespace give exactly that.
if [ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ]; then
  mount -t cgroup2 cgroup2 /sys/fs/cgroup
else
  # A new tmpfs to hold the hybrid layout's mount points; the host's stays as it is.
  mount -t tmpfs -o mode=755 systemd-lab-cgroup /sys/fs/cgroup
  while IFS=: read -r _ controllers _; do
    case "$controllers" in
      "") dir=unified; mkdir -p /sys/fs/cgroup/$dir; mount -t cgroup2 cgroup2 /sys/fs/cgroup/$dir ;;
      name=systemd) dir=systemd; mkdir -p /sys/fs/cgroup/$dir; mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/$dir ;;
      *) dir=$controllers; mkdir -p "/sys/fs/cgroup/$dir"; mount -t cgroup -o "$controllers" cgroup "/sys/fs/cgroup/$dir" ;;
    esac
  done </proc/self/cgroup
fi

# The directories a lab needs may sit under /tmp, /var/lib or /opt, which become empty
# below: bind them aside under a fresh /run first, then move them back in place (APP_DIR
# to APP_MOUNT).
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/lock
keep=("$WORK" "$UNIT_DIR")
[ -z "$APP_DIR" ] || keep+=("$APP_DIR")
for i in "${!keep[@]}"; do
  mkdir -p "/run/systemd-lab-keep/$i"
  mount --bind "${keep[$i]}" "/run/systemd-lab-keep/$i"
done
# Private, empty: /tmp and /var/tmp (the host's temporary files must not meet tmpfiles or
# PrivateTmp=), /var/lib (StateDirectory=, DynamicUser='s /var/lib/private), /var/log
# (journald's persistent journal), /opt (where the app appears).
# LAB_OVERLAY: the package database must survive the empty /var/lib below, so its overlay
# is mounted aside first (a mount keeps its lower directory even once that is hidden).
overlay() { # <lower> <name> <mount point>
  mkdir -p "$WORK/overlay/$2/upper" "$WORK/overlay/$2/work" "$3"
  mount -t overlay "systemd-lab-$2" -o "lowerdir=$1,upperdir=$WORK/overlay/$2/upper,workdir=$WORK/overlay/$2/work" "$3"
}
[ "$LAB_OVERLAY" != 1 ] || overlay /var/lib/dpkg dpkg /run/systemd-lab-dpkg
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=1777 tmpfs /var/tmp
for dir in /var/lib /var/log /opt; do mount -t tmpfs -o mode=755 tmpfs "$dir"; done
for i in 0 1; do
  mkdir -p "${keep[$i]}"
  mount --move "/run/systemd-lab-keep/$i" "${keep[$i]}"
done
if [ -n "$APP_DIR" ]; then
  mkdir -p "$APP_MOUNT"
  mount --move /run/systemd-lab-keep/2 "$APP_MOUNT"
fi
rm -rf /run/systemd-lab-keep
if [ "$LAB_OVERLAY" = 1 ]; then
  mkdir -p /var/lib/dpkg
  mount --move /run/systemd-lab-dpkg /var/lib/dpkg
  rmdir /run/systemd-lab-dpkg
  # Users, groups, /etc and /usr start as the host's; what a package (or systemd-sysusers)
  # changes stays in the lab.
  overlay /etc etc /etc
  overlay /usr usr /usr
else
  # Users, groups and the rest of /etc come from the host, read-only: a unit may read them,
  # nothing in the lab may change them (systemd-sysusers and the like never run here).
  mount --bind /etc /etc
  mount -o remount,bind,ro /etc
fi
mount --bind "$(tty)" /dev/console
hostname systemd-lab
if [ -n "${LAB_ROOT:-}" ]; then
  # Another distribution's root (a cached mmdebstrap tree): a writable overlay of it
  # becomes / and its own systemd boots. /proc/sys and /sys are read-only inside, as
  # systemd-nspawn has them, so no unit of that root (sysctl, binfmt, udev) changes the
  # host's kernel; the lab's directories, /dev and the console are bound in.
  new=$WORK/overlay/root/merged
  overlay "$LAB_ROOT" root "$new"
  mount -t proc proc "$new/proc"
  mount --bind "$new/proc/sys" "$new/proc/sys"
  mount -o remount,bind,ro "$new/proc/sys"
  mount -t sysfs -o ro sysfs "$new/sys"
  mount --rbind /sys/fs/cgroup "$new/sys/fs/cgroup"
  mount --rbind /dev "$new/dev"
  for dir in /run /tmp /var/tmp; do mount -t tmpfs -o mode=1777 tmpfs "$new$dir"; done
  chmod 755 "$new/run"
  for dir in "$WORK" "$UNIT_DIR"; do
    mkdir -p "$new$dir"
    mount --bind "$dir" "$new$dir"
  done
  mount --make-rprivate /
  cd "$new"
  mkdir -p .lab-old-root
  pivot_root . .lab-old-root
  cd /
  umount -l /.lab-old-root
  rmdir /.lab-old-root
fi
# Private first (unshare --propagation private), so nothing propagates back to the host;
# shared now, because systemd expects it: LoadCredential= and PrivateTmp= set up mounts in
# a child namespace that must show up here.
mount --make-rshared /

exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin container=systemd-lab SYSTEMD_UNIT_PATH="$UNIT_DIR:$STUBS" \
  /lib/systemd/systemd --system --unit=lab.target --log-target=console --log-level="$LOGLEVEL" --show-status=no
