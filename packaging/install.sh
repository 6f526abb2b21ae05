#!/bin/sh
# Installs agent-connectors from this tarball on a host without dpkg: the .deb's own tree,
# then what dpkg does with it, by the .deb's own maintainer script (postinst: the users and
# directories from sysusers.d and tmpfiles.d, daemon-reload; on an upgrade the restart of
# what was running and 0.1.0's renames). A first install enables and starts nothing, as
# the .deb: enrol, then `systemctl enable --now agent-connectors.target`.
#
#   sudo ./install.sh            install, or upgrade an install made from a tarball
#   sudo @MAINTAINER@/uninstall.sh [--purge]
set -eu

here=$(cd "$(dirname "$0")" && pwd)
lib=@LIBDIR@
maintainer=@MAINTAINER@

die() { echo "install.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (it writes /usr and creates system users)"
for tool in systemd-sysusers systemd-tmpfiles systemctl; do
  command -v "$tool" >/dev/null || die "$tool is missing: agent-connectors runs as systemd services"
done
if command -v dpkg-query >/dev/null && dpkg-query -W -f '${Status}' agent-connectors 2>/dev/null | grep -q ' installed$'; then
  die "agent-connectors is installed as a .deb here: upgrade it with apt or dpkg, or remove it first"
fi
"$here$lib/node/bin/node" --version >/dev/null 2>&1 || [ ! -e "$here$lib/node" ] ||
  die "the Node this tarball carries does not run on this machine ($(uname -m)); take the tarball of this architecture"

old=
if [ -f "$lib/package.json" ]; then
  old=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$lib/package.json" | head -n 1)
fi
old_files=
[ ! -f "$maintainer/files" ] || old_files=$(cat "$maintainer/files")

# The app directory is swapped whole, as dpkg replaces each file by a rename: running
# services keep the code they loaded until postinst restarts them.
rm -rf "$lib.new" "$lib.old"
cp -a "$here$lib" "$lib.new"
[ ! -e "$lib" ] || mv "$lib" "$lib.old"
mv "$lib.new" "$lib"
rm -rf "$lib.old"
while read -r f; do
  mkdir -p "$(dirname "$f")"
  cp -a "$here$f" "$f.new"
  mv -f "$f.new" "$f"
done <"$maintainer/files"
# What the version before shipped and this one does not (0.1.0's renew-fetch unit), as dpkg removes it.
for f in $old_files; do
  grep -qxF "$f" "$maintainer/files" || rm -f "$f"
done

sh "$maintainer/postinst" configure "$old"
echo "agent-connectors $(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$lib/package.json" | head -n 1) installed${old:+ (was $old)}; uninstall: $maintainer/uninstall.sh [--purge]"
