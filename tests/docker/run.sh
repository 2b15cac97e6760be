#!/usr/bin/env bash
# The Docker stage of tests/run.sh: the image, the docker-compose cluster and the Debian
# package, tested for real on a Docker engine (tests/docker/lib.sh starts one if needed).
#
#   tests/docker/run.sh [--bin-dir DIR] [--full-build] [--epochs N]
#
# --bin-dir: a Bazel bin root with CPU builds of the four binaries; the image is then built
#   from the package made of them (deploy/Dockerfile, PACKAGE=prebuilt). --full-build (or
#   no --bin-dir): the multi-stage build from the sources instead.
# Cases: the image builds (its size printed); `up` trains to the end (workers exit 0,
# accuracy from their summary); a shard container crashes mid-training and comes back
# from the last checkpoint (restart policy), the workers roll back and finish; a worker is
# cut off the network past the heartbeat timeout and reconnected: the others name it and
# the run recovers or fails clearly, never hangs; with TLS and tokens on (compose.env), a
# plaintext call, a call without a token and one with a wrong token are refused, and the
# cluster token cannot switch modes; the .deb installs in a fresh container,
# its units verify and its daemons train one epoch; nothing is left behind.
# Last line: "docker stage: P passed, F failed, S skipped".
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/docker/lib.sh

bin_dir="" epochs=1  # epochs of the training case; the fault cases train 3 (fault in the 2nd)
while (($#)); do
  case $1 in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --full-build) bin_dir=""; shift ;;
    --epochs) epochs=$2; shift 2 ;;
    *) echo "tests/docker/run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

version=$(cat VERSION)
image=pscluster:$version
project=pscluster_test
work=$(mktemp -d /tmp/pscluster_docker_test.XXXXXX)
passed=0 failed=0 skipped=0
pass() { passed=$((passed + 1)); log "PASS $*"; }
fail() { failed=$((failed + 1)); log "FAIL $*"; }
finish() {
  echo "docker stage: $passed passed, $failed failed, $skipped skipped"
  ((failed == 0))
}

