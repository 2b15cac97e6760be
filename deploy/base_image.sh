#!/usr/bin/env bash
# Makes the local image debian:bookworm that deploy/Dockerfile starts FROM, for a Docker
# with no registry to pull from: debootstrap --variant=minbase, apt sources as in Debian's
# official image (bookworm, bookworm-updates, bookworm-security), apt's caches emptied,
# then docker import. Does nothing when the image exists. Needs root and debootstrap.
#   deploy/base_image.sh [--mirror URL]     (DOCKER_HOST as for docker itself)
set -euo pipefail
mirror=http://deb.debian.org/debian
[[ ${1:-} == --mirror ]] && mirror=$2
docker=${DOCKER:-/usr/bin/docker}
if "$docker" image inspect debian:bookworm >/dev/null 2>&1; then
  echo "base_image: debian:bookworm exists"; exit 0
fi
command -v debootstrap >/dev/null || { echo "base_image: needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
root=$(mktemp -d /var/tmp/pscluster_rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "base_image: debootstrap --variant=minbase bookworm from $mirror (about a minute)"
timeout 900 debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -n 20 "$root.log" >&2; rm -f "$root.log"
       echo "base_image: debootstrap failed or took over 15 minutes (is $mirror reachable?)" >&2; exit 1; }
rm -f "$root.log" "$root/etc/apt/sources.list"
cat >"$root/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
chmod 755 "$root"  # mktemp made it 0700: the image's / must be traversable by every user
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
tar -C "$root" -c . | "$docker" import - debian:bookworm >/dev/null
echo "base_image: imported debian:bookworm ($("$docker" image inspect -f '{{.Size}}' debian:bookworm | awk '{printf "%.0f MB", $1/1e6}'))"
