#!/usr/bin/env bash
# PS mode with each step's push/pull on a communication thread while the next step computes
# (--overlap_push=true, the default under SSP(>=1) and ASP) against every step waiting for
# its own (false), interleaved, ROUNDS rounds: the MLP on Fashion-MNIST, 3 epochs, 2 shards,
# 1 and 2 workers, ssp:1 and asp; BSP (which never overlaps) and single-process PyTorch
# (bench/ddp_torch.py --world 1) in every round as the references. Prints the median
# samples/s, on/off, the ratio to single-process PyTorch, and the test accuracies.
#   bench/overlap_push.sh [ROUNDS=5]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
out=$(mktemp -d /tmp/overlap_push.XXXXXX)
echo "== per-run output in $out"
runs=()
for w in 1 2; do
  runs+=("bsp-$w-true")
  for c in ssp:1 asp; do for ov in false true; do runs+=("$c-$w-$ov"); done; done
done
for ((r = 0; r < rounds; ++r)); do
  OMP_NUM_THREADS=1 /usr/bin/python3 bench/ddp_torch.py --world 1 --epochs 3 | tail -n 1 >"$out/single$r.json"
  for run in "${runs[@]}"; do
    IFS=- read -r c w ov <<<"$run"
    deploy/local_cluster.sh --mode ps --consistency "$c" --workers "$w" --epochs 3 --metrics off \
      --out "$out/$run-$r" --worker_args "--overlap_push=$ov" >/dev/null 2>&1 \
      || { echo "overlap_push.sh: see $out/$run-$r" >&2; exit 1; }
  done
  echo "round $((r + 1))/$rounds done"
done
/usr/bin/python3 - "$out" "$rounds" "${runs[@]}" <<'PY'
import json, statistics, sys
out, rounds, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
one = statistics.median(json.load(open(f"{out}/single{r}.json"))["samples_per_sec"] for r in range(rounds))
med = {}
print(f"single-process PyTorch: {one:,.0f} samples/s (median of {rounds})")
print("| consistency | workers | overlap_push | samples/s (median) | on / off | / single-process torch | test accuracy |")
print("|---|---|---|---|---|---|---|")
for run in runs:
    c, w, ov = run.split("-")
    xs = [json.load(open(f"{out}/{run}-{r}/summary.json")) for r in range(rounds)]
    med[run] = statistics.median(x["samples_per_sec"] for x in xs)
    ratio = f"**{med[run] / med[f'{c}-{w}-false']:.2f}**" if ov == "true" and c != "bsp" else ""
    ov = "(never)" if c == "bsp" else ov
    acc = ", ".join(str(x["test_accuracy"]) for x in xs)
    print(f"| {c} | {w} | {ov} | {med[run]:,.0f} | {ratio} | {med[run] / one:.2f} | {acc} |")
PY
