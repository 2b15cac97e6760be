#!/usr/bin/env bash
# Makes the local image debian:bookworm that deploy/Dockerfile starts FROM, for a Docker
# with no registry to pull from: the fresh root of deploy/debian_root.sh (debootstrap
# --variant=minbase), then docker import. Does nothing when the image exists. Needs root.
#   deploy/base_image.sh [--mirror URL]     (DOCKER_HOST as for docker itself)
set -euo pipefail
mirror=http://deb.debian.org/debian
[[ ${1:-} == --mirror ]] && mirror=$2
docker=${DOCKER:-/usr/bin/docker}
if "$docker" image inspect debian:bookworm >/dev/null 2>&1; then
  echo "base_image: debian:bookworm exists"; exit 0
fi
tar=$(mktemp --suffix=.tar /var/tmp/pscluster_rootfs.XXXXXX)
trap 'rm -f "$tar"' EXIT
"$(dirname "$0")/debian_root.sh" "$tar" --mirror "$mirror"
"$docker" import - debian:bookworm <"$tar" >/dev/null
echo "base_image: imported debian:bookworm ($("$docker" image inspect -f '{{.Size}}' debian:bookworm | awk '{printf "%.0f MB", $1/1e6}'))"
