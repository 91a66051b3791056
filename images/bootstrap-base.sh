#!/bin/sh
# Build a minimal Debian (or Ubuntu) root filesystem from that distribution's packages
# and import it as a Docker image, for machines that cannot pull a base image from a
# registry.
# usage: bootstrap-base.sh TAG SUITE MIRROR PACKAGES [KEYRING COMPONENTS UPDATES SCRIPT]
#   PACKAGES    comma-separated, installed with the minimal base
#   KEYRING     the archive's keyring (default: debootstrap's own, Debian's)
#   COMPONENTS  comma-separated (default: main)
#   UPDATES     further suites of the same archive (comma-separated: jammy-updates,...),
#               written to the root's sources.list and upgraded to
#   SCRIPT      debootstrap's script for a suite it does not know by name
set -eu
tag=$1 suite=$2 mirror=$3 packages=$4
keyring=${5:-} components=${6:-main} updates=${7:-} script=${8:-}
command -v debootstrap >/dev/null || {
  echo "debootstrap is not installed (apt-get install debootstrap)" >&2; exit 3; }
root=$(mktemp -d /tmp/ale-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT INT TERM
set -- --variant=minbase --include="$packages" --components="$components"
[ -z "$keyring" ] || set -- "$@" --keyring="$keyring"
set -- "$@" "$suite" "$root" "$mirror"
[ -z "$script" ] || set -- "$@" "$script"
debootstrap "$@" >&2
if [ -n "$updates" ]; then
  comps=$(echo "$components" | tr , ' ')
  { echo "deb $mirror $suite $comps"
    for u in $(echo "$updates" | tr , ' '); do echo "deb $mirror $u $comps"; done
  } > "$root/etc/apt/sources.list"
  chroot "$root" apt-get -q update >&2
  DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get -q -y -o Dpkg::Options::=--force-confold dist-upgrade >&2
fi
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" --numeric-owner -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/sh"]' - "$tag" >&2
echo "$tag"
