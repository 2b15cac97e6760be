#!/usr/bin/env bash
# The rates the step-time model is calibrated with, measured on this machine now: the GPT's
# kernels (bench/gpt_kernel_rates: GEMM GFLOP/s and element-wise GB/s) in one process alone
# and in 2 at once, a plain copy (numpy, 64 MB, 2 at once) and loopback TCP (iperf3, one
# stream, 3 s). Used by bench/scaling_model.sh and bench/plan_vs_measured.sh.
#   bench/calibrate.sh OUT_DIR BATCH   # writes alone, pair0, pair1, copy0, copy1, iperf3.json
# Expects bazel-bin/bench/gpt_kernel_rates built and iperf3 installed.
set -euo pipefail
out=$1 batch=$2
PY=/usr/bin/python3
rates() { bazel-bin/bench/gpt_kernel_rates --batch="$batch" --seconds=2 >"$1"; }
rates "$out/alone"
rates "$out/pair0" &
rates "$out/pair1"
wait
copy_rate() {
  OPENBLAS_NUM_THREADS=1 $PY - <<'PYEOF'
import time
import numpy as np
a = np.ones(16 << 20, dtype=np.float32)  # 64 MB: far past the caches
b = np.empty_like(a)
np.copyto(b, a)
start, n = time.perf_counter(), 0
while time.perf_counter() - start < 3.0:
    np.copyto(b, a)
    n += 1
print(f"{2 * a.nbytes * n / (time.perf_counter() - start) / 1e9:.2f}")
PYEOF
}
copy_rate >"$out/copy0" &
copy_rate >"$out/copy1"
wait
"$(dirname "$0")/iperf3_loopback.sh" "$out/iperf3.json" 3
