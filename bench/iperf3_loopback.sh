#!/usr/bin/env bash
# One loopback TCP stream as iperf3 measures it, as iperf3's JSON (its result under
# end.sum_received, its CPU accounting under end.cpu_utilization_percent), for the benches
# that set figures beside it.
#   bench/iperf3_loopback.sh OUT.json [SECONDS=3]
set -euo pipefail
out=${1:?usage: bench/iperf3_loopback.sh OUT.json [SECONDS]} secs=${2:-3}
command -v iperf3 >/dev/null || apt-get install -y -qq iperf3 >/dev/null
port=$((5200 + RANDOM % 700))
iperf3 -s -1 -p "$port" -B 127.0.0.1 >/dev/null 2>&1 &
server=$!
for ((try = 0; try < 50; ++try)); do  # until the server listens (5 s at most)
  # (iperf3 -J exits 0 even when refused: the JSON says whether it measured)
  iperf3 -c 127.0.0.1 -p "$port" -t "$secs" -J >"$out" 2>/dev/null || true
  grep -q '"sum_received"' "$out" && break
  sleep 0.1
done
kill "$server" 2>/dev/null || true  # gone after its one test; else it never got one
wait "$server" 2>/dev/null || true
grep -q '"sum_received"' "$out" \
  || { echo "iperf3_loopback.sh: iperf3 did not measure loopback TCP; see $out" >&2; exit 1; }
