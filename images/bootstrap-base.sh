#!/bin/sh
# Build a minimal Debian root filesystem from Debian packages and import it as
# a Docker image, for machines that cannot pull a base image from a registry.
# usage: bootstrap-base.sh TAG SUITE MIRROR PACKAGES(comma-separated)
set -eu
tag=$1 suite=$2 mirror=$3 packages=$4
command -v debootstrap >/dev/null || {
  echo "debootstrap is not installed (apt-get install debootstrap)" >&2; exit 3; }
root=$(mktemp -d /tmp/ale-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT INT TERM
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >&2
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" --numeric-owner -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/sh"]' - "$tag" >&2
echo "$tag"
