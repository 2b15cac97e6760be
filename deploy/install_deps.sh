#!/usr/bin/env bash
# Installs the Debian packages pscluster builds, tests and runs with, when any is missing.
# Idempotent and quiet when everything is there. Needs root (apt-get).
#   deploy/install_deps.sh           what building and running the cluster needs
#   deploy/install_deps.sh --plots   and matplotlib, for the plots of local_cluster.sh's runs
#   deploy/install_deps.sh --torch   and PyTorch, for pscluster.torch, its tests, examples
#                                    and the torch baselines in bench/
#   deploy/install_deps.sh --tests   all of that, and what tests/run.sh checks against:
#                                    Prometheus (and promtool), Chromium, clang and its
#                                    compiler-rt for the fuzz targets (libFuzzer, ASan
#                                    headers and runtimes), iptables for the packet loss
#                                    and partitions of tests/netem
set -euo pipefail

PACKAGES=(
  bazel-bootstrap g++ libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev
  libopenblas-dev prometheus-cpp-dev nlohmann-json3-dev libspdlog-dev dataset-fashion-mnist fortunes zlib1g-dev python3 python3-yaml
  python3-grpcio python3-numpy python3-pytest openssl python3-dev pybind11-dev procps
)
for option in "$@"; do
  case $option in
    --plots) PACKAGES+=(python3-matplotlib) ;;
    --torch) PACKAGES+=(python3-torch) ;;
    --tests) PACKAGES+=(python3-matplotlib python3-torch prometheus chromium clang libclang-rt-14-dev iptables) ;;
    *) echo "install_deps: unknown option $option (--plots, --torch, --tests)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "install_deps: need root to apt-get install; run: sudo $0" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