cases=(image compose_train tls_refusals metrics_scrape shard_crash network_cut deb_install cleanup)
if ! docker_up; then
  echo "tests/docker/run.sh: SKIPPED every case (${cases[*]}): $docker_reason"
  skipped=${#cases[@]}
  finish; exit
fi

export TEST_EPOCHS=1  # substituted into override.yml by docker-compose
compose() { "$COMPOSE" -p "$project" -f deploy/docker-compose.yml -f "$work/override.yml" "$@"; }
cleanup() {
  compose down -v --remove-orphans >/dev/null 2>&1 || true
  "$DOCKER" rm -f pscluster_deb_test >/dev/null 2>&1 || true
  "$DOCKER" image prune -f >/dev/null 2>&1 || true
  # BuildKit's cache under the vfs driver is a whole copy of the file system per layer:
  # kept from run to run it filled this machine's disk (72 GB after a few dozen runs). A
  # run's two builds share it; the next run starts without.
  "$DOCKER" builder prune -af >/dev/null 2>&1 || true
}
on_exit() { cleanup; docker_down; rm -rf "$work"; }
trap on_exit EXIT

# ---- the image
image_ok=0
if deploy/base_image.sh; then
  build_log=$work/build.log
  t0=$SECONDS
  if [[ -z $bin_dir ]]; then
    log "building $image from the sources (multi-stage deploy/Dockerfile)"
  else
    log "building $image from the binaries in $bin_dir (deploy/build_deb.sh, PACKAGE=prebuilt)"
  fi
  if build_image "$image" "$work/dist" "$build_log" "$bin_dir"; then
    size=$("$DOCKER" image inspect -f '{{.Size}}' "$image")
    pass "image: $image built in $((SECONDS - t0)) s, $((size / 1000000)) MB"
    image_ok=1
  else
    tail -n 30 "$build_log"; fail "image: the build failed (log above)"
  fi
else
  fail "image: no debian:bookworm base image (deploy/base_image.sh)"
fi

# Test overrides: short runs, frequent progress lines.
cat >"$work/override.yml" <<YML
version: "2.4"
services:
  worker0:
    environment: {FLAGS_epochs: "\${TEST_EPOCHS}", FLAGS_progress_every: "1s"}
  worker1:
    environment: {FLAGS_epochs: "\${TEST_EPOCHS}", FLAGS_progress_every: "1s"}
YML

cid() { compose ps -q "$1"; }
# psctl in the coordinator's container, with its TLS and cluster token (compose.env).
psctl_in() { compose exec -T coordinator psctl --coordinator=localhost:4000 --tryfromenv=tls_ca,token_file "$@"; }
# Waits (bounded) for a service's container to exit; prints its exit code.
await_exit() {  # service seconds
  local id; id=$(cid "$1")
  timeout "$2" "$DOCKER" wait "$id" 2>/dev/null || { echo "timeout"; return 1; }
}
# The newest complete checkpoint's step, asked inside the coordinator's container.
latest_checkpoint() {
  psctl_in checkpoints 2>/dev/null \
    | awk '/^ *[0-9]+/ {s = $1} END {if (s != "") print s; else exit 1}'
}
checkpoint_at_least() { local s; s=$(latest_checkpoint) && ((s >= $1)); }
summary_field() {  # service field
  copy_summary "$(cid "$1")" "$1" "$work" \
    && /usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" \
         "$work/$1.json" "$2"
}
# Brings the cluster up from nothing, with both workers training EPOCHS epochs.
up_fresh() {  # epochs
  compose down -v --remove-orphans >/dev/null 2>&1
  TEST_EPOCHS=$1; compose up -d >"$work/up.log" 2>&1 || { cat "$work/up.log"; return 1; }
}
# Both workers exit within the bound; sets w0 and w1 to their exit codes.
await_workers() {  # seconds
  w0=$(await_exit worker0 "$1") || true
  w1=$(await_exit worker1 "$1") || true
}
dump_logs() { compose logs --no-color --tail=25 >"$work/logs.txt" 2>&1; cat "$work/logs.txt"; }
# A worker that never reached the coordinator (its registration saw UNAVAILABLE until its
# minute ran out; it never joined) exits 2, and docker's restart policy (on-failure:3) starts
# it again: what the compose file's policy is for. Seen about once in six runs of this stage
# on a virtual machine: every TLS handshake from one worker's container timed out while
# the other containers' went through, and the restarted worker joined and trained. Such a
# restart is allowed here and said; any other first exit is judged as it is. Sets the
# variable named VAR to the restarted run's exit code.
rejoined_after_unreachable() {  # service var seconds
  local id first
  id=$(cid "$1")
  # The first run, to its fatal line (common/logging.h: "TIME E ps_worker/RANK message").
  first=$("$DOCKER" logs "$id" 2>&1 | sed -E '/ E ps_worker(\/[0-9]+)? /q')
  grep -q "retrying for up to" <<<"$first" && ! grep -q "cluster complete" <<<"$first" || return 1
  log "compose_train: $1 never reached the coordinator in its first run" \
    "($(grep -E ' E ps_worker(/[0-9]+)? ' <<<"$first" | head -c 300)); docker's restart policy started it again"
  wait_for 60 "$1 to be restarted by docker" \
    bash -c "(( \$(\"$DOCKER\" inspect -f '{{.RestartCount}}' $id) >= 1 ))" || return 1
  printf -v "$2" %s "$(await_exit "$1" "$3")"
}

if ((image_ok == 0)); then
  skipped=$((skipped + 5))
  log "SKIPPED compose_train, tls_refusals, metrics_scrape, shard_crash, network_cut: no image"
else
  # ---- train to the end
  log "compose_train: docker-compose up, $epochs epoch(s)"
  t0=$SECONDS
  if up_fresh "$epochs"; then
    await_workers 900
    rejoined=""
    [[ $w0 == 2 ]] && rejoined_after_unreachable worker0 w0 900 && rejoined+=" worker0"
    [[ $w1 == 2 ]] && rejoined_after_unreachable worker1 w1 900 && rejoined+=" worker1"
    acc=$(summary_field worker0 test_accuracy 2>/dev/null || echo none)
    sps=$(summary_field worker0 samples_per_sec 2>/dev/null || echo none)
    progress=$(compose logs --no-color worker0 2>/dev/null | grep -c "step" || true)
    if [[ $w0 == 0 && $w1 == 0 ]] && /usr/bin/python3 -c "import sys; sys.exit(not float('$acc') >= 0.80)" 2>/dev/null \
        && ((progress > 0)); then
      pass "compose_train: workers exited 0 after $((SECONDS - t0)) s; test accuracy $acc, $sps samples/s (worker 0), $progress progress lines${rejoined:+; restarted by docker after an unreachable coordinator:$rejoined}"
    else
      dump_logs; fail "compose_train: worker exits $w0/$w1, accuracy $acc, $progress progress lines"
    fi
  else
    fail "compose_train: docker-compose up failed"
  fi

  # ---- TLS and tokens: what is refused (the cluster from compose_train is still up)
  log "tls_refusals: plaintext, no token, a wrong token, the cluster token on an admin call"
  refusal() {  # expected-text psctl-args...: psctl in the coordinator's container must fail saying it
    local want=$1 out; shift
    out=$(compose exec -T coordinator sh -c 'openssl rand -hex 32 >/tmp/wrong.token; exec psctl "$@"' \
          psctl --coordinator=localhost:4000 --timeout_seconds=5 "$@" 2>&1) && return 1
    grep -q "$want" <<<"$out" || { log "tls_refusals: expected '$want', got: $out"; return 1; }
  }
  ca=--tls_ca=/var/lib/pscluster/tls/ca.pem
  # (status exits 1 once the workers are done and gone: only 3, unreachable, is a refusal.)
  allowed=0; psctl_in status >/dev/null 2>&1 || allowed=$?
  if refusal UNAVAILABLE status \
      && refusal "UNAUTHENTICATED.*no token" "$ca" status \
      && refusal "UNAUTHENTICATED.*wrong token" "$ca" --token_file=/tmp/wrong.token status \
      && refusal "PERMISSION_DENIED.*admin token" "$ca" --token_file=/var/lib/pscluster/tls/cluster.token \
           switch-mode --mode=allreduce \
      && ((allowed <= 1)); then
    pass "tls_refusals: plaintext UNAVAILABLE, no/wrong token UNAUTHENTICATED, cluster token on SwitchMode PERMISSION_DENIED; the cluster token reads the status"
  else
    fail "tls_refusals: a call that should be refused was not, or said something else (log above)"
  fi

  # ---- metrics: what Prometheus on the `cluster` network would scrape (the shards and the
  # coordinator of compose_train still run; the workers are done), fetched from this host
  # over the bridge network
  log "metrics_scrape: /metrics on :9100 of shard0 and the coordinator"
  scrape() {  # service
    local ip; ip=$("$DOCKER" inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$(cid "$1")")
    /usr/bin/python3 -c "import sys, urllib.request
print(urllib.request.urlopen(f'http://{sys.argv[1]}:9100/metrics', timeout=5).read().decode())" "$ip"
  }
  shard_metrics=$(scrape shard0 2>&1) coordinator_metrics=$(scrape coordinator 2>&1)
  pushes=$(awk '/^pscluster_ps_pushes_total\{/ {s += $NF} END {print s + 0}' <<<"$shard_metrics")
  if grep -q '^pscluster_info{.*role="shard"' <<<"$shard_metrics" && ((${pushes%.*} > 0)) \
      && grep -q '^pscluster_coordinator_members{' <<<"$coordinator_metrics"; then
    pass "metrics_scrape: shard0 counted $pushes pushes; the coordinator reports its members"
  else
    log "metrics_scrape: shard0 said: $(head -c 300 <<<"$shard_metrics")"
    log "metrics_scrape: coordinator said: $(head -c 300 <<<"$coordinator_metrics")"
    fail "metrics_scrape: the metrics were not there or not as expected"
  fi

  # ---- a shard crashes mid-training
  log "shard_crash: SIGKILL to shard0's process once a checkpoint past step 0 exists"
  if up_fresh 3 && wait_for 300 "a checkpoint past step 0" checkpoint_at_least 1; then
    step=$(latest_checkpoint)
    pid=$("$DOCKER" inspect -f '{{.State.Pid}}' "$(cid shard0)")
    kill -KILL "$pid"
    log "shard_crash: killed shard0 (pid $pid on this host) after the checkpoint of step $step"
    await_workers 600
    restarts=$("$DOCKER" inspect -f '{{.RestartCount}}' "$(cid shard0)")
    rolled=$(compose logs --no-color worker0 2>/dev/null | grep -m1 "rolled back" || true)
    acc=$(summary_field worker0 test_accuracy 2>/dev/null || echo none)
    if [[ $w0 == 0 && $w1 == 0 && $restarts -ge 1 && -n $rolled ]]; then
      pass "shard_crash: shard0 restarted $restarts time(s); ${rolled#*| }; workers exited 0, accuracy $acc"
    else
      dump_logs; fail "shard_crash: worker exits $w0/$w1, shard0 restarts $restarts, rollback line '${rolled}'"
    fi
  else
    dump_logs; fail "shard_crash: the cluster did not come up or checkpoint"
  fi

  # ---- a worker cut off the network past the heartbeat timeout
  log "network_cut: worker1 off the network until the coordinator declares it dead, then back"
  network=${project}_cluster
  worker_declared_dead() {
    # (psctl status exits 1 while a member is dead: only its output counts here.)
    { psctl_in status 2>/dev/null || true; } \
      | grep -E "^worker +1 +DEAD"
  }
  if up_fresh 3 && wait_for 300 "a checkpoint past step 0" checkpoint_at_least 1; then
    w1id=$(cid worker1)
    "$DOCKER" network disconnect -f "$network" "$w1id"
    t_cut=$SECONDS
    wait_for 60 "the coordinator to declare worker 1 dead" worker_declared_dead; dead=$?
    log "network_cut: worker1 was off for $((SECONDS - t_cut)) s (declared dead: $((dead == 0)))"
    "$DOCKER" network connect --alias worker1 "$network" "$w1id"
    await_workers 600
    named=$(compose logs --no-color worker0 2>/dev/null | grep -m1 "worker rank 1 is down" || true)
    if [[ $w0 == timeout || $w1 == timeout ]]; then
      dump_logs; fail "network_cut: a worker still runs 600 s after the reconnect (hang)"
    elif [[ -z $named ]]; then
      dump_logs; fail "network_cut: worker0 never named the lost worker 1"
    elif [[ $w0 == 0 && $w1 == 0 ]]; then
      pass "network_cut: '${named#*| }'; recovered, both workers exited 0"
    else
      log "network_cut: worker exits $w0/$w1; last lines:"; compose logs --no-color --tail=5 worker0 worker1
      pass "network_cut: '${named#*| }'; the run ended with a clear failure (exits $w0/$w1), no hang"
    fi
  else
    dump_logs; fail "network_cut: the cluster did not come up or checkpoint"
  fi
  compose down -v --remove-orphans >/dev/null 2>&1
fi

# ---- the Debian package in a fresh container
log "deb_install: apt-get install ./pscluster_*.deb in a fresh debian:bookworm, units verified, one epoch"
deb=$(ls "$work"/dist/pscluster_*.deb 2>/dev/null | head -n1)  # build_image made it
if [[ -z $deb ]]; then
  fail "deb_install: no package to install"
elif timeout 900 "$DOCKER" run --name pscluster_deb_test --rm --network=host \
    -v "$work/dist:/pkg:ro" -v "$PWD/deploy/debian/install_test.sh:/install_test.sh:ro" \
    debian:bookworm bash /install_test.sh "/pkg/$(basename "$deb")" >"$work/deb.log" 2>&1; then
  pass "deb_install: $(basename "$deb") ($(($(stat -c %s "$deb") / 1000)) kB): $(grep -E "PASS" "$work/deb.log" | tail -n1)"
else
  tail -n 30 "$work/deb.log"; fail "deb_install: the install test failed (log above)"
fi

# ---- nothing left behind
cleanup
left=$("$DOCKER" ps -aq --filter "label=com.docker.compose.project=$project"; \
       "$DOCKER" network ls -q --filter "label=com.docker.compose.project=$project"; \
       "$DOCKER" volume ls -q --filter "label=com.docker.compose.project=$project")
if [[ -z $left ]]; then pass "cleanup: no container, network or volume of the test is left"
else fail "cleanup: left behind: $left"; fi
finish
