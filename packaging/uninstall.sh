#!/bin/sh
# Removes an agent-connectors installed from the tarball, as `dpkg -r` (or with --purge,
# `dpkg -P`) removes the .deb, by the .deb's own maintainer scripts: prerm stops the
# services, the files go, postrm reloads systemd; --purge also deletes the state,
# /etc/agent-connectors, the enablement links and the users (docs/packaging.md).
set -eu

lib=@LIBDIR@
maintainer=@MAINTAINER@

[ "$(id -u)" = 0 ] || { echo "uninstall.sh: run as root" >&2; exit 1; }
case "${1:-}" in
  "") purge= ;;
  --purge) purge=1 ;;
  *) echo "usage: uninstall.sh [--purge]" >&2; exit 2 ;;
esac
[ -f "$maintainer/files" ] || { echo "uninstall.sh: no tarball install in $lib" >&2; exit 1; }

# postrm and the file list outlive the app directory for the steps after it.
keep=$(mktemp -d)
trap 'rm -rf "$keep"' EXIT
cp "$maintainer/postrm" "$maintainer/files" "$keep/"

sh "$maintainer/prerm" remove
while read -r f; do rm -f "$f"; done <"$keep/files"
rm -rf "$lib"
sh "$keep/postrm" remove
[ -z "$purge" ] || sh "$keep/postrm" purge
echo "agent-connectors removed${purge:+ and purged}"
