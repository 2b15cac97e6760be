#!/usr/bin/env bash
# Faults between hosts, in network namespaces: the shards run in a namespace of their own,
# reached over a veth link; the coordinator and two workers on this host. Cases, each
# training 1 epoch of Fashion-MNIST in PS mode (BSP, 2 workers, 2 shards) with a fresh
# coordinator:
#   direct: the link as it is (the baseline);
#   proxied: through tests/netem/delay_proxy.py with no delay (what the proxy itself costs);
#   impaired: 5 ms one way in each direction between workers and shards (the proxy, since
#     this kernel has no tc netem) and 1 % of packets dropped in each direction (iptables'
#     statistic match in the namespace): TCP retransmits them.
#   partitioned_head: --replicas=2, each shard's head (replica 0) in the namespace and its
#     backup on this host; once training runs the namespace is cut off (iptables DROP on its
#     link) until the coordinator has taken both heads out of their chains, and training
#     goes on on the backups. Healed, an old head refuses a client that still takes it for
#     the head (UNAVAILABLE: no split brain), joins its chain again by a state transfer, and
#     ends with its chain's fingerprint; no worker rolls back. The heads' --forward_timeout
#     (1 s) is shorter than the cut: a head cut off with an update in flight waits to hear
#     from the coordinator instead of stopping itself.
# Each must finish (workers exit 0, test accuracy >= 0.80); samples/s of both are printed.
# A worker cut off the network and its rejoin run in the Docker stage (network_cut).
#   tests/netem/run.sh [BAZEL_BIN]       (root; last line "netem stage: P passed, F failed, S skipped")
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-$(bazel info -c opt bazel-bin 2>/dev/null)}
ns=psc-netem host_if=psc-neth ns_if=psc-netn host_ip=10.77.0.1 shard_ip=10.77.0.2
passed=0 failed=0 skipped=0
work=$(mktemp -d /tmp/pscluster_netem.XXXXXX)
log() { echo "[$(date +%H:%M:%S)] $*"; }
finish() { echo "netem stage: $passed passed, $failed failed, $skipped skipped"; ((failed == 0)); }

if [[ $(id -u) -ne 0 ]] || ! ip netns add "$ns" 2>/dev/null; then
  log "SKIPPED direct, proxied, impaired, partitioned_head: network namespaces need root (ip netns add failed)"
  skipped=4; finish; exit
fi
if ! command -v iptables >/dev/null; then  # the loss and the cut need it: say so, run nothing
  log "FAIL: iptables is missing (deploy/install_deps.sh --tests installs it)"
  failed=1; finish; exit
