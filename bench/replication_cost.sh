#!/usr/bin/env bash
# What chain replication costs: R = 1, 2, 3 copies of each shard, interleaved in one sitting.
#  1. Push and pull goodput of the C++ PsClient (bench/client_throughput) against 2 shards
#     whose chains have R replicas (a coordinator with --replicas=R, no workers): a push is
#     acknowledged once every replica holds it, a pull is served by the head alone.
#  2. Training in PS mode (deploy/local_cluster.sh --replicas R: 2 workers, 2 shards, BSP).
# Prints medians over the rounds and the ratio of each R to R = 1.
#   bench/replication_cost.sh [ROUNDS=5] [EPOCHS=1] [BIN_A BIN_B]
# With two folders of binaries in bazel-bin's layout (deploy/local_cluster.sh --bin; each
# with bench/client_throughput too): R = 2 only, build A and build B alternating in each
# round, and B / A per figure (a change's "nothing slower").
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5} epochs=${2:-1}
tmp=$(mktemp -d /tmp/replication_cost.XXXXXX)
echo "runs under $tmp"
if (($# >= 4)); then
  builds=("$(cd "$3" && pwd)" "$(cd "$4" && pwd)") names=(A B) counts=(2)
else
  bazel build -c opt //bench:client_throughput //server/ps:ps_server \
    //server/coordinator:ps_coordinator //worker:ps_worker //tools/psctl:psctl >/dev/null 2>&1
  builds=("$(bazel info -c opt bazel-bin 2>/dev/null)") names=(-) counts=(1 2 3)
fi
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
await() {  # log needle: prints the line once it appears (bounded)
  for ((t = 0; t < 300; ++t)); do
    grep -m1 -F "$2" "$1" 2>/dev/null && return
    sleep 0.1
  done
  echo "replication_cost.sh: '$2' did not appear in $1" >&2; exit 1
}
goodput() {  # bin replicas out.json
  local bin=$1 r=$2 dir=$tmp/goodput-${3##*/goodput-} heads=()
  dir=${dir%.json}
  mkdir -p "$dir"
  "$bin/server/coordinator/ps_coordinator" --port=0 --num_shards=2 --num_workers=0 --replicas="$r" \
    >"$dir/coordinator.log" 2>&1 &
  pids=($!)
  local c; c=$(await "$dir/coordinator.log" "listening on" | sed 's/.*listening on \([^ ]*\).*/\1/')
  for s in 0 1; do
    for ((k = 0; k < r; ++k)); do
      "$bin/server/ps/ps_server" --port=0 --shard_id=$s --num_shards=2 --replica=$k \
        --coordinator="$c" >"$dir/shard$s-$k.log" 2>&1 &
      pids+=($!)
    done
    # The chain's head is its lowest replica (every replica registers before any call).
    heads+=("$(await "$dir/shard$s-0.log" "listening on" | sed 's/.*listening on \([^ ]*\).*/\1/')")
  done
  # Every head knows its whole chain (R > 1: the chain's epoch R, once every replica joined).
  for s in 0 1; do
    if ((r > 1)); then await "$dir/shard$s-0.log" "chain epoch $r:" >/dev/null
    else await "$dir/shard$s-0.log" "registered with" >/dev/null; fi
  done
  "$bin/bench/client_throughput" --shards="$(IFS=,; echo "${heads[*]}")" --sizes_kib=64,1024,16384 \
    --reps=7 --json="$3" >"$dir/client.log" 2>&1 \
    || { echo "replication_cost.sh: client_throughput failed; see $dir/client.log" >&2; exit 1; }
  cleanup
  pids=()
}
for ((round = 0; round < rounds; ++round)); do
  order=("${!builds[@]}")
  ((round % 2 && ${#builds[@]} > 1)) && order=(1 0)  # which build goes first alternates
  for i in "${order[@]}"; do
    for r in "${counts[@]}"; do
      run=${names[i]/-/}$r-$round
      goodput "${builds[i]}" "$r" "$tmp/goodput-$run.json"
      deploy/local_cluster.sh --epochs "$epochs" --replicas "$r" --metrics off --bin "${builds[i]}" \
        --out "$tmp/train-$run" >"$tmp/train-$run.log" 2>&1 \
        || { echo "replication_cost.sh: training with --replicas $r failed; see $tmp/train-$run.log" >&2; exit 1; }
    done
  done
  echo "round $((round + 1))/$rounds done"
done
if ((${#builds[@]} > 1)); then
  /usr/bin/python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
med = statistics.median
load = lambda b, i: json.load(open(f"{tmp}/goodput-{b}2-{i}.json"))
good = {b: [load(b, i) for i in range(rounds)] for b in "AB"}
print(f"R = 2, build B / build A (medians of {rounds} rounds' ratios; per round beside)")
for k, row in enumerate(good["A"][0]):
    for d in ("push", "pull"):
        a, b = ([x[k][f"{d}_gbps"] for x in good[n]] for n in "AB")
        r = [y / x for x, y in zip(a, b)]
        print(f"{row['bytes'] // 1024:>6} KiB {d}: A {med(a):.3f} B {med(b):.3f} GB/s, B/A "
              f"{med(r):.2f} ({' '.join(f'{v:.2f}' for v in r)})")
sps = {n: [json.load(open(f"{tmp}/train-{n}2-{i}/summary.json")) for i in range(rounds)] for n in "AB"}
a, b = ([s["samples_per_sec"] for s in sps[n]] for n in "AB")
r = [y / x for x, y in zip(a, b)]
print(f"training: A {med(a):.0f} B {med(b):.0f} samples/s, B/A {med(r):.2f} "
      f"({' '.join(f'{v:.2f}' for v in r)}); test accuracy A "
      f"{sorted({s.get('test_accuracy') for s in sps['A']})} B {sorted({s.get('test_accuracy') for s in sps['B']})}")
PY
  exit 0
fi
/usr/bin/python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
med = statistics.median
good = {r: [json.load(open(f"{tmp}/goodput-{r}-{i}.json")) for i in range(rounds)] for r in (1, 2, 3)}
sizes = [row["bytes"] for row in good[1][0]]  # client_throughput's JSON: one row per size
rows = good.get
print(f"push / pull goodput, GB/s (median of {rounds} rounds; each round the median of 7 calls)")
print(f"{'size':>8} | " + " | ".join(f"R={r} push  pull" for r in (1, 2, 3)) + " | push R=2/R=1  R=3/R=1")
for k, b in enumerate(sizes):
    p = {r: med(x[k]["push_gbps"] for x in rows(r)) for r in (1, 2, 3)}
    q = {r: med(x[k]["pull_gbps"] for x in rows(r)) for r in (1, 2, 3)}
    print(f"{b // 1024:>6}KiB | " + " | ".join(f"{p[r]:9.2f} {q[r]:5.2f}" for r in (1, 2, 3))
          + f" | {p[2] / p[1]:12.2f} {p[3] / p[1]:7.2f}")
sps = {r: [json.load(open(f"{tmp}/train-{r}-{i}/summary.json"))["samples_per_sec"] for i in range(rounds)]
       for r in (1, 2, 3)}
print(f"training samples/s (2 workers, 2 shards, BSP; median of {rounds} rounds):")
for r in (1, 2, 3):
    print(f"  R={r}: {med(sps[r]):8.0f}  ({med(sps[r]) / med(sps[1]):.2f}x R=1)  rounds: "
          + " ".join(f"{v:.0f}" for v in sps[r]))
PY
