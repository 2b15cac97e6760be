#!/usr/bin/env bash
# The shards' memory and the load test's throughput under bench/load's clients, a BASE
# checkout against this one, in one sitting, interleaved (base, new, base, new, ...).
# Prints each side's median peak RSS per shard (VmHWM), ops/s and the new/base ratios; a
# run whose exact check fails stops the sitting.
#   bench/load_before_after.sh BASE_DIR [ROUNDS=5] [SECONDS=30] [CLIENTS=256]
# BASE_DIR: another checkout, e.g. `git worktree add --detach /tmp/base <commit>`.
set -euo pipefail
cd "$(dirname "$0")/.."
base=$(cd "${1:?usage: bench/load_before_after.sh BASE_DIR [ROUNDS] [SECONDS] [CLIENTS]}" && pwd)
new=$(pwd)
rounds=${2:-5} seconds=${3:-30} clients=${4:-256}
tmp=$(mktemp -d /tmp/load_before_after.XXXXXX)
echo "runs under $tmp"
for tree in "$base" "$new"; do
  (cd "$tree" && bazel build -c opt //bench:load //server/ps:ps_server 2>&1 | tail -n 1)
done
for ((r = 0; r < rounds; ++r)); do
  for side in base new; do
    tree=$base; [[ $side == new ]] && tree=$new
    bin=$(cd "$tree" && bazel info -c opt bazel-bin 2>/dev/null)
    "$bin/bench/load" --server="$bin/server/ps/ps_server" --clients="$clients" \
      --seconds="$seconds" >"$tmp/$side-$r.txt" 2>&1 \
      || { echo "load_before_after.sh: $side round $r failed; see $tmp/$side-$r.txt" >&2; exit 1; }
    grep -q "exact check: PASSED" "$tmp/$side-$r.txt" \
      || { echo "load_before_after.sh: $side round $r: the exact check failed; see $tmp/$side-$r.txt" >&2; exit 1; }
  done
  echo "round $((r + 1))/$rounds done"
done
python3 - "$tmp" "$rounds" "$clients" <<'PY'
import re, statistics, sys
tmp, rounds, clients = sys.argv[1], int(sys.argv[2]), sys.argv[3]
med = statistics.median
def figures(side):
    rss, ops = {0: [], 1: []}, []
    for r in range(rounds):
        text = open(f"{tmp}/{side}-{r}.txt").read()
        for s, mib in re.findall(r"shard (\d): peak RSS ([\d.]+) MiB", text):
            rss[int(s)].append(float(mib))
        ops.append(float(re.search(r"throughput: ([\d.]+) ops/s", text).group(1)))
    return rss, ops
(brss, bops), (nrss, nops) = figures("base"), figures("new")
print(f"| bench/load, {clients} clients (median of {rounds}) | base | new | new / base |")
print("|---|---|---|---|")
for s in (0, 1):
    b, n = med(brss[s]), med(nrss[s])
    print(f"| shard {s} peak RSS (MiB) | {b:.1f} | {n:.1f} | **{n / b:.2f}** |")
print(f"| ops/s | {med(bops):,.0f} | {med(nops):,.0f} | **{med(nops) / med(bops):.2f}** |")
PY
