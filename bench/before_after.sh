#!/usr/bin/env bash
# A refactoring's cost, measured: training throughput per mode (deploy/local_cluster.sh,
# 2 workers, 2 shards, the MLP) and PS push/pull goodput (bench/ps_throughput) of a BASE
# checkout against this one, in one sitting, interleaved (base, new, base, new, ...) so
# machine noise hits both alike. Prints medians and new/base ratios.
#   bench/before_after.sh BASE_DIR [ROUNDS=3] [EPOCHS=3]
# BASE_DIR: another checkout, e.g. `git worktree add --detach /tmp/base <commit>`.
set -euo pipefail
cd "$(dirname "$0")/.."
base=$(cd "${1:?usage: bench/before_after.sh BASE_DIR [ROUNDS] [EPOCHS]}" && pwd)
new=$(pwd)
rounds=${2:-3} epochs=${3:-3}
modes=(ps allreduce fsdp pipeline)
tmp=$(mktemp -d /tmp/before_after.XXXXXX)
echo "runs under $tmp"
# Each side's binaries are copied out once built, so editing either tree during the
# sitting changes nothing in it (deploy/local_cluster.sh --bin runs them without a build).
binaries=(bench/ps_throughput server/ps/ps_server server/coordinator/ps_coordinator
  worker/ps_worker tools/psctl/psctl)
for side in base new; do
  tree=$base; [[ $side == new ]] && tree=$new
  targets=()
  for b in "${binaries[@]}"; do targets+=("//${b%/*}:${b##*/}"); done
  (cd "$tree" && bazel build -c opt "${targets[@]}" 2>&1 | tail -n 1)
  built=$(cd "$tree" && bazel info -c opt bazel-bin 2>/dev/null)
  for b in "${binaries[@]}"; do
    mkdir -p "$tmp/$side-bin/${b%/*}" && cp "$built/$b" "$tmp/$side-bin/$b"
  done
done
for ((r = 0; r < rounds; ++r)); do
  for m in "${modes[@]}"; do
    for side in base new; do
      tree=$base; [[ $side == new ]] && tree=$new
      (cd "$tree" && deploy/local_cluster.sh --bin "$tmp/$side-bin" --mode "$m" \
        --epochs "$epochs" --out "$tmp/$side-$m$r" >/dev/null 2>&1) \
        || { echo "before_after.sh: $side $m round $r failed; see $tmp/$side-$m$r" >&2; exit 1; }
    done
  done
  for side in base new; do
    # ps_server's malloc settings (common/malloc_mode.h), which a base from before
    # 2026-12-04 did not apply in the bench's process: without them its messages landed in
    # fresh pages, which the daemons never do (bench/history/RESULTS-to-2026-12-05.md, 2026-12-04 evening).
    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=16777216:glibc.malloc.arena_max=4 \
      "$tmp/$side-bin/bench/ps_throughput" --reps=5 --rounds=1 --json="$tmp/$side-ps$r.json" >/dev/null
  done
  echo "round $((r + 1))/$rounds done"
done
python3 - "$tmp" "$rounds" "${modes[@]}" <<'PY'
import json, statistics, sys
tmp, rounds, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = statistics.median
print("| training (samples/s, median) | base | new | new / base |")
print("|---|---|---|---|")
for m in modes:
    b = med(json.load(open(f"{tmp}/base-{m}{r}/summary.json"))["samples_per_sec"] for r in range(rounds))
    n = med(json.load(open(f"{tmp}/new-{m}{r}/summary.json"))["samples_per_sec"] for r in range(rounds))
    print(f"| {m} | {b:,.0f} | {n:,.0f} | **{n / b:.2f}** |")
print()
print("| ps_throughput (GB/s, median) | base | new | new / base |")
print("|---|---|---|---|")
runs = {s: [json.load(open(f"{tmp}/{s}-ps{r}.json")) for r in range(rounds)] for s in ("base", "new")}
for i, row in enumerate(runs["base"][0]):
    for k in ("push_gbps", "pull_gbps"):
        b = med(run[i][k] for run in runs["base"])
        n = med(run[i][k] for run in runs["new"])
        print(f"| {row['shards']} shard(s), {row['bytes'] >> 10} KiB, {k[:4]} | {b:.3f} | {n:.3f} | **{n / b:.2f}** |")
if "iperf3_gbps" in runs["new"][0][0]:
    # The ceilings, measured by the runs of whichever sides measure them (a base from before
    # 2026-12-03 does not); each side's goodput over the median ceiling.
    print()
    print("| ps_throughput ceilings (GB/s, median of the runs measuring them) | iperf3 | raw TCP | raw gRPC | base / iperf3 | new / iperf3 | new / raw TCP |")
    print("|---|---|---|---|---|---|---|")
    for i, row in enumerate(runs["new"][0]):
        for d in ("push", "pull"):
            both = [run for run in runs["base"] + runs["new"] if "iperf3_gbps" in run[i]]
            ceil = lambda k: med(run[i][k] for run in both)
            side = lambda s: med(run[i][f"{d}_gbps"] for run in runs[s])
            print(f"| {row['shards']} shard(s), {row['bytes'] >> 10} KiB, {d} | {ceil('iperf3_gbps'):.3f} "
                  f"| {ceil(f'tcp_{d}_gbps'):.3f} | {ceil(f'raw_{d}_gbps'):.3f} "
                  f"| {side('base') / ceil('iperf3_gbps'):.2f} | **{side('new') / ceil('iperf3_gbps'):.2f}** "
                  f"| {side('new') / ceil(f'tcp_{d}_gbps'):.2f} |")
PY
