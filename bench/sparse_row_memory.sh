#!/usr/bin/env bash
# What a stored sparse row costs in a shard's memory (issue 46), beside its raw bytes (the
# ceiling: its floats, key and update count) and beside the map of std::vector rows the
# shards kept before RowStore (the baseline, rebuilt in the same process).
#
#   bench/sparse_row_memory.sh [ROWS=1000000] [ROUNDS=5]
#
# Two row widths: 32 floats (dim 16 with Adagrad's one slot, or dim 32 with SGD) and 192
# (dim 64 with Adam's two slots). Each is bench/sparse_row_memory's medians over ROUNDS
# interleaved rounds of resident-memory growth.
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-1000000} rounds=${2:-5}
bazel build -c opt //bench:sparse_row_memory 2>&1 | tail -n 1
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/bench/sparse_row_memory
narrow=$("$bin" "$rows" 32 "$rounds")
wide=$("$bin" "$rows" 192 "$rounds")
/usr/bin/python3 - "$rows" "$rounds" "$narrow" "$wide" <<'PY'
import json, sys
sys.path.insert(0, "bench")
import figures
rows, rounds = int(sys.argv[1]), int(sys.argv[2])
runs = [json.loads(a) for a in sys.argv[3:]]
for r in runs:
    print(f"width {r['width']:3d}: raw {r['raw_bytes']:.0f} B; RowStore {r['row_store_bytes']:.1f} B "
          f"({r['row_store_bytes'] / r['raw_bytes']:.2f}x raw); map of vectors {r['map_bytes']:.1f} B "
          f"({r['map_bytes'] / r['raw_bytes']:.2f}x raw)")
n, w = runs
figures.record(
    "sparse_row_memory", order=70, what="the memory a stored sparse row takes",
    command=f"bench/sparse_row_memory.sh {rows} {rounds}",
    figure=f"{n['row_store_bytes'] / n['raw_bytes']:.2f}x the raw row at 32 floats, "
           f"{w['row_store_bytes'] / w['raw_bytes']:.2f}x at 192",
    beside=f"the raw row (ceiling: floats, key, count); the map of vectors it replaced: "
           f"{n['map_bytes'] / n['raw_bytes']:.2f}x and {w['map_bytes'] / w['raw_bytes']:.2f}x",
    measured=dict(rows=rows, rounds=rounds, runs=runs))
PY
