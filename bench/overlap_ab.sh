#!/usr/bin/env bash
# ALLREDUCE with the bucket all-reduces overlapped with the backward pass (a communication
# thread, --overlap_allreduce=true, the default) against on the training thread (false),
# interleaved, ROUNDS rounds: the MLP (3 epochs, 0.1 MiB buckets: 4 buckets) and the GPT
# (60 steps, 1 MiB buckets: 22 buckets). Prints samples/s per round, the median of the
# per-round ratios on/off, and each side's final loss and parameter CRC (equal: the sums
# do not depend on the thread).
#   bench/overlap_ab.sh [ROUNDS=5]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
out=$(mktemp -d /tmp/overlap_ab.XXXXXX)
echo "== per-run output in $out"
for ((r = 0; r < rounds; ++r)); do
  for ov in false true; do
    deploy/local_cluster.sh --mode allreduce --epochs 3 --metrics off --out $out/mlp-$ov-$r \
      --worker_args "--bucket_mb=0.1 --overlap_allreduce=$ov" >/dev/null 2>&1 \
      || { echo "overlap_ab.sh: see $out/mlp-$ov-$r" >&2; exit 1; }
    deploy/local_cluster.sh --model gpt --mode allreduce --epochs 1 --metrics off --out $out/gpt-$ov-$r \
      --worker_args "--bucket_mb=1 --max_steps=60 --overlap_allreduce=$ov" >/dev/null 2>&1 \
      || { echo "overlap_ab.sh: see $out/gpt-$ov-$r" >&2; exit 1; }
  done
done
/usr/bin/python3 - "$out" "$rounds" <<'PY'
import json,statistics,sys
out, rounds = sys.argv[1], int(sys.argv[2])
for m in ("mlp","gpt"):
    v={ov:[json.load(open(f"{out}/{m}-{ov}-{r}/summary.json")) for r in range(rounds)] for ov in ("false","true")}
    key="samples_per_sec"
    off=[x[key] for x in v["false"]]; on=[x[key] for x in v["true"]]
    ratios=[b/a for a,b in zip(off,on)]
    print(m, "off", [round(x) for x in off], "on", [round(x) for x in on],
          "on/off median", round(statistics.median(ratios), 3),
          "(final loss, CRC)", {ov: sorted(set((x["final_loss"], x["param_crc32c"]) for x in v[ov])) for ov in v})
PY
