#!/usr/bin/env bash
# psctl plan's predictions for this machine against what the GPT's runs measure.
#
#   bench/plan_vs_measured.sh            # STEPS=40 ROUNDS=3 BATCH=16
#
# Calibration, measured first in the same sitting, with 2 processes at once as the 2 workers
# share the machine: the CPU backend's own kernels at the GPT's shapes
# (bench/gpt_kernel_rates: its products, forward and backward, as the "GPU" FLOP rate; its
# element-wise kernels in the plan's count of bytes as the "HBM" rate: on a CPU core they
# are compute-bound, at about 0.4x of a copy's bandwidth), a copy's bandwidth (numpy copyto
# of 64 MB arrays, bytes read + written: the physical ceiling, printed for reference), and
# loopback TCP (iperf3, one stream, 3 s) as the link between the 2 workers. Then `psctl plan
# --precision=fp32 --state_bytes_per_param=24 --nosequence_parallel` for the default GPT (4
# blocks, 4 heads, width 256, context 128, vocabulary 256) on 1 node x 2 workers with
# --mfu_high=1, and ROUNDS runs
# of each mode (local_cluster.sh --model gpt --mode M --worker_args --max_steps=STEPS).
# Measured memory: worker 0's train_memory_bytes (resident memory training added, before the
# first evaluation); measured step: worker 0's training seconds / steps. Prints a markdown table:
# predicted, measured (median over rounds) and their ratio, per mode against the plan's
# layout for it (allreduce: DDP; fsdp: ZeRO-3/FSDP; tensor: T2xP1xD1).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-40} ROUNDS=${ROUNDS:-3} BATCH=${BATCH:-16}
PY=/usr/bin/python3
deploy/install_deps.sh
command -v iperf3 >/dev/null || apt-get install -y -qq iperf3 >/dev/null
bazel build -c opt //worker:ps_worker //server/ps:ps_server //server/coordinator:ps_coordinator \
  //tools/psctl //bench:gpt_kernel_rates 2>&1 | tail -n 1
out=$(mktemp -d /tmp/plan_vs_measured.XXXXXX)
echo "== per-run output in $out"

bench/calibrate.sh "$out" "$BATCH"
mean() {  # field: the mean over the 2 processes run at once
  $PY -c 'import json,sys; print("%.2f" % (sum(json.load(open(f))[sys.argv[1]] for f in sys.argv[2:]) / 2))' \
    "$1" "$out/pair0" "$out/pair1"
}
gflops=$(mean gemm_gflops) ewbw=$(mean elementwise_gbps)
membw=$($PY -c 'import sys; print("%.2f" % ((float(open(sys.argv[1]).read()) + float(open(sys.argv[2]).read())) / 2))' "$out/copy0" "$out/copy1")
gbps=$($PY -c 'import json,sys; print("%.2f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 8e9))' "$out/iperf3.json")
echo "== calibration, per process with 2 at once: GEMM $gflops GFLOP/s, element-wise $ewbw GB/s (a copy: $membw GB/s), loopback TCP $gbps GB/s"

plan() {  # global batch in sequences, file
  bazel-bin/tools/psctl/psctl plan --layers=4 --width=256 --heads=4 --vocab=256 --context=128 \
    --dataset_tokens=2314000 --bytes_per_token=1 --global_batch_tokens=$(($1 * 128)) \
    --micro_batch="$BATCH" --nodes=1 --gpus_per_node=2 --gpu=cpu --gpu_memory_bytes=12e9 \
    --gpu_flops="${gflops}e9" --memory_gbps="$ewbw" --intra_node_gbps="$gbps" --host_copy_gbps=5 \
    --mfu_low=0.9 --mfu_high=1 --precision=fp32 --state_bytes_per_param=24 --nosequence_parallel \
    --json >"$2"
}
# The data-parallel layouts run 2 x BATCH sequences a step; TENSOR's 2 workers run one
# global batch of BATCH together (--batch_size BATCH/2 each), as the plan's T2xP1xD1 runs
# one micro-batch of BATCH.
plan $((2 * BATCH)) "$out/plan.json"
plan "$BATCH" "$out/plan_tensor.json"

for ((r = 0; r < ROUNDS; ++r)); do
  for mode in allreduce fsdp tensor; do
    batch=$BATCH
    [[ $mode == tensor ]] && batch=$((BATCH / 2))
    deploy/local_cluster.sh --model gpt --mode "$mode" --batch_size "$batch" --epochs 1 \
      --metrics off --out "$out/$mode-$r" --worker_args "--max_steps=$STEPS" \
      >"$out/$mode-$r.log" 2>&1 || { tail -n 20 "$out/$mode-$r.log" >&2; exit 1; }
    echo "   $mode round $r: $(tail -n 1 "$out/$mode-$r.log" | cut -c1-100)"
  done
done

$PY - "$out" "$ROUNDS" "$STEPS" "$gflops" "$gbps" "$membw" "$ewbw" <<'EOF'
import json, statistics, sys
out, rounds, steps_run, gflops, gbps, membw, ewbw = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:8]
layouts = {l["name"]: l for l in json.load(open(f"{out}/plan.json"))["layouts"]}
tensor = {l["name"]: l for l in json.load(open(f"{out}/plan_tensor.json"))["layouts"]}
print(f"\ncalibration, per process with 2 at once: GEMM {gflops} GFLOP/s, element-wise {ewbw} "
      f"GB/s (a copy: {membw} GB/s), loopback TCP {gbps} GB/s; {rounds} rounds, medians\n")
print("| mode (plan layout) | memory predicted MB | measured MB | **ratio** "
      "| step predicted ms (GEMM + memory + comm.) | measured ms | **ratio** |")
print("|---|---|---|---|---|---|---|")
for mode, name in [("allreduce", "DDP"), ("fsdp", "ZeRO-3/FSDP"), ("tensor", "T2xP1xD1")]:
    l = (tensor if mode == "tensor" else layouts)[name]
    predicted_mem = l["model_state_bytes"] + l["buffer_bytes"] + l["activation_bytes"]
    mems, steps = [], []
    for r in range(rounds):
        w = json.load(open(f"{out}/{mode}-{r}/worker0.json"))
        mems.append(w["figures"]["train_memory_bytes"])
        steps.append(w["train_seconds"] / steps_run)
    mem, step = statistics.median(mems), statistics.median(steps)
    print(f"| {mode} ({name}) | {predicted_mem / 1e6:.1f} | {mem / 1e6:.1f} | "
          f"**{predicted_mem / mem:.2f}** | {1e3 * l['step_seconds']:.0f} ({1e3 * l['gemm_seconds']:.0f} + "
          f"{1e3 * l['memory_seconds']:.0f} + {1e3 * l['communication']['seconds']:.0f}) | {1e3 * step:.0f} | "
          f"**{l['step_seconds'] / step:.2f}** |")
print(f"\nplan: {out}/plan.json")
EOF
