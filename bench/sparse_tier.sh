#!/usr/bin/env bash
# The disk tier of sparse tables against the same table all in RAM, in one run (issue 46):
# bench/sparse_tier.cc, and the figure recorded.
#
#   bench/sparse_tier.sh [ROWS=20000000] [ROUNDS=5]
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-20000000}
rounds=${2:-5}
dir=/var/tmp/pscluster_sparse_tier.$$
trap 'rm -rf "$dir"' EXIT
bazel build -c opt //bench:sparse_tier 2>&1 | tail -n 1
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/bench/sparse_tier
out=$("$bin" --rows="$rows" --rounds="$rounds" --dir="$dir" | grep '^{')
/usr/bin/python3 - "$rows" "$rounds" "$out" <<'PY'
import json, sys
sys.path.insert(0, "bench")
import figures
rows, rounds = int(sys.argv[1]), int(sys.argv[2])
runs = {r["cluster"]: r for r in map(json.loads, sys.argv[3].splitlines())}
ram, tier = runs["ram"], runs["disk_tier"]
for r in (ram, tier):
    print(f"{r['cluster']:>9}: fill {r['fill_rows_per_s'] / 1e6:.2f} M rows/s, train "
          f"{r['train_rows_per_s'] / 1e6:.3f} M rows/s, 4096-id pull p50 {r['pull_p50_ms']:.2f} ms "
          f"p99 {r['pull_p99_ms']:.2f} ms, RAM hit rate {r['ram_hit_rate']:.3f}, "
          f"{r['rows_on_disk'] / 1e6:.1f} M rows on disk ({r['disk_bytes'] / 2**30:.2f} GiB), "
          f"RAM rows {r['ram_row_bytes'] / 2**30:.2f} GiB")
figures.record(
    "sparse_tier", order=73, what=f"sparse table of {rows / 1e6:.0f} M rows x 16, Adagrad, "
    "a quarter of its rows in RAM, the rest on disk",
    command=f"bench/sparse_tier.sh {rows} {rounds}",
    figure=f"training {tier['train_rows_per_s'] / ram['train_rows_per_s']:.2f}x the all-RAM "
           f"table's rows/s; 4096-id pull p50 {tier['pull_p50_ms'] / ram['pull_p50_ms']:.2f}x, "
           f"p99 {tier['pull_p99_ms'] / ram['pull_p99_ms']:.2f}x; RAM hit rate "
           f"{tier['ram_hit_rate']:.2f}; RAM {tier['ram_row_bytes'] / ram['ram_row_bytes']:.2f}x",
    beside="the same table with every row in RAM, rounds interleaved",
    measured=dict(rounds=rounds, runs=[ram, tier]))
PY
