#!/usr/bin/env bash
# Gloo all-reduce: ours (bench/allreduce_bench) against PyTorch's (bench/allreduce_torch.py),
# 2 processes, interleaved over ROUNDS rounds; prints busbw medians and the ratio per size.
#   bench/allreduce_compare.sh [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
bazel build -c opt //bench:allreduce_bench >/dev/null 2>&1
ours=$(bazel info -c opt bazel-bin 2>/dev/null)/bench/allreduce_bench
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for ((r = 0; r < rounds; ++r)); do
  "$ours" --ranks=2 --iters=20 --json="$tmp/ours$r.json" >/dev/null
  OMP_NUM_THREADS=1 /usr/bin/python3 bench/allreduce_torch.py --ranks 2 --iters 20 --json "$tmp/torch$r.json" >/dev/null
done
python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
load = lambda name: [json.load(open(f"{tmp}/{name}{r}.json")) for r in range(rounds)]
ours, torch = load("ours"), load("torch")
print("| bytes | ours algbw GB/s | ours busbw GB/s | torch busbw GB/s | **ours / torch** |")
print("|---|---|---|---|---|")
for i, row in enumerate(ours[0]):
    oa = statistics.median(o[i]["algbw"] for o in ours)
    ob = statistics.median(o[i]["busbw"] for o in ours)
    tb = statistics.median(t[i]["busbw"] for t in torch)
    print(f"| {row['bytes']} | {oa:.3f} | {ob:.3f} | {tb:.3f} | **{ob / tb:.2f}** |")
PY
