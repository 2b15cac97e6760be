#!/usr/bin/env bash
# How fast PS-mode training could be on this machine, from physical rates measured in the
# same sitting, beside what it is and what single-process PyTorch does (issue 12's target:
# PS >= 1.5x single process).
#
#   bench/ps_ceiling.sh [ROUNDS=5] [EPOCHS=3]
#
# The ceiling counts only the CPU work a PS step cannot avoid, for 2 workers with batch 64
# and the MLP (784-256-128-64-10, N = 242,762 parameters) on 2 cores:
#   - each worker's forward + backward (bench/step_breakdown: OpenBLAS, 1 thread);
#   - Adam over the N parameters once (the same bench: the shards' code);
#   - every byte of the round trips through loopback TCP: each worker pushes 4N bytes and
#     pulls 4N, at the CPU seconds a byte costs iperf3 (one stream, sender's and receiver's
#     CPU together, from its own accounting).
# Not counted: loading batches, summing the two workers' gradients, copies in and out of the
# model, any framing or RPC work. The ceiling = 2 cores / that CPU time a step x 128 samples,
# as if every part ran back to back with the cores never idle. Each round also runs
# single-process PyTorch (bench/ddp_torch.py --world 1) and our PS mode
# (deploy/local_cluster.sh --mode ps: 2 workers, 2 shards); medians over the rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5} epochs=${2:-3}
command -v iperf3 >/dev/null || apt-get install -y -qq iperf3 >/dev/null
bazel build -c opt //bench:step_breakdown //server/ps:ps_server //server/coordinator:ps_coordinator \
  //worker:ps_worker //tools/psctl:psctl 2>&1 | tail -n 1
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
tmp=$(mktemp -d /tmp/ps_ceiling.XXXXXX)
echo "runs under $tmp"
for ((r = 0; r < rounds; ++r)); do
  port=$((5200 + RANDOM % 700))
  iperf3 -s -1 -p "$port" -B 127.0.0.1 >/dev/null 2>&1 &
  server=$!
  for ((try = 0; try < 50; ++try)); do  # until the server listens (5 s at most)
    # (iperf3 -J exits 0 even when refused: the JSON says whether it measured)
    iperf3 -c 127.0.0.1 -p "$port" -t 3 -J >"$tmp/iperf$r.json" 2>/dev/null
    grep -q '"sum_received"' "$tmp/iperf$r.json" && break
    sleep 0.1
  done
  kill "$server" 2>/dev/null || true  # gone after its one test; else it never got one
  wait "$server" 2>/dev/null || true
  /usr/bin/python3 -c 'import json, sys; json.load(open(sys.argv[1]))["end"]["sum_received"]' \
    "$tmp/iperf$r.json" 2>/dev/null \
    || { echo "ps_ceiling.sh: iperf3 did not measure loopback TCP; see $tmp/iperf$r.json" >&2; exit 1; }
  "$bin/bench/step_breakdown" --steps=1000 >"$tmp/breakdown$r.txt"
  OMP_NUM_THREADS=1 /usr/bin/python3 bench/ddp_torch.py --world 1 --epochs "$epochs" \
    | tail -n 1 >"$tmp/single$r.json"
  deploy/local_cluster.sh --mode ps --epochs "$epochs" --out "$tmp/ps$r" >/dev/null 2>&1 \
    || { echo "ps_ceiling.sh: the PS run of round $r failed; see $tmp/ps$r" >&2; exit 1; }
  echo "round $((r + 1))/$rounds done"
done
/usr/bin/python3 - "$tmp" "$rounds" <<'PY'
import json, re, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
med = statistics.median
N, WORKERS, BATCH, CORES = 242762, 2, 64, 2
rows = []
for r in range(rounds):
    end = json.load(open(f"{tmp}/iperf{r}.json"))["end"]
    gbps = end["sum_received"]["bits_per_second"] / 8e9
    cpu = end["cpu_utilization_percent"]
    cores = (cpu["host_total"] + cpu["remote_total"]) / 100  # sender's + receiver's
    text = open(f"{tmp}/breakdown{r}.txt").read()
    fb = float(re.search(r"forward \+ backward\s+([0-9.]+) ms", text).group(1)) / 1e3
    adam = float(re.search(r"adam over every parameter\s+([0-9.]+) ms", text).group(1)) / 1e3
    moved = WORKERS * 2 * 4 * N  # bytes: each worker's push and pull
    wire = moved / 1e9 / gbps * cores  # CPU seconds
    step_cpu = WORKERS * fb + adam + wire
    ceiling = WORKERS * BATCH / (step_cpu / CORES)
    single = json.load(open(f"{tmp}/single{r}.json"))["samples_per_sec"]
    ps = json.load(open(f"{tmp}/ps{r}/summary.json"))["samples_per_sec"]
    rows.append(dict(gbps=gbps, cores=cores, fb=fb * 1e3, adam=adam * 1e3, wire=wire * 1e3,
                     ceiling=ceiling, single=single, ps=ps))
m = {k: med(row[k] for row in rows) for k in rows[0]}
print(f"iperf3 loopback: {m['gbps']:.2f} GB/s using {m['cores']:.2f} cores "
      f"({m['cores'] / m['gbps']:.2f} CPU s a GB)")
print(f"a step's unavoidable CPU: forward + backward {m['fb']:.3f} ms x {WORKERS}, "
      f"Adam {m['adam']:.3f} ms, {WORKERS * 2 * 4 * N / 1e6:.2f} MB through loopback "
      f"{m['wire']:.3f} ms")
print()
print("| samples/s (median of %d) | single-process PyTorch | PS ceiling | PS measured | 1.5x single |" % rounds)
print("|---|---|---|---|---|")
print(f"| | {m['single']:,.0f} | {m['ceiling']:,.0f} | {m['ps']:,.0f} | {1.5 * m['single']:,.0f} |")
print(f"| / single process | 1.00 | **{med(r['ceiling'] / r['single'] for r in rows):.2f}** | "
      f"**{med(r['ps'] / r['single'] for r in rows):.2f}** | 1.50 |")
print(f"| / PS ceiling | {med(r['single'] / r['ceiling'] for r in rows):.2f} | 1.00 | "
      f"**{med(r['ps'] / r['ceiling'] for r in rows):.2f}** | "
      f"**{med(1.5 * r['single'] / r['ceiling'] for r in rows):.2f}** |")
print()
print("per round, ceiling / single process:", ", ".join(f"{r['ceiling'] / r['single']:.2f}" for r in rows),
      "| PS measured / ceiling:", ", ".join(f"{r['ps'] / r['ceiling']:.2f}" for r in rows))
PY
