#!/usr/bin/env bash
# Training throughput of every mode against PyTorch DDP (gloo) on the same 2 processes:
# the same MLP (784-256-128-64-10), Adam, batch 64 per worker, Fashion-MNIST, 1 OpenBLAS
# thread per process. Each round runs DDP (bench/ddp_torch.py) and then each of our modes
# (deploy/local_cluster.sh: 2 workers, 2 shards, a coordinator); the rounds interleave so
# machine noise hits all alike. Prints the median samples/s (summed over the 2 workers,
# training time only) and the ratio to DDP's median, to single-process PyTorch's (the same
# script with --world 1: no DDP, one process, one thread) and to the 2x limit of 2 workers
# on this 2-core machine (2x single-process), plus each run's test accuracy.
#   [MODES="ps allreduce fsdp pipeline"] bench/modes_compare.sh [ROUNDS=3] [EPOCHS=3]
# A MODES entry may carry ps_worker flags after commas, as a run of its own:
#   MODES="fsdp fsdp,--fsdp_reshard_after_forward=false" bench/modes_compare.sh 5 3
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3} epochs=${2:-3}
read -r -a modes <<<"${MODES:-ps allreduce fsdp pipeline}"
tmp=$(mktemp -d /tmp/modes_compare.XXXXXX)
echo "runs under $tmp"
for ((r = 0; r < rounds; ++r)); do
  OMP_NUM_THREADS=1 /usr/bin/python3 bench/ddp_torch.py --world 2 --epochs "$epochs" \
    | tail -n 1 >"$tmp/ddp$r.json"
  OMP_NUM_THREADS=1 /usr/bin/python3 bench/ddp_torch.py --world 1 --epochs "$epochs" \
    | tail -n 1 >"$tmp/single$r.json"
  for i in "${!modes[@]}"; do
    IFS=, read -r -a words <<<"${modes[$i]}"
    deploy/local_cluster.sh --mode "${words[0]}" --epochs "$epochs" --out "$tmp/run$i.$r" \
      --worker_args "${words[*]:1}" >/dev/null 2>&1 \
      || { echo "modes_compare.sh: ${modes[$i]} round $r failed; see $tmp/run$i.$r" >&2; exit 1; }
  done
  echo "round $((r + 1))/$rounds done"
done
EPOCHS=$epochs /usr/bin/python3 - "$tmp" "$rounds" "${modes[@]}" <<'PY'
import json, os, statistics, sys
tmp, rounds, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
ddp = [json.load(open(f"{tmp}/ddp{r}.json")) for r in range(rounds)]
single = [json.load(open(f"{tmp}/single{r}.json")) for r in range(rounds)]
base = statistics.median(d["samples_per_sec"] for d in ddp)
one = statistics.median(d["samples_per_sec"] for d in single)
print("| run | samples/s (median) | runs | **/ DDP** | **/ single process** | / 2x limit | test accuracy |")
print("|---|---|---|---|---|---|---|")
print(f"| PyTorch single process | {one:,.0f} | {rounds} | {one / base:.2f} | 1.00 | 0.50 | "
      f"{', '.join(str(d['test_accuracy']) for d in single)} |")
print(f"| PyTorch DDP (gloo) | {base:,.0f} | {rounds} | 1.00 | {base / one:.2f} | "
      f"{base / one / 2:.2f} | {', '.join(str(d['test_accuracy']) for d in ddp)} |")
per_single = {}  # each run's median samples/s over single-process PyTorch's
for i, m in enumerate(modes):
    runs = [json.load(open(f"{tmp}/run{i}.{r}/summary.json")) for r in range(rounds)]
    m = m.replace(",", " ")
    med = statistics.median(x["samples_per_sec"] for x in runs)
    per_single[m] = med / one
    acc = ", ".join(str(x["test_accuracy"]) for x in runs)
    print(f"| {m} | {med:,.0f} | {rounds} | **{med / base:.2f}** | **{med / one:.2f}** | "
          f"{med / one / 2:.2f} | {acc} |")
sys.path.insert(0, "bench")
import figures
if not os.environ.get("MODES"):  # the default modes make the README's row
    figures.record(
        "modes_compare", order=10, what="MLP training, 2 workers on 2 cores",
        command=f"bench/modes_compare.sh {rounds} {os.environ['EPOCHS']}",
        figure=", ".join(f"{m.upper()} {v:.2f}x" for m, v in per_single.items())
        + " the samples/s of single-process PyTorch",
        beside=f"PyTorch DDP (Gloo) {base / one:.2f}x; 2 workers on 2 cores can at best "
               "double one process",
        measured=dict(single=one, ddp=base, per_single=per_single))
PY
