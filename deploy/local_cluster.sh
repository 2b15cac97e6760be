#!/usr/bin/env bash
# The main job: a local pscluster training the MLP on Fashion-MNIST.
#
#   deploy/local_cluster.sh [--workers N] [--shards N] [--epochs N] [--consistency bsp|ssp:S|asp]
#                           [--mode ps|allreduce] [--optimizer adam] [--lr 0.001]
#                           [--batch_size 64] [--out DIR]
#
# Installs what is missing (Debian packages, as root), builds, starts a coordinator, the
# shards and the workers on free loopback ports, prints progress, and ends with the test
# accuracy.
# DIR (default runs/<timestamp>) gets summary.json, every process's log and the shards'
# snapshots. Every process it started is stopped on exit, on Ctrl-C, or when one fails.
# The coordinator checkpoints every shard every epoch's worth of steps and whenever the
# test accuracy improves; a shard that dies is restarted from the last checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."

workers=2 shards=2 epochs=10 consistency=bsp optimizer=adam lr=0.001 batch_size=64 mode=ps
out="runs/$(date +%Y%m%d-%H%M%S)"
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while (($#)); do
  case $1 in
    --workers) workers=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --consistency) consistency=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --optimizer) optimizer=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --batch_size) batch_size=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "local_cluster.sh: unknown argument '$1'" >&2; usage 2 ;;
  esac
done
[[ $mode == ps || $mode == allreduce ]] || { echo "local_cluster.sh: --mode must be ps or allreduce" >&2; exit 2; }
[[ $mode == allreduce ]] && shards=0  # replicas on the workers; no parameter server
for n in "$workers" "$epochs" "$batch_size"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "local_cluster.sh: '$n' is not a positive count" >&2; exit 2; }
done

deploy/install_deps.sh
echo "== building (bazel -c opt)"
bazel build -c opt //server/coordinator:ps_coordinator //server/ps:ps_server //worker:ps_worker 2>&1 | tail -n 2
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
mkdir -p "$out"
out=$(cd "$out" && pwd)
echo "== run directory: $out"

pids=() names=()
cleanup() {
  for i in "${!pids[@]}"; do
    kill "${pids[$i]}" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'echo; echo "local_cluster.sh: interrupted, stopping every process"; exit 130' INT TERM

# Fails naming the process, its exit status and the end of its log.
die_with() {
  echo "local_cluster.sh: $1 failed ($2); last lines of $out/$1.log:" >&2
  tail -n 15 "$out/$1.log" >&2
  exit 1
}

# The address a process prints once it serves ("... listening on HOST:PORT").
address_of() {  # name index
  local line t
  for ((t = 0; t < 600; ++t)); do
    line=$(grep -m1 "listening on" "$out/$1.log" || true)
    [[ -n $line ]] && { line=${line##*listening on }; echo "${line%% *}"; return; }
    kill -0 "${pids[$2]}" 2>/dev/null || die_with "$1" "exited at start-up"
    sleep 0.1
  done
  die_with "$1" "did not start serving within 60 s"
}

start=$(date +%s)
# Cluster checkpoints: every epoch's worth of steps and whenever the test accuracy improves.
"$bin/server/coordinator/ps_coordinator" --port=0 --num_shards="$shards" --num_workers="$workers" \
  --data_dir="$out/coordinator" --checkpoint_every_steps=$((60000 / (workers * batch_size))) \
  >"$out/coordinator.log" 2>&1 &
pids+=($!) names+=("coordinator")
coordinator=$(address_of coordinator 0)
echo "== coordinator: $coordinator"
for ((s = 0; s < shards; ++s)); do
  "$bin/server/ps/ps_server" --port=0 --shard_id=$s --num_shards="$shards" \
    --coordinator="$coordinator" --data_dir="$out/checkpoints" >"$out/shard$s.log" 2>&1 &
  pids+=($!) names+=("shard$s")
done
addresses=()
for ((s = 0; s < shards; ++s)); do addresses+=("$(address_of "shard$s" $((s + 1)))"); done
((shards > 0)) && echo "== $shards shard(s): ${addresses[*]}"

for ((r = 0; r < workers; ++r)); do
  "$bin/worker/ps_worker" --coordinator="$coordinator" --rank=$r --world="$workers" --epochs="$epochs" \
    --consistency="$consistency" --optimizer="$optimizer" --lr="$lr" --batch_size="$batch_size" \
    --mode="$mode" --summary_json="$out/worker$r.json" >"$out/worker$r.log" 2>&1 &
  pids+=($!) names+=("worker$r")
done
echo "== $workers worker(s) training $epochs epoch(s) in $mode mode, $optimizer lr=$lr (progress of worker 0):"
tail -n +1 -f "$out/worker0.log" & tail_pid=$!

# Wait for the workers; any process that dies early stops the run.
remaining=$workers restarts=0
while ((remaining > 0)); do
  remaining=0
  for i in "${!pids[@]}"; do
    [[ -n ${pids[$i]} ]] || continue
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      [[ ${names[$i]} == worker* ]] && remaining=$((remaining + 1))
      continue
    fi
    status=0; wait "${pids[$i]}" || status=$?
    pids[$i]=""
    if [[ ${names[$i]} == shard* ]] && ((restarts < 3)); then
      # The launcher's part of recovery: bring the shard back from its last checkpoint;
      # the workers wait for it, roll every shard back to that checkpoint and go on.
      s=${names[$i]#shard}; restarts=$((restarts + 1))
      echo "== ${names[$i]} died (exit status $status); restarting it with --restore=latest"
      "$bin/server/ps/ps_server" --port=0 --shard_id="$s" --num_shards="$shards" \
        --coordinator="$coordinator" --data_dir="$out/checkpoints" --restore=latest \
        >>"$out/${names[$i]}.log" 2>&1 &
      pids[$i]=$!
      continue
    fi
    if [[ ${names[$i]} != worker* || $status -ne 0 ]]; then
      kill "$tail_pid" 2>/dev/null || true
      die_with "${names[$i]}" "exit status $status"
    fi
  done
  ((remaining > 0)) && sleep 0.5
done
kill "$tail_pid" 2>/dev/null || true
wall=$(( $(date +%s) - start ))

python3 - "$out" "$workers" "$shards" "$epochs" "$consistency" "$wall" "$mode" <<'PY'
import json, os, sys
out, workers, shards, epochs, consistency, wall, mode = sys.argv[1:]
ws = [json.load(open(f"{out}/worker{r}.json")) for r in range(int(workers))]
summary = {
    "test_accuracy": ws[0]["test_accuracy"],
    "epochs": int(epochs),
    "steps": ws[0]["steps"],
    "samples_per_sec": round(sum(w["samples_per_sec"] for w in ws), 1),
    "wall_seconds": int(wall),
    "checkpoints": json.load(open(f"{out}/coordinator/checkpoints.json"))
                   if os.path.exists(f"{out}/coordinator/checkpoints.json") else [],
    "rollbacks": [{"failed_step": f, "restored_step": t} for f, t in ws[0].get("rollbacks", [])],
    "param_crc32c": ws[0].get("param_crc32c", 0),
    "workers": int(workers),
    "shards": int(shards),
    "consistency": consistency,
    "mode": mode,
    "final_loss": ws[0]["final_loss"],
}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(f"== test accuracy {summary['test_accuracy']:.4f} after {epochs} epochs "
      f"({summary['samples_per_sec']:.0f} samples/s, {wall} s); summary: {out}/summary.json")
PY
