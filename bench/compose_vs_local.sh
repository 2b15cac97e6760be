#!/usr/bin/env bash
# The docker-compose cluster against deploy/local_cluster.sh, in one sitting: the image
# built from the sources (multi-stage deploy/Dockerfile; its build time and size), then
# `docker-compose up` from a clean state (no volumes) training EPOCHS epochs, then the local
# cluster training the same. Prints test accuracy, samples/s (both workers) and wall time of
# each, and their ratio. Uses a running Docker engine or starts one (tests/docker/lib.sh).
#
#   bench/compose_vs_local.sh [--epochs 10] [--rounds 1] [--prebuilt BIN_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
source tests/docker/lib.sh
epochs=10 rounds=1 prebuilt=""
while (($#)); do
  case $1 in
    --epochs) epochs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --prebuilt) prebuilt=$2; shift 2 ;;
    *) echo "bench/compose_vs_local.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
docker_up || { echo "compose_vs_local: $docker_reason" >&2; exit 1; }
work=$(mktemp -d /tmp/pscluster_compose_bench.XXXXXX)
project=pscluster_bench
compose() { "$COMPOSE" -p "$project" -f deploy/docker-compose.yml -f "$work/override.yml" "$@"; }
trap 'compose down -v --remove-orphans >/dev/null 2>&1; docker_down; rm -rf "$work"' EXIT
printf 'version: "2.4"\nservices:\n  worker0: {environment: {FLAGS_epochs: "%s"}}\n  worker1: {environment: {FLAGS_epochs: "%s"}}\n' \
  "$epochs" "$epochs" >"$work/override.yml"

deploy/base_image.sh || exit 1
image=pscluster:$(cat VERSION)
t0=$SECONDS
how="multi-stage, from the sources"
[[ -n $prebuilt ]] && how="from the binaries in $prebuilt"
build_image "$image" "$work/dist" "$work/build.log" "$prebuilt" || { tail -n 30 "$work/build.log"; exit 1; }
log "image $image ($how) built in $((SECONDS - t0)) s, $(( $("$DOCKER" image inspect -f '{{.Size}}' "$image") / 1000000 )) MB"

json() { /usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d[sys.argv[2]])" "$@"; }
for ((r = 1; r <= rounds; ++r)); do
  compose down -v --remove-orphans >/dev/null 2>&1
  t0=$SECONDS
  compose up -d >"$work/up.log" 2>&1 || { cat "$work/up.log"; log "docker-compose up failed"; exit 1; }
  for w in worker0 worker1; do
    code=$(timeout 1800 "$DOCKER" wait "$(compose ps -q $w)") || { log "$w did not finish within 30 min"; exit 1; }
    [[ $code == 0 ]] || { compose logs --tail=20 "$w"; log "$w exited $code"; exit 1; }
  done
  compose_wall=$((SECONDS - t0))
  # summary.json as local_cluster.sh writes it (deploy/summarize.py: samples/s summed the same way).
  mkdir -p "$work/compose"
  for w in worker0 worker1; do copy_summary "$(compose ps -q $w)" "$w" "$work/compose" || exit 1; done
  /usr/bin/python3 deploy/summarize.py "$work/compose" 2 2 "$epochs" bsp "$compose_wall" ps 4 >/dev/null
  compose_acc=$(json "$work/compose/summary.json" test_accuracy)
  compose_sps=$(json "$work/compose/summary.json" samples_per_sec)
  log "round $r: docker-compose up: test accuracy $compose_acc, $compose_sps samples/s, wall $compose_wall s (up to both workers exited)"
  compose down -v --remove-orphans >/dev/null 2>&1

  deploy/local_cluster.sh --epochs "$epochs" --out "$work/local" >"$work/local.log" 2>&1 \
    || { tail -n 20 "$work/local.log"; exit 1; }
  local_acc=$(json "$work/local/summary.json" test_accuracy)
  local_sps=$(json "$work/local/summary.json" samples_per_sec)
  local_wall=$(json "$work/local/summary.json" wall_seconds)
  log "round $r: deploy/local_cluster.sh: test accuracy $local_acc, $local_sps samples/s, wall $local_wall s"
  /usr/bin/python3 -c "print('round $r: compose / local: samples/s %.2f, wall %.2f' % ($compose_sps / $local_sps, $compose_wall / $local_wall))"
  rm -rf "$work/local" "$work/compose"
done
