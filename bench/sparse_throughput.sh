#!/usr/bin/env bash
# Sparse pulls and pushes against raw gRPC moving the same bytes (issue 46), 1 and 2
# shards, 1k to 1M ids a call (bench/sparse_throughput.cc), and the figure recorded.
#
#   bench/sparse_throughput.sh [REPS=5]
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-5}
bazel build -c opt //bench:sparse_throughput 2>&1 | tail -n 1
bin=$(bazel info -c opt bazel-bin 2>/dev/null)/bench/sparse_throughput
out=$("$bin" --reps="$reps" | grep '^{')  # its log lines go to stdout too
/usr/bin/python3 - "$reps" "$out" <<'PY'
import json, sys
sys.path.insert(0, "bench")
import figures
reps = int(sys.argv[1])
runs = [json.loads(l) for l in sys.argv[2].splitlines()]
for r in runs:
    print(f"{r['shards']} shard(s), {r['ids']:>7} ids: push {r['push_rows_per_s'] / 1e6:.2f} M rows/s "
          f"({r['push_to_raw_grpc']:.2f}x raw gRPC), pull {r['pull_rows_per_s'] / 1e6:.2f} M rows/s "
          f"({r['pull_to_raw_grpc']:.2f}x); of loopback TCP: push {r['push_to_tcp']:.2f}x, "
          f"pull {r['pull_to_tcp']:.2f}x")
big = [r for r in runs if r["ids"] >= 65536]
span = lambda key: f"{min(r[key] for r in big):.2f}-{max(r[key] for r in big):.2f}x"
figures.record(
    "sparse_throughput", order=72, what="sparse pull and push, 1 and 2 shards, dim 16",
    command=f"bench/sparse_throughput.sh {reps}",
    figure=f"at 64k-1M ids a call: pull {span('pull_to_raw_grpc')}, push {span('push_to_raw_grpc')} "
           f"of raw gRPC moving the same bytes (the issue asks 0.7x); of loopback TCP: pull "
           f"{span('pull_to_tcp')}, push {span('push_to_tcp')}",
    beside="raw gRPC streams of the same bytes in 4 MiB messages to as many servers, and "
           "the same bytes over plain loopback TCP sockets (the physical ceiling), interleaved",
    measured=dict(reps=reps, runs=runs))
PY
