#!/usr/bin/env bash
# Incremental snapshots against full ones (issue 46): bytes and time of a snapshot holding
# the sparse rows changed since the one before, beside a full snapshot of the same state
# in the same run, with 1 % and 10 % of the rows touched (bench/incremental_snapshot.cc).
#
#   bench/incremental_snapshot.sh [ROWS=10000000] [ROUNDS=5] [DIR=/var/tmp]
#
# One shard, a sparse Adagrad table of dim 16 (144 bytes a row on disk), snapshots to DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-10000000} rounds=${2:-5} dir=${3:-/var/tmp}
bazel build -c opt //bench:incremental_snapshot 2>&1 | tail -n 1
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/bench/incremental_snapshot
out=$("$bin" "$rows" "$rounds" "$dir" 2> >(grep -v ' I ' >&2) | grep "^{")  # its log lines go to stdout too
/usr/bin/python3 - "$rows" "$rounds" "$out" <<'PY'
import json, sys
sys.path.insert(0, "bench")
import figures
rows, rounds, r = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
for pct in ("1pct", "10pct"):
    print(f"{pct}: {r[pct + '_bytes'] / 1e6:.1f} MB in {r[pct + '_seconds']:.3f} s = "
          f"{r[pct + '_bytes_ratio']:.3f}x the bytes, {r[pct + '_seconds_ratio']:.3f}x the time "
          f"of a full snapshot ({r['full_bytes'] / 1e6:.0f} MB in {r['full_seconds']:.2f} s)")
figures.record(
    "incremental_snapshot", order=75, what="incremental snapshots of a sparse table",
    command=f"bench/incremental_snapshot.sh {rows} {rounds}",
    figure=f"1 % of {rows / 1e6:g} M rows touched: {r['1pct_bytes_ratio']:.3f}x the bytes and "
           f"{r['1pct_seconds_ratio']:.2f}x the time of a full snapshot; 10 %: "
           f"{r['10pct_bytes_ratio']:.3f}x and {r['10pct_seconds_ratio']:.2f}x",
    beside=f"a full snapshot of the same state in the same run: {r['full_bytes'] / 1e6:.0f} MB "
           f"in {r['full_seconds']:.2f} s",
    measured=r)
PY
