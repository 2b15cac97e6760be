#!/usr/bin/env bash
# The network a docker-compose cluster's containers talk over (veth pairs on a Linux
# bridge, MTU 1500, as Docker's bridge networks) against the loopback that
# deploy/local_cluster.sh uses (MTU 65536): iperf3, one TCP stream, interleaved rounds, in
# two network namespaces joined by a bridge made here. Root only; removes what it made.
#   bench/bridge_vs_loopback.sh [ROUNDS] [SECONDS]
set -euo pipefail
rounds=${1:-3} secs=${2:-5}
command -v iperf3 >/dev/null || { echo "needs iperf3 (apt-get install iperf3)" >&2; exit 1; }
tag=pscl$$ pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  ip netns del "${tag}a" 2>/dev/null || true; ip netns del "${tag}b" 2>/dev/null || true
  ip link del "${tag}br" 2>/dev/null || true
}
trap cleanup EXIT
ip link add "${tag}br" type bridge && ip link set "${tag}br" up
i=0
for side in a b; do
  i=$((i + 1))
  ip netns add "$tag$side"
  ip link add "${tag}v$side" type veth peer name eth0 netns "$tag$side"
  ip link set "${tag}v$side" master "${tag}br" up
  ip -n "$tag$side" addr add "10.213.77.$i/24" dev eth0
  ip -n "$tag$side" link set eth0 up; ip -n "$tag$side" link set lo up
done
ip netns exec "${tag}a" iperf3 -s -p 5201 >/dev/null 2>&1 & pids+=($!)
iperf3 -s -B 127.0.0.1 -p 5299 >/dev/null 2>&1 & pids+=($!)
for t in $(seq 50); do  # both servers listening (bounded: 5 s)
  ip netns exec "${tag}b" iperf3 -c 10.213.77.1 -p 5201 -n 1M >/dev/null 2>&1 \
    && iperf3 -c 127.0.0.1 -p 5299 -n 1M >/dev/null 2>&1 && break
  sleep 0.1
done
gbps() { /usr/bin/python3 -c "import json,sys; print('%.2f' % (json.load(sys.stdin)['end']['sum_received']['bits_per_second'] / 8e9))"; }
for ((r = 1; r <= rounds; ++r)); do
  bridge=$(ip netns exec "${tag}b" iperf3 -c 10.213.77.1 -p 5201 -t "$secs" -J | gbps)
  loop=$(iperf3 -c 127.0.0.1 -p 5299 -t "$secs" -J | gbps)
  echo "round $r: bridge (veth, MTU 1500) $bridge GB/s, loopback $loop GB/s, bridge/loopback $(/usr/bin/python3 -c "print('%.2f' % ($bridge / $loop))")"
done
