# Shared by the Docker tests (sourced): a Docker engine for the test, and bounded waits.
#
# docker_up: uses the engine DOCKER_HOST (or /var/run/docker.sock) names if one answers;
# otherwise starts Debian's dockerd (root only) with its own data root, exec root, socket
# and pid file, vfs storage, no iptables and no default bridge (the tests make their own
# networks; builds use the host network), and docker_down stops that one by its pid.
# Images and the build cache stay in the data root between runs (PSCLUSTER_DOCKER_ROOT,
# default /var/lib/pscluster-test-docker) so a second run does not rebuild the world.

DOCKER=/usr/bin/docker           # Debian's docker.io client, the engine's own version
COMPOSE=/usr/bin/docker-compose
PSCLUSTER_DOCKER_ROOT=${PSCLUSTER_DOCKER_ROOT:-/var/lib/pscluster-test-docker}
started_dockerd_pid="" docker_reason=""
docker_exec_root=/run/pscluster-test-docker  # dockerd's, ours alone

log() { echo "[$(date +%H:%M:%S)] $*"; }

# wait_for SECONDS WHAT COMMAND...: runs COMMAND every half second until it succeeds;
# after SECONDS fails saying what it waited for.
wait_for() {
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      log "gave up after ${limit}s waiting for $what"
      return 1
    fi
    sleep 0.5
  done
}

docker_up() {  # sets DOCKER_HOST; returns 1 with the reason in docker_reason when none can run
  local sock
  for sock in "${DOCKER_HOST:-}" unix:///var/run/docker.sock; do
    [[ -n $sock ]] || continue
    if DOCKER_HOST=$sock "$DOCKER" info >/dev/null 2>&1; then
      export DOCKER_HOST=$sock
      log "using the running Docker engine at $sock"
      return 0
    fi
  done
  if [[ $(id -u) -ne 0 ]]; then
    docker_reason="no Docker engine answers and starting dockerd needs root"; return 1
  fi
  if [[ ! -x /usr/sbin/dockerd || ! -x $COMPOSE || ! -x $DOCKER ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      docker.io docker-compose debootstrap >/dev/null 2>&1 \
      || { docker_reason="apt-get install docker.io docker-compose debootstrap failed"; return 1; }
  fi
  mkdir -p "$PSCLUSTER_DOCKER_ROOT"
  local exec_root=$docker_exec_root
  export DOCKER_HOST=unix://$PSCLUSTER_DOCKER_ROOT/docker.sock
  /usr/sbin/dockerd --storage-driver=vfs --iptables=false --ip-masq=false --bridge=none \
    --data-root="$PSCLUSTER_DOCKER_ROOT/data" --exec-root="$exec_root" \
    --pidfile="$PSCLUSTER_DOCKER_ROOT/dockerd.pid" --host="$DOCKER_HOST" \
    >"$PSCLUSTER_DOCKER_ROOT/dockerd.log" 2>&1 &
  started_dockerd_pid=$!
  # Up to 60 s for it to answer, but no longer than it lives: a dockerd that cannot run here
  # (no cgroups in a chroot) exits within a second, and waiting on would only cost time.
  local deadline=$((SECONDS + 60)) answered=0
  while ((SECONDS < deadline)); do
    if "$DOCKER" info >/dev/null 2>&1; then answered=1; break; fi
    kill -0 "$started_dockerd_pid" 2>/dev/null || { log "dockerd exited before it answered"; break; }
    sleep 0.5
  done
  if ((!answered)); then
    tail -n 5 "$PSCLUSTER_DOCKER_ROOT/dockerd.log"
    docker_down
    docker_reason="dockerd did not start (log: $PSCLUSTER_DOCKER_ROOT/dockerd.log)"; return 1
  fi
  log "started dockerd (pid $started_dockerd_pid, data root $PSCLUSTER_DOCKER_ROOT/data)"
}

docker_down() {  # stops the dockerd docker_up started, if it did
  [[ -n $started_dockerd_pid ]] || return 0
  kill -TERM "$started_dockerd_pid" 2>/dev/null || true
  local t
  for ((t = 0; t < 60; ++t)); do
    kill -0 "$started_dockerd_pid" 2>/dev/null || break
    sleep 0.5
  done
  if kill -0 "$started_dockerd_pid" 2>/dev/null; then
    log "dockerd (pid $started_dockerd_pid) did not stop within 30 s of SIGTERM: SIGKILL"
    kill -KILL "$started_dockerd_pid" 2>/dev/null || true
  fi
  wait "$started_dockerd_pid" 2>/dev/null || true
  # It leaves the bind mount of its network namespace (netns/default) under its exec root,
  # which is this script's own: unmounted, so nothing of the stage outlives it.
  findmnt -rn -o TARGET | grep -F "$docker_exec_root/" | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  log "stopped dockerd (pid $started_dockerd_pid)"
  started_dockerd_pid=""
}

# build_image IMAGE DIST LOG [BIN_DIR]: the image, and its .deb in DIST. Without BIN_DIR the
# multi-stage build from the sources (then stage `deb` exports the package it made, from
# the build cache); with BIN_DIR, build_deb.sh packs those binaries and the runtime stage
# installs that package (PACKAGE=prebuilt). Run from the checkout's root; output in LOG.
# Each docker build gets 40 minutes (a cold multi-stage build takes about 6 here).
build_image() {
  local image=$1 dist=$2 build_log=$3 bin_dir=${4:-}
  local build=(timeout 2400 env DOCKER_BUILDKIT=1 "$DOCKER" build --network=host -f deploy/Dockerfile)
  mkdir -p "$dist"
  if [[ -z $bin_dir ]]; then
    "${build[@]}" -t "$image" . >"$build_log" 2>&1 \
      && "${build[@]}" --target deb --output "type=local,dest=$dist" . >>"$build_log" 2>&1
  else
    deploy/build_deb.sh --bin-dir "$bin_dir" --out "$dist" >"$build_log" 2>&1 \
      && "${build[@]}" --build-arg PACKAGE=prebuilt -t "$image" "$dist" >>"$build_log" 2>&1
  fi
  local status=$?
  ((status == 124)) && echo "docker build of $image did not finish within 40 minutes" >>"$build_log"
  return "$status"
}

# copy_summary CONTAINER SERVICE DIR: the worker's --summary_json (runs volume) to DIR/SERVICE.json.
copy_summary() {
  "$DOCKER" cp "$1:/var/lib/pscluster/runs/$2.json" - 2>/dev/null | tar -xO >"$3/$2.json"
}
