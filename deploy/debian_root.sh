#!/usr/bin/env bash
# Makes a fresh Debian 12 root as a tar file: debootstrap --variant=minbase bookworm, apt
# sources as in Debian's official image (bookworm, bookworm-updates, bookworm-security), apt's
# caches emptied, nothing else installed. The Docker base image (deploy/base_image.sh) and the
# fresh-machine stage (tests/fresh_machine.sh) both start from it. Needs root; installs
# debootstrap when it is missing.
#   deploy/debian_root.sh OUT.tar [--mirror URL]
set -euo pipefail
out=${1:?usage: deploy/debian_root.sh OUT.tar [--mirror URL]}
mirror=http://deb.debian.org/debian
[[ ${2:-} == --mirror ]] && mirror=$3
if ! command -v debootstrap >/dev/null; then
  echo "debian_root: installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
root=$(mktemp -d /var/tmp/pscluster_rootfs.XXXXXX)
trap 'rm -rf --one-file-system "$root" "$root.log" "$out.tmp"' EXIT
echo "debian_root: debootstrap --variant=minbase bookworm from $mirror (about a minute)"
# A private mount namespace: whatever debootstrap mounts cannot outlive it.
timeout 900 unshare --mount --propagation private \
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -n 20 "$root.log" >&2
       echo "debian_root: debootstrap failed or took over 15 minutes (is $mirror reachable?)" >&2
       exit 1; }
rm -f "$root/etc/apt/sources.list"
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
chmod 755 "$root"  # mktemp made it 0700: / must be traversable by every user
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
tar -C "$root" --numeric-owner -cf "$out.tmp" . && mv "$out.tmp" "$out"
echo "debian_root: wrote $out ($(du -m "$out" | cut -f1) MB)"
