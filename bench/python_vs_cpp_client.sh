#!/usr/bin/env bash
# Dense push/pull goodput of the Python client (python/pscluster, through
# bench/py_client_throughput.py) against the C++ PsClient's (bench/client_throughput.cc):
# the same external ps_server shards on loopback (1, then 2 of them, no coordinator), the
# same tensor sizes, the two programs run alternately for ROUNDS rounds (the one going first
# alternates too). Goodput = tensor bytes / wall time of one whole-tensor push_dense or
# pull_dense (median of REPS calls after 2 warm-ups). Prints a markdown table of the medians
# over rounds; py/C++ is the median of the per-round ratios.
#
#   bench/python_vs_cpp_client.sh                      # builds -c opt, uses bazel-bin
#   BIN=/tmp/bin ROUNDS=5 bench/python_vs_cpp_client.sh
#
# BIN: a folder with ps_server, client_throughput and python/pscluster/proto/*_pb2*.py (and
# python/pscluster/_native.so for the C++ data path; default: build //server/ps:ps_server
# //bench:client_throughput //python:pscluster with -c opt and use bazel-bin). Also: ROUNDS (5), REPS (9), SIZES_KIB (64,1024,16384,65536), SHARDS ("1 2"),
# PYTHON (/usr/bin/python3: Debian's, with numpy and grpcio), PY_CLUSTER_CLASS (MODULE:CLASS
# to measure a variant of the Python client, default pscluster:Cluster), SERVER_FLAGS (more
# ps_server flags, e.g. --max_chunk_bytes=1048576), OUT (folder for the per-round JSON and
# server logs, default a temporary one). A second table gives each client's CPU time (user +
# system, all its threads) per call, medians over rounds: the steadier figure on a busy host.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS="${ROUNDS:-5}"
REPS="${REPS:-9}"
SIZES_KIB="${SIZES_KIB:-64,1024,16384,65536}"
SHARDS="${SHARDS:-1 2}"
PYTHON="${PYTHON:-/usr/bin/python3}"
PY_CLUSTER_CLASS="${PY_CLUSTER_CLASS:-pscluster:Cluster}"
read -r -a EXTRA_SERVER_FLAGS <<<"${SERVER_FLAGS:-}"

if [[ -z "${BIN:-}" ]]; then
  (cd "$ROOT" && bazel build -c opt //server/ps:ps_server //bench:client_throughput \
      //python:pscluster >&2)
  BIN="$ROOT/bazel-bin"
  SERVER="$BIN/server/ps/ps_server"
  CPP="$BIN/bench/client_throughput"
else
  SERVER="$BIN/ps_server"
  CPP="$BIN/client_throughput"
fi
for f in "$SERVER" "$CPP" "$BIN/python/pscluster/proto/ps_pb2.py"; do
  [[ -e "$f" ]] || { echo "missing $f" >&2; exit 1; }
done
export PYTHONPATH="$ROOT/python:$BIN/python${PYTHONPATH:+:$PYTHONPATH}"

OUT="${OUT:-$(mktemp -d /tmp/python_vs_cpp.XXXXXX)}"
mkdir -p "$OUT"
PIDS=()
stop_servers() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
trap stop_servers EXIT
trap 'exit 130' INT TERM

# Starts N shards; sets ADDRESSES (comma-separated, by shard id).
start_servers() {
  local n="$1" i addr log
  ADDRESSES=""
  for ((i = 0; i < n; i++)); do
    log="$OUT/server-$n-$i.log"
    "$SERVER" --port=0 --shard_id="$i" --num_shards="$n" "${EXTRA_SERVER_FLAGS[@]}" \
        >"$log" 2>&1 &
    PIDS+=("$!")
    addr=""
    for _ in $(seq 200); do  # up to 10 s
      addr="$(grep -o 'listening on [^ ]*' "$log" | head -1 | awk '{print $3}')" || true
      [[ -n "$addr" ]] && break
      kill -0 "${PIDS[-1]}" 2>/dev/null || { cat "$log" >&2; exit 1; }
      sleep 0.05
    done
    [[ -n "$addr" ]] || { echo "shard $i did not start:" >&2; cat "$log" >&2; exit 1; }
    ADDRESSES="${ADDRESSES:+$ADDRESSES,}$addr"
  done
}

run_cpp() {
  "$CPP" --shards="$ADDRESSES" --sizes_kib="$SIZES_KIB" --reps="$REPS" \
      --json="$OUT/cpp-$1-$2.json" >&2
}
run_py() {
  "$PYTHON" "$ROOT/bench/py_client_throughput.py" --shards="$ADDRESSES" \
      --sizes_kib="$SIZES_KIB" --reps="$REPS" --cluster_class="$PY_CLUSTER_CLASS" \
      --json="$OUT/py-$1-$2.json" >&2
}

for n in $SHARDS; do
  start_servers "$n"
  echo "== $n shard(s) at $ADDRESSES" >&2
  for ((r = 0; r < ROUNDS; r++)); do
    echo "-- round $r" >&2
    if ((r % 2 == 0)); then run_cpp "$n" "$r"; run_py "$n" "$r"
    else run_py "$n" "$r"; run_cpp "$n" "$r"; fi
  done
  stop_servers
done

"$PYTHON" - "$OUT" "$SHARDS" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, shards, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
med = statistics.median
cpu = []
print(f"\n{rounds} rounds; GB/s = 1e9 bytes/s of tensor per call, medians over rounds; "
      "py/C++ = median of per-round ratios\n")
print("| shards | size | C++ push GB/s | Python push GB/s | **py/C++ push** "
      "| C++ pull GB/s | Python pull GB/s | **py/C++ pull** |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for n in shards:
    rows = {}  # bytes -> [(cpp, py) per round]
    for r in range(rounds):
        cpp = json.load(open(f"{out}/cpp-{n}-{r}.json"))
        py = json.load(open(f"{out}/py-{n}-{r}.json"))
        for c, p in zip(cpp, py):
            assert c["bytes"] == p["bytes"]
            rows.setdefault(c["bytes"], []).append((c, p))
    for nbytes, pairs in rows.items():
        size = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
        cols = []
        for k in ("push_gbps", "pull_gbps"):
            c = med([a[k] for a, _ in pairs])
            p = med([b[k] for _, b in pairs])
            ratio = med([b[k] / a[k] for a, b in pairs])
            cols.append(f"{c:.3f} | {p:.3f} | **{ratio:.2f}**")
        print(f"| {n} | {size} | {cols[0]} | {cols[1]} |")
        cpu.append((n, size, [med([x[side][k] for x in pairs])
                              for k in ("push_cpu_ms", "pull_cpu_ms") for side in (0, 1)]))
print("\nclient CPU ms per call (medians over rounds)\n")
print("| shards | size | C++ push | Python push | C++ pull | Python pull |")
print("|---:|---:|---:|---:|---:|---:|")
for n, size, v in cpu:
    print(f"| {n} | {size} | " + " | ".join(f"{x:.1f}" for x in v) + " |")
print(f"\nper-round JSON: {out}")
EOF
