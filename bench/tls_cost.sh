#!/usr/bin/env bash
# What TLS and tokens cost: the same work with them off and on, interleaved in one sitting.
#  1. bench/ps_throughput --ab=tls: two sets of in-process shards, one serving TLS and
#     checking the cluster and admin tokens on every call (ps_server's credentials), the
#     other plaintext; the real PsClient's pushes and pulls alternate between them. Then
#     plaintext on both sides (--ab_control): the measurement's noise.
#  2. Training in PS mode (deploy/local_cluster.sh: 2 workers, 2 shards), alternating:
#     plaintext without tokens (--tokens off), the default (tokens on loopback, gRPC's local
#     credentials), and --tls on (TLS and tokens).
# Certificates and tokens: deploy/make_certs.sh (ECDSA P-256; gRPC negotiates TLS 1.3 with
# AES-GCM). Prints medians and the on/off ratio of each.
#   bench/tls_cost.sh [ROUNDS=5] [EPOCHS=1]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5} epochs=${2:-1}
tmp=$(mktemp -d /tmp/tls_cost.XXXXXX)
echo "runs under $tmp"
bazel build -c opt //bench:ps_throughput >/dev/null 2>&1
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
deploy/make_certs.sh "$tmp/tls" >/dev/null
# The cipher's own rate on one core (TLS 1.3's first choice in OpenSSL, 16 KiB records as
# gRPC's TLS frames): a physical ceiling for what encryption can cost.
echo "AES-256-GCM, one core, 16 KiB records (openssl speed): $(openssl speed -elapsed -seconds 3 \
  -bytes 16384 -evp aes-256-gcm 2>/dev/null | awk '/^AES-256-GCM/ {printf "%.2f GB/s", $2 / 1e6}')"
for control in false true; do
  echo "ps_throughput, goodput with TLS and tokens / without$([[ $control == true ]] && echo " (A/A control: plaintext on both sides)"):"
  "$bin/bench/ps_throughput" --ab=tls --tls_dir="$tmp/tls" --ab_control=$control \
    --rounds=$((2 * rounds)) --reps=7 --sizes_kib=64,1024,16384,65536
done
for ((r = 0; r < rounds; ++r)); do
  for run in "tls-off --tokens off" "tls-on --tls on" "loopback_tokens-on"; do
    dir=${run%% *} flags=${run#"$dir"}
    # shellcheck disable=SC2086  # the run's flags, split
    deploy/local_cluster.sh --epochs "$epochs" $flags --metrics off --out "$tmp/$dir$r" \
      >"$tmp/$dir$r.log" 2>&1 || { echo "tls_cost.sh: training ($dir$flags) failed; see $tmp/$dir$r.log" >&2; exit 1; }
  done
  ln -s "$tmp/tls-off$r" "$tmp/loopback_tokens-off$r"  # one plaintext run, both rows' baseline
  echo "round $((r + 1))/$rounds done"
done
python3 bench/ab_summary.py "$tmp" "$rounds" "plaintext, no tokens" "secured" tls loopback_tokens
