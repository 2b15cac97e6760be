#!/usr/bin/env bash
# Training throughput of the local cluster (PS mode, BSP, Adam, batch 64 per worker) for
# 1, 2 and 4 workers against 1 and 2 shards: examples/s summed over workers (training
# steps only, evaluation excluded), median of ROUNDS interleaved rounds, and the scaling
# against 1 worker on the same shards.
#
#   bench/train_throughput.sh [ROUNDS=3] [EPOCHS=1]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3} epochs=${2:-1}
tmp=$(mktemp -d /tmp/pscluster_train_bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
configs=("1 1" "2 1" "4 1" "1 2" "2 2" "4 2")
for ((r = 0; r < rounds; ++r)); do
  for c in "${configs[@]}"; do
    read -r workers shards <<<"$c"
    deploy/local_cluster.sh --workers "$workers" --shards "$shards" --epochs "$epochs" \
      --out "$tmp/w${workers}s${shards}r$r" >/dev/null 2>&1 \
      || { echo "run workers=$workers shards=$shards failed; see $tmp" >&2; trap - EXIT; exit 1; }
  done
done
python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
med = {}
for w in (1, 2, 4):
    for s in (1, 2):
        xs = [json.load(open(f"{tmp}/w{w}s{s}r{r}/summary.json"))["samples_per_sec"] for r in range(rounds)]
        med[w, s] = statistics.median(xs)
print("| workers | shards | samples/s (median of %d) | vs 1 worker |" % rounds)
print("|---|---|---|---|")
for s in (1, 2):
    for w in (1, 2, 4):
        print(f"| {w} | {s} | {med[w, s]:.0f} | {med[w, s] / med[1, s]:.2f}x |")
PY
