#!/usr/bin/env bash
# The fresh-machine stage: the README's two set-up commands and its tour, as written, in a fresh
# Debian 12 root (deploy/debian_root.sh: debootstrap minbase, nothing else installed, no
# `python`, only what the commands install themselves), each timed; it fails when either
# fails. CI's machine has packages, a `python` and a CPU that a new user's may lack: this is
# where a missing install step shows. .ci/run runs it after tests/run.sh (never tests/run.sh
# itself, which runs inside the root here).
#   tests/fresh_machine.sh [OUT=/tmp/pscluster_fresh_machine]
# The committed HEAD travels (a clone), not the working tree. The root's base tar is made once
# and kept at /var/cache/pscluster/bookworm-minbase.tar (delete it to make a new one); each run
# unpacks a copy and deletes it after. Inside, the commands run as root in a private mount and
# PID namespace, so their mounts and any process they leave die with it. Stages that such a
# root cannot host (Docker, network namespaces) count as skipped inside, saying why.
# Last line: "fresh_machine stage: P passed, F failed, S skipped" over the three.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/pscluster_fresh_machine}
summary() { echo "fresh_machine stage: $1 passed, $2 failed, $3 skipped"; }
if [[ $(id -u) -ne 0 ]] || ! unshare --mount --pid --fork true 2>/dev/null; then
  echo "fresh_machine: needs root and mount/PID namespaces (unshare): all three skipped"
  summary 0 0 3; exit 0
fi
mkdir -p "$out" /var/cache/pscluster
base=/var/cache/pscluster/bookworm-minbase.tar
if [[ ! -s $base ]]; then
  deploy/debian_root.sh "$base" || { echo "fresh_machine: no fresh root could be made"; summary 0 3 0; exit 1; }
fi
run=$(mktemp -d /var/tmp/pscluster_fresh.XXXXXX) root=$run/root
# The namespace takes its mounts with it; a lazy unmount here covers an interrupted unshare.
cleanup() {
  findmnt -rn -o TARGET | grep -F "$run/" | sort -r | xargs -r -n1 umount -l 2>/dev/null
  [[ -z $(findmnt -rn -o TARGET | grep -F "$run/") ]] && rm -rf --one-file-system "$run"
}
trap cleanup EXIT
mkdir -p "$root" && tar -C "$root" --numeric-owner -xf "$base"
cp /etc/resolv.conf "$root/etc/resolv.conf"
git clone -q --no-hardlinks . "$root/root/pscluster"
[[ -d ../shared ]] && cp -a ../shared "$root/root/shared"   # the project's ../shared, as in CI

# run_in_root NAME COMMAND...: the command as a new user types it, in the clone, with a
# standard PATH and nothing else from this machine's environment; its output in OUT/NAME.log.
# One exception: the fuzz targets run briefly, as their build is what a fresh root checks
# (tests/run.sh has run them in full on the host).
run_in_root() {
  local name=$1; shift
  echo "fresh_machine: $* (log: $out/$name.log)"
  unshare --mount --propagation private --pid --fork --kill-child -- bash -c '
    r=$1; shift
    mount -t proc proc "$r/proc" && mount -t sysfs sys "$r/sys" && mount --bind /dev "$r/dev" &&
      mount --bind /dev/pts "$r/dev/pts" &&
      mount -t tmpfs -o mode=1777,nosuid,nodev shm "$r/dev/shm" || exit 125
    exec chroot "$r" /usr/bin/env -i HOME=/root CI=true \
      PSCLUSTER_CI_FUZZ_RUNS=2000 PSCLUSTER_CI_FUZZ_SECONDS=20 \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      bash -c "cd /root/pscluster && exec \"\$@\"" command "$@"
  ' inner "$root" "$@" </dev/null >"$out/$name.log" 2>&1
}

passed=0 failed=0
# The tour (tests/readme_tour.sh runs the README's tour commands as written) comes after the
# main job, whose installs and build it uses as a reader's machine would have them.
for step in "main:deploy/local_cluster.sh" "tour:tests/readme_tour.sh" "tests:tests/run.sh"; do
  name=${step%%:*} command=${step#*:} start=$SECONDS
  run_in_root "$name" "$command"; rc=$?
  took=$((SECONDS - start))
  tail -n 3 "$out/$name.log" | sed 's/^/    /'
  if ((rc == 0)); then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  echo "fresh_machine: $command exited $rc after $((took / 60)) min $((took % 60)) s"
done
summary "$passed" "$failed" 0
((failed == 0))