fi
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  ip netns del "$ns" 2>/dev/null
  ip link del "$host_if" 2>/dev/null
  [[ -n ${PSCLUSTER_NETEM_KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
ip link add "$host_if" type veth peer name "$ns_if"
ip link set "$ns_if" netns "$ns"
ip addr add "$host_ip/24" dev "$host_if" && ip link set "$host_if" up
ip netns exec "$ns" ip addr add "$shard_ip/24" dev "$ns_if"
ip netns exec "$ns" ip link set "$ns_if" up
ip netns exec "$ns" ip link set lo up
in_ns() { ip netns exec "$ns" "$@"; }  # (not for background processes: $! would be a subshell)

# The address a process prints once it serves (bounded).
address_in() {  # log
  local t line
  for ((t = 0; t < 300; ++t)); do
    line=$(grep -m1 -o "listening on [^ ]*" "$1" 2>/dev/null) && { echo "${line#listening on }"; return; }
    sleep 0.1
  done
  return 1
}

run_case() {  # name delay_ms(-1: no proxy) loss_probability
  local name=$1 delay=$2 loss=$3 dir=$work/$1 s r impaired=0
  ((delay >= 0)) && impaired=1
  mkdir -p "$dir"
  local started=("${#pids[@]}")
  "$bin/server/coordinator/ps_coordinator" --host="$host_ip" --port=0 --num_shards=2 \
    --num_workers=2 >"$dir/coordinator.log" 2>&1 &
  pids+=($!)
  local coordinator; coordinator=$(address_in "$dir/coordinator.log") || { log "$name: no coordinator"; return 1; }
  if ((impaired)); then
    ip netns exec "$ns" /usr/bin/python3 tests/netem/delay_proxy.py "$shard_ip:5000" "$shard_ip:6000" "$delay" \
      "$shard_ip:5001" "$shard_ip:6001" "$delay" >"$dir/proxy.log" 2>&1 &
    pids+=($!)
    for chain_port in "INPUT --dport" "OUTPUT --sport"; do
      [[ $loss == 0 ]] || in_ns iptables -A ${chain_port% *} -p tcp ${chain_port#* } 5000:5001 \
        -m statistic --mode random --probability "$loss" -j DROP
    done
  fi
  for s in 0 1; do
    local port=$((5000 + s)) advertise=()
    ((impaired)) && { port=$((6000 + s)); advertise=(--advertise_port=$((5000 + s))); }
    ip netns exec "$ns" "$bin/server/ps/ps_server" --host="$shard_ip" --port="$port" "${advertise[@]}" \
      --shard_id=$s --num_shards=2 --coordinator="$coordinator" >"$dir/shard$s.log" 2>&1 &
    pids+=($!)
  done
  local t0=$SECONDS worker_pids=()
  for r in 0 1; do
    timeout 900 "$bin/worker/ps_worker" --coordinator="$coordinator" --rank=$r --world=2 --epochs=1 \
      --host=127.0.0.1 --progress_every=5s --summary_json="$dir/worker$r.json" >"$dir/worker$r.log" 2>&1 &
    worker_pids+=($!)
  done
  local ok=1
  for p in "${worker_pids[@]}"; do wait "$p" || ok=0; done
  if ((impaired)); then in_ns iptables -F; fi
  local acc sps
  acc=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['test_accuracy'])" "$dir/worker0.json" 2>/dev/null || echo none)
  sps=$(/usr/bin/python3 -c "import json,sys; print(round(sum(json.load(open(f'{sys.argv[1]}/worker{r}.json'))['samples_per_sec'] for r in (0, 1))))" "$dir" 2>/dev/null || echo none)
  for p in "${pids[@]:started}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]:started}"; do wait "$p" 2>/dev/null; done  # ports free for the next case
  if ((ok)) && /usr/bin/python3 -c "import sys; sys.exit(not float('$acc') >= 0.80)" 2>/dev/null; then
    log "PASS $name: both workers done in $((SECONDS - t0)) s, test accuracy $acc, $sps samples/s (both workers)"
    passed=$((passed + 1)); echo "$sps" >"$work/$name.sps"
  else
    log "FAIL $name: workers ok=$ok, accuracy $acc; last lines:"; tail -n 5 "$dir"/worker*.log "$dir"/shard*.log
    failed=$((failed + 1))
  fi
}

# Waits (bounded) until `file` has a line with `needle`.
await_line() {  # file needle seconds
  local t
  for ((t = 0; t < $3 * 10; ++t)); do
    grep -q -F "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  log "waited $3 s for '$2' in $1"; return 1
}
probe() { PYTHONPATH="$PWD/python:$bin/python" /usr/bin/python3 tests/netem/replica_probe.py "$@"; }

run_partition_case() {
  local name=partitioned_head dir=$work/partitioned_head ok=1 why=""
  mkdir -p "$dir"
  local started=${#pids[@]}
  "$bin/server/coordinator/ps_coordinator" --host="$host_ip" --port=0 --num_shards=2 \
    --num_workers=2 --replicas=2 --heartbeat_timeout_ms=1000 >"$dir/coordinator.log" 2>&1 &
  pids+=($!)
  local coordinator; coordinator=$(address_in "$dir/coordinator.log") || { log "FAIL $name: no coordinator"; failed=$((failed + 1)); return; }
  local backups=()
  for s in 0 1; do
    ip netns exec "$ns" "$bin/server/ps/ps_server" --host="$shard_ip" --port=$((5000 + s)) \
      --shard_id=$s --num_shards=2 --replica=0 --coordinator="$coordinator" \
      --forward_timeout=1s >"$dir/head$s.log" 2>&1 &
    pids+=($!)
    "$bin/server/ps/ps_server" --host="$host_ip" --port=0 --shard_id=$s --num_shards=2 --replica=1 \
      --coordinator="$coordinator" >"$dir/backup$s.log" 2>&1 &
    pids+=($!)
    backups+=("$(address_in "$dir/backup$s.log")")
  done
  local t0=$SECONDS worker_pids=()
  for r in 0 1; do
    timeout 900 "$bin/worker/ps_worker" --coordinator="$coordinator" --rank=$r --world=2 --epochs=3 \
      --host=127.0.0.1 --progress_every=1s --summary_json="$dir/worker$r.json" >"$dir/worker$r.log" 2>&1 &
    worker_pids+=($!)
  done
  await_line "$dir/worker0.log" "step " 120 || { ok=0; why="training did not start"; }
  in_ns iptables -I INPUT -i "$ns_if" -j DROP
  in_ns iptables -I OUTPUT -o "$ns_if" -j DROP
  local cut=$SECONDS
  for s in 0 1; do
    await_line "$dir/coordinator.log" "shard $s replica 0 left its chain" 30 || { ok=0; why="head $s stayed in its chain"; }
  done
  local lines; lines=$(grep -c "step " "$dir/worker0.log")
  for ((t = 0; t < 600; ++t)); do  # training goes on without the heads (bounded)
    (($(grep -c "step " "$dir/worker0.log") > lines)) && break
    sleep 0.1
  done
  (($(grep -c "step " "$dir/worker0.log") > lines)) || { ok=0; why="training stopped with the heads cut off"; }
  log "$name: heads cut off for $((SECONDS - cut)) s; training went on on the backups"
  in_ns iptables -F
  local pushed; pushed=$(probe push "$shard_ip:5000")
  [[ $pushed == UNAVAILABLE* ]] || { ok=0; why="the old head took a push: $pushed"; }
  log "$name: a push to the old head of shard 0: $pushed"
  for s in 0 1; do
    await_line "$dir/coordinator.log" "shard $s replica 0 joined its chain" 120 || { ok=0; why="old head $s did not rejoin"; }
  done
  log "$name: old heads that waited out the cut with an update in flight: $(grep -l "coordinator cannot be reached either" "$dir"/head*.log 2>/dev/null | wc -l) of 2"
  for p in "${worker_pids[@]}"; do wait "$p" || { ok=0; why="a worker failed"; }; done
  local acc rollbacks
  acc=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['test_accuracy'])" "$dir/worker0.json" 2>/dev/null || echo 0)
  rollbacks=$(/usr/bin/python3 -c "import json,sys; print(sum(len(json.load(open(f'{sys.argv[1]}/worker{r}.json'))['rollbacks']) for r in (0, 1)))" "$dir" 2>/dev/null || echo none)
  [[ $rollbacks == 0 ]] || { ok=0; why="rollbacks: $rollbacks"; }
  for s in 0 1; do
    local f0 f1; f0=$(probe fingerprint "$shard_ip:$((5000 + s))") f1=$(probe fingerprint "${backups[$s]}")
    [[ -n $f0 && $f0 == "$f1" ]] || { ok=0; why="shard $s replicas differ: $f0 vs $f1"; }
  done
  for p in "${pids[@]:started}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]:started}"; do wait "$p" 2>/dev/null; done
  if ((ok)) && /usr/bin/python3 -c "import sys; sys.exit(not float('$acc') >= 0.80)" 2>/dev/null; then
    log "PASS $name: done in $((SECONDS - t0)) s, no rollback, test accuracy $acc, both old heads rejoined with their chains' fingerprints"
    passed=$((passed + 1))
  else
    log "FAIL $name: ${why:-accuracy $acc}; last lines:"; tail -n 5 "$dir"/*.log
    failed=$((failed + 1))
  fi
}

# PSCLUSTER_NETEM_ONLY=NAME runs that case alone (the others count as skipped).
only=${PSCLUSTER_NETEM_ONLY:-}
for c in "direct -1 0" "proxied 0 0" "impaired 5 0.01"; do
  if [[ -z $only || $only == "${c%% *}" ]]; then run_case $c; else skipped=$((skipped + 1)); fi
done
if [[ -z $only || $only == partitioned_head ]]; then run_partition_case; else skipped=$((skipped + 1)); fi
for c in proxied impaired; do
  [[ -f $work/direct.sps && -f $work/$c.sps ]] \
    && log "$c/direct samples/s: $(/usr/bin/python3 -c "print(round($(cat "$work/$c.sps") / $(cat "$work/direct.sps"), 3))")"
done
finish
