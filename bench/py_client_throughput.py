#!/usr/bin/python3
"""Dense push and pull goodput of the Python client (python/pscluster) against external
ps_server shards: the Python side of bench/python_vs_cpp_client.sh, the twin of
bench/client_throughput.cc (same sizes, warm-ups, repetitions and JSON).

    PYTHONPATH=python:bazel-bin/python /usr/bin/python3 bench/py_client_throughput.py \\
        --shards=127.0.0.1:5000,127.0.0.1:5001 --sizes_kib=64,1024,16384,65536 --reps=7 \\
        --json=/tmp/py.json

For each size: an ASP dense table with SGD (learning rate 1e-6, zeros; table id
--table_id_base + the size's index, 2000 by default so as not to meet the C++ program's
1000...), 2 warm-ups, then --reps timed push_dense and pull_dense (into a preallocated
`out=`) of the whole tensor, alternating. Goodput = tensor bytes / wall time of one call;
the median of the timed calls is reported, and the median client CPU time (user + system,
all threads) of one call.
"""
import argparse
import importlib
import json
import resource
import sys
import time

import numpy as np


def _cpu() -> float:
    """CPU seconds (user + system, every thread) this process has used."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _median(v):
    return sorted(v)[len(v) // 2]  # as the C++ program: the upper median for an even count


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", required=True, help="HOST:PORT,... by shard id")
    p.add_argument("--sizes_kib", default="64,1024,16384,65536")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--table_id_base", type=int, default=2000)
    p.add_argument("--json", default="")
    p.add_argument("--client", default="py", help="label written to the JSON")
    p.add_argument("--cluster_class", default="pscluster:Cluster",
                   help="MODULE:CLASS with Cluster's from_shards/create_dense/push_dense/"
                        "pull_dense (to measure a variant of the client the same way)")
    args = p.parse_args()
    addresses = [a for a in args.shards.split(",") if a]
    reps = max(1, args.reps)
    results = []
    module, _, name = args.cluster_class.partition(":")
    cluster_class = getattr(importlib.import_module(module), name)
    with cluster_class.from_shards(addresses, timeout=60.0) as cluster:
        native = bool(getattr(cluster, "native", False))
        print(f"dense data path: {'C++ PsClient (pscluster._native)' if native else 'grpc-python'}",
              file=sys.stderr)
        print(f"{'shards':<7} {'tensor':<10} {'push GB/s':>10} {'pull GB/s':>10} "
              f"{'push cpu ms':>12} {'pull cpu ms':>12}")
        for k, kib in enumerate(int(s) for s in args.sizes_kib.split(",")):
            nbytes = kib << 10
            size = nbytes // 4
            table = cluster.create_dense(args.table_id_base + k, size, optimizer="sgd",
                                         learning_rate=1e-6, consistency="asp")
            grad = np.full(size, 0.5, dtype=np.float32)
            out = np.empty(size, dtype=np.float32)
            push, pull, push_cpu, pull_cpu = [], [], [], []
            for i in range(reps + 2):
                c0, t0 = _cpu(), time.perf_counter()
                cluster.push_dense(table, grad, step=i)
                c1, t1 = _cpu(), time.perf_counter()
                cluster.pull_dense(table, step=i, out=out)
                c2, t2 = _cpu(), time.perf_counter()
                if i >= 2:  # 2 warm-ups
                    push.append(t1 - t0)
                    pull.append(t2 - t1)
                    push_cpu.append(c1 - c0)
                    pull_cpu.append(c2 - c1)
            if not (out[0] < 0 and np.all(out == out[0])):
                print(f"pulled values disagree: {out.min()} .. {out.max()}", file=sys.stderr)
                return 1
            r = {"client": args.client, "native": native, "shards": len(addresses), "bytes": nbytes,
                 "reps": reps, "push_gbps": nbytes / _median(push) / 1e9,
                 "pull_gbps": nbytes / _median(pull) / 1e9,
                 "push_cpu_ms": 1e3 * _median(push_cpu), "pull_cpu_ms": 1e3 * _median(pull_cpu)}
            print(f"{len(addresses):<7} {kib:6d} KiB {r['push_gbps']:10.3f} "
                  f"{r['pull_gbps']:10.3f} {r['push_cpu_ms']:12.2f} {r['pull_cpu_ms']:12.2f}",
                  flush=True)
            results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            f.write("[\n" + ",\n".join("  " + json.dumps(r) for r in results) + "\n]\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
