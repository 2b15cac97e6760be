#!/usr/bin/env bash
# How fast PS-mode training could be on this machine, from physical rates measured in the
# same sitting, beside what it is and what single-process PyTorch does (issue 12's target:
# PS >= 1.5x single process); ALLREDUCE on the same terms, for scale.
#
#   bench/ps_ceiling.sh [ROUNDS=5] [EPOCHS=3]
#
# A mode's ceiling counts only the CPU work its step cannot avoid, for 2 workers with batch
# 64 and the MLP (784-256-128-64-10, N = 242,762 parameters) on 2 cores:
#   - each worker's forward + backward (bench/step_breakdown: OpenBLAS, 1 thread);
#   - Adam over the N parameters (the same bench: the shards' code): once in PS mode (the
#     shards), once on each worker in ALLREDUCE;
#   - every byte through loopback TCP, at the CPU seconds a byte costs iperf3 (one stream,
#     sender's and receiver's CPU together, from its own accounting): in PS mode each worker
#     pushes 4N bytes and pulls 4N; in ALLREDUCE's ring of 2 each worker sends 4N and
#     receives 4N, half as many bytes through the kernel in all.
# Not counted: loading batches, summing gradients, copies in and out of the model, any
# framing, RPC or collective's work. Ceiling = 2 cores / that CPU time a step x 128 samples,
# as if every part ran back to back with the cores never idle. Each round also runs
# single-process PyTorch (bench/ddp_torch.py --world 1) and both modes
# (deploy/local_cluster.sh: 2 workers, 2 shards); medians over the rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5} epochs=${2:-3}
bazel build -c opt //bench:step_breakdown //server/ps:ps_server //server/coordinator:ps_coordinator \
  //worker:ps_worker //tools/psctl:psctl 2>&1 | tail -n 1
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
tmp=$(mktemp -d /tmp/ps_ceiling.XXXXXX)
echo "runs under $tmp"
for ((r = 0; r < rounds; ++r)); do
  bench/iperf3_loopback.sh "$tmp/iperf$r.json" 3
  "$bin/bench/step_breakdown" --steps=1000 >"$tmp/breakdown$r.txt"
  OMP_NUM_THREADS=1 /usr/bin/python3 bench/ddp_torch.py --world 1 --epochs "$epochs" \
    | tail -n 1 >"$tmp/single$r.json"
  for mode in ps allreduce; do
    deploy/local_cluster.sh --mode "$mode" --epochs "$epochs" --out "$tmp/$mode$r" >/dev/null 2>&1 \
      || { echo "ps_ceiling.sh: the $mode run of round $r failed; see $tmp/$mode$r" >&2; exit 1; }
  done
  echo "round $((r + 1))/$rounds done"
done
/usr/bin/python3 - "$tmp" "$rounds" "$epochs" <<'PY'
import json, re, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
med = statistics.median
N, WORKERS, BATCH, CORES = 242762, 2, 64, 2
# Per mode: Adam passes over N and bytes through loopback, a step (see the header).
MODES = {"ps": (1, WORKERS * 2 * 4 * N), "allreduce": (WORKERS, WORKERS * 4 * N)}
rounds_ = []
for r in range(rounds):
    end = json.load(open(f"{tmp}/iperf{r}.json"))["end"]
    gbps = end["sum_received"]["bits_per_second"] / 8e9
    cpu = end["cpu_utilization_percent"]
    cores = (cpu["host_total"] + cpu["remote_total"]) / 100  # sender's + receiver's
    text = open(f"{tmp}/breakdown{r}.txt").read()
    fb = float(re.search(r"forward \+ backward\s+([0-9.]+) ms", text).group(1)) / 1e3
    adam = float(re.search(r"adam over every parameter\s+([0-9.]+) ms", text).group(1)) / 1e3
    row = dict(gbps=gbps, cores=cores, fb=fb * 1e3, adam=adam * 1e3,
               single=json.load(open(f"{tmp}/single{r}.json"))["samples_per_sec"])
    for mode, (adams, moved) in MODES.items():
        wire = moved / 1e9 / gbps * cores  # CPU seconds
        row[mode + "_wire"] = wire * 1e3
        row[mode + "_ceiling"] = WORKERS * BATCH / ((WORKERS * fb + adams * adam + wire) / CORES)
        row[mode] = json.load(open(f"{tmp}/{mode}{r}/summary.json"))["samples_per_sec"]
    rounds_.append(row)
m = {k: med(row[k] for row in rounds_) for k in rounds_[0]}
ratio = lambda a, b: med(row[a] / row[b] for row in rounds_)
print(f"iperf3 loopback: {m['gbps']:.2f} GB/s using {m['cores']:.2f} cores "
      f"({m['cores'] / m['gbps']:.2f} CPU s a GB); forward + backward {m['fb']:.3f} ms, "
      f"Adam {m['adam']:.3f} ms; loopback bytes of a step: PS {MODES['ps'][1] / 1e6:.2f} MB "
      f"({m['ps_wire']:.3f} ms), ALLREDUCE {MODES['allreduce'][1] / 1e6:.2f} MB "
      f"({m['allreduce_wire']:.3f} ms)")
print()
print(f"| samples/s (median of {rounds}) | measured | ceiling | **measured / single** | "
      "ceiling / single | **measured / ceiling** |")
print("|---|---|---|---|---|---|")
print(f"| single-process PyTorch | {m['single']:,.0f} | | 1.00 | | |")
for mode in MODES:
    print(f"| {mode} | {m[mode]:,.0f} | {m[mode + '_ceiling']:,.0f} | "
          f"**{ratio(mode, 'single'):.2f}** | {ratio(mode + '_ceiling', 'single'):.2f} | "
          f"**{ratio(mode, mode + '_ceiling'):.2f}** |")
print(f"| issue 12's PS target | {1.5 * m['single']:,.0f} | | 1.50 | | "
      f"{med(1.5 * row['single'] / row['ps_ceiling'] for row in rounds_):.2f} |")
print()
for mode in MODES:
    print(f"per round, {mode}: ceiling / single",
          ", ".join(f"{row[mode + '_ceiling'] / row['single']:.2f}" for row in rounds_),
          "| measured / ceiling", ", ".join(f"{row[mode] / row[mode + '_ceiling']:.2f}" for row in rounds_))
sys.path.insert(0, "bench")
import figures
figures.record(
    "ps_ceiling", order=20, what="PS mode against what the machine allows",
    command=f"bench/ps_ceiling.sh {rounds} {sys.argv[3]}",
    figure=f"PS {ratio('ps', 'ps_ceiling'):.2f}x its ceiling; ALLREDUCE "
           f"{ratio('allreduce', 'allreduce_ceiling'):.2f}x its own",
    beside="the ceiling: both workers' compute, Adam, and every byte through loopback TCP at "
           f"iperf3's CPU cost: {ratio('ps_ceiling', 'single'):.2f}x single-process PyTorch for "
           f"PS, {ratio('allreduce_ceiling', 'single'):.2f}x for ALLREDUCE",
    measured=dict(medians=m, rounds=rounds_))
PY
