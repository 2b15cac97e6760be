#!/usr/bin/env bash
# What metrics cost: the same work with metrics off and on, interleaved in one sitting.
#  1. bench/ps_throughput --ab=metrics: two sets of in-process shards, one counting every
#     RPC (the interceptor ps_server installs) and serving /metrics scraped over HTTP every
#     second, the other not; the real PsClient's pushes and pulls alternate between them.
#     Then the same with metrics off on both sides (--ab_control): the measurement's noise.
#  2. Training in each mode (deploy/local_cluster.sh: 2 workers, 2 shards) with --metrics
#     off and on; "on" runs a real Prometheus scraping every process every second.
# Prints medians and the on/off ratio of each.
#   bench/metrics_cost.sh [ROUNDS=5] [EPOCHS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5} epochs=${2:-2}
modes=(ps allreduce fsdp pipeline)
tmp=$(mktemp -d /tmp/metrics_cost.XXXXXX)
echo "runs under $tmp"
bazel build -c opt //bench:ps_throughput >/dev/null 2>&1
bin=$(bazel info -c opt bazel-bin 2>/dev/null)

train() {  # mode on|off out
  deploy/local_cluster.sh --mode "$1" --epochs "$epochs" --metrics "$2" --out "$3" >"$3.log" 2>&1 &
  local run=$! prom=""
  if [[ $2 == on ]]; then
    for ((t = 0; t < 600; ++t)); do [[ -s $3/prometheus.yml ]] && break; sleep 0.1; done
    sed 's/scrape_interval: 5s/scrape_interval: 1s/' "$3/prometheus.yml" >"$3/prometheus_1s.yml"
    prometheus --config.file="$3/prometheus_1s.yml" --web.listen-address=127.0.0.1:0 \
      --storage.tsdb.path="$3/tsdb" >"$3/prometheus.log" 2>&1 &
    prom=$!
  fi
  wait "$run" || { echo "metrics_cost.sh: $1 ($2) failed; see $3.log" >&2; exit 1; }
  [[ -z $prom ]] || { kill "$prom"; wait "$prom" || true; }
}

for control in false true; do
  echo "ps_throughput, goodput with metrics / without$([[ $control == true ]] && echo " (A/A control: metrics off on both sides)"):"
  "$bin/bench/ps_throughput" --ab=metrics --ab_control=$control --rounds=$((2 * rounds)) --reps=7 \
    --sizes_kib=4,64,1024,16384,65536
done
for ((r = 0; r < rounds; ++r)); do
  for mode in "${modes[@]}"; do
    for m in off on; do train "$mode" "$m" "$tmp/$mode-$m$r"; done
  done
  echo "round $((r + 1))/$rounds done"
done
python3 bench/ab_summary.py "$tmp" "$rounds" off on "${modes[@]}"
