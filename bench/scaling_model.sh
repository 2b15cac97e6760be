#!/usr/bin/env bash
# A model of step time, checked against going from 1 to 2 workers here, then what it
# predicts for 8 to 128 GPUs in each mode.
#
#   bench/scaling_model.sh                    # ROUNDS=3 STEPS=40: measure here, then predict
#   PREDICT_ONLY=1 bench/scaling_model.sh     # the predictions alone (no runs, no calibration)
#
# The model is psctl plan's (tools/psctl/plan.h): a step is its GEMM FLOPs at a measured
# rate, plus its element-wise kernels' and optimizer's bytes at a measured rate, plus each
# collective's bytes at the link's bandwidth (none hidden). PS mode, which the plan has no
# layout for, is modelled here on the same terms: the workers' step without the optimizer,
# then every worker pushes its gradient and pulls the parameters (4·N bytes each way here;
# each node's NIC carries its GPUs' shares for the other nodes' shards), then the shards run
# Adam over the N parameters (their state read and written once at the memory rate).
#
# Here: the GPT at its defaults (4 blocks, width 256, 16 sequences of 128 per worker), one
# worker alone (local_cluster.sh --workers 1 --mode allreduce: no collective) against 2
# workers in each of allreduce, fsdp, tensor (both workers on the 32 sequences together),
# pipeline (the 32 in MICRO=4 micro-batches) and ps, ROUNDS rounds of STEPS steps, medians; calibrated as bench/plan_vs_measured.sh
# does, once with one process (for the lone worker) and once with 2 at once. Speed-up =
# tokens/s of the 2 workers / tokens/s of the lone one (the limit is 2).
#
# There: weak scaling (8 sequences per GPU per step, as DDP benchmarks quote) of GPT-2
# medium (350M: 24 layers, width 1024, 16 heads, context 1024, 8 sequences per GPU) on
# A100-80GB nodes of 8 with 100 Gb/s each; efficiency = tokens/s per GPU at N GPUs / one
# GPU's; the communication is not hidden behind compute (as pscluster's modes run today),
# with one row for DDP's overlap of the all-reduce with the backward, which the ~90 % at 16
# GPUs / ~75 % at 128 usually quoted for DDP include. PIPELINE and TENSOR as pscluster runs them are one dimension over every worker
# (P <= layers; T <= the GPUs of one node, as the plan allows), so they stop where those do.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-40} BATCH=${BATCH:-16} MICRO=${MICRO:-4}
PREDICT_ONLY=${PREDICT_ONLY:-0}
PY=/usr/bin/python3
deploy/install_deps.sh
command -v iperf3 >/dev/null || apt-get install -y -qq iperf3 >/dev/null
bazel build -c opt //worker:ps_worker //server/ps:ps_server //server/coordinator:ps_coordinator \
  //tools/psctl //bench:gpt_kernel_rates 2>&1 | tail -n 1
out=$(mktemp -d /tmp/scaling_model.XXXXXX)
echo "== per-run output in $out"

if ((PREDICT_ONLY == 0)); then
  bench/calibrate.sh "$out" "$BATCH"
  run() {  # name workers mode batch
    deploy/local_cluster.sh --model gpt --workers "$2" --mode "$3" --batch_size "$4" --epochs 1 \
      --micro_batches "$MICRO" --metrics off --out "$out/$1" --worker_args "--max_steps=$STEPS" >"$out/$1.log" 2>&1 \
      || { tail -n 20 "$out/$1.log" >&2; exit 1; }
    echo "   $1: $(tail -n 1 "$out/$1.log" | cut -c1-90)"
  }
  for ((r = 0; r < ROUNDS; ++r)); do
    run "one-$r" 1 allreduce "$BATCH"
    for mode in allreduce fsdp tensor pipeline ps; do run "$mode-$r" 2 "$mode" "$BATCH"; done
  done
fi

$PY - "$out" "$ROUNDS" "$BATCH" "$PREDICT_ONLY" "$MICRO" <<'EOF'
import json, statistics, subprocess, sys
out, rounds, batch, predict_only = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
micro = int(sys.argv[5])
psctl = "bazel-bin/tools/psctl/psctl"

def plan(args):
    return json.loads(subprocess.run([psctl, "plan", "--json"] + args,
                                     check=True, capture_output=True, text=True).stdout)

def layout(p, name):
    found = [l for l in p["layouts"] if l["name"] == name]
    return found[0] if found else None

def ps_step(p, ddp, n_params, elem, state_bytes, link_seconds):
    """PS: the workers' step without their optimizer, push + pull, the shards' Adam."""
    ew = p["device"]["memory_gbps"] * 1e9
    worker = ddp["gemm_seconds"] + ddp["memory_seconds"] - 2 * ddp["model_state_bytes"] / ew \
        + 2 * 2 * elem * n_params / ew  # the worker keeps weights and gradients only
    shards = 2 * state_bytes * n_params / p["cluster"]["gpus"] / ew  # Adam's N spread over every host
    return worker + link_seconds + shards

if not predict_only:
    rate = lambda f, k: json.load(open(f))[k]
    alone = json.load(open(f"{out}/alone"))
    pair = {k: (rate(f"{out}/pair0", k) + rate(f"{out}/pair1", k)) / 2
            for k in ("gemm_gflops", "elementwise_gbps")}
    link = json.load(open(f"{out}/iperf3.json"))["end"]["sum_received"]["bits_per_second"] / 8e9
    gpt = ["--layers=4", "--width=256", "--heads=4", "--vocab=256", "--context=128",
           "--dataset_tokens=2314000", "--bytes_per_token=1", "--gpu=cpu", "--gpu_memory_bytes=12e9",
           "--host_copy_gbps=5", "--mfu_low=0.9", "--mfu_high=1", "--precision=fp32",
           "--state_bytes_per_param=24", "--nosequence_parallel", "--nodes=1",
           f"--intra_node_gbps={link}", "--global_batch_tokens=0"]
    one = plan(gpt + [f"--micro_batch={batch}", "--gpus_per_node=1",
                      f"--gpu_flops={alone['gemm_gflops']}e9",
                      f"--memory_gbps={alone['elementwise_gbps']}"])
    two = lambda m, extra=[]: plan(gpt + extra + [f"--micro_batch={m}", "--gpus_per_node=2",
                                    f"--gpu_flops={pair['gemm_gflops']}e9",
                                    f"--memory_gbps={pair['elementwise_gbps']}"])
    tokens1 = batch * 128
    predicted_one = tokens1 / layout(one, "DDP")["step_seconds"]
    two_b = two(batch)
    n = two_b["model"]["params"]
    ddp2 = layout(two_b, "DDP")
    # PS here: 2 workers each push 4·N and pull 4·N through loopback to the 2 shards.
    ps2 = ps_step(two_b, ddp2, n, 4, 16, 2 * 4 * n / (link * 1e9))
    predicted = {
        "allreduce": 2 * tokens1 / ddp2["step_seconds"],
        "fsdp": 2 * tokens1 / layout(two_b, "ZeRO-3/FSDP")["step_seconds"],
        "tensor": 2 * tokens1 / layout(two(2 * batch), "T2xP1xD1")["step_seconds"],
        # The 2 x batch sequences in `micro` micro-batches through 2 stages (1F1B).
        "pipeline": 2 * tokens1 / layout(
            two(2 * batch // micro, [f"--global_batch_tokens={2 * tokens1}"]),
            "T1xP2xD1")["step_seconds"],
        "ps": 2 * tokens1 / ps2,
    }
    med = statistics.median
    tok = lambda name: json.load(open(f"{out}/{name}/summary.json"))["samples_per_sec"] * 128
    measured_one = med(tok(f"one-{r}") for r in range(rounds))
    print(f"\nHere: calibration alone GEMM {alone['gemm_gflops']:.1f} GFLOP/s, element-wise "
          f"{alone['elementwise_gbps']:.2f} GB/s; 2 at once {pair['gemm_gflops']:.1f} GFLOP/s, "
          f"{pair['elementwise_gbps']:.2f} GB/s; loopback {link:.2f} GB/s. {rounds} rounds, medians.\n")
    print("| run | tokens/s predicted | measured | speed-up 1 -> 2 predicted | measured | **predicted / measured** |")
    print("|---|---|---|---|---|---|")
    print(f"| 1 worker | {predicted_one:,.0f} | {measured_one:,.0f} | | | |")
    for mode in ("allreduce", "fsdp", "tensor", "pipeline", "ps"):
        m = med(tok(f"{mode}-{r}") for r in range(rounds))
        sp, sm = predicted[mode] / predicted_one, m / measured_one
        print(f"| 2 workers, {mode} | {predicted[mode]:,.0f} | {m:,.0f} | {sp:.2f} | {sm:.2f} | **{sp / sm:.2f}** |")

# There: GPT-2 medium, weak scaling on A100-80GB nodes with 100 Gb/s.
model = ["--layers=24", "--width=1024", "--heads=16", "--vocab=50257", "--context=1024",
         "--dataset_bytes=200e9", "--micro_batch=8", "--gpu=a100-80gb", "--inter_node_gbit=100",
         "--mfu_high=0.5"]
counts = [1, 8, 16, 64, 128]
# The batch grows with the GPUs (8 sequences each): DDP and ZeRO run one micro-batch per GPU,
# a P-stage pipeline P micro-batches of 8, T-way tensor parallelism T of them in turn.
plans = {g: plan(model + [f"--nodes={max(1, g // 8)}", f"--gpus_per_node={min(g, 8)}",
                          f"--global_batch_tokens={g * 8 * 1024}"]) for g in counts}
base = plans[1]
base_rate = 8 * 1024 / layout(base, "DDP")["step_seconds"]
nparams = base["model"]["params"]

def efficiency(g, l):
    if l is None or l.get("step_seconds") is None:
        return None
    return l["batch_sequences"] * 1024 / l["step_seconds"] / (g * base_rate)

rows = {"allreduce (DDP)": [], "allreduce, all-reduce overlapped with the backward": [],
        "fsdp (ZeRO-3)": [], "ps (co-located shards)": [],
        "pipeline (P = GPUs)": [], "tensor (T = GPUs)": [], "best layout (plan's choice)": []}
for g in counts:
    p = plans[g]
    ddp = layout(p, "DDP")
    rows["allreduce (DDP)"].append(efficiency(g, ddp))
    # As PyTorch DDP runs it: buckets all-reduced while the backward (2/3 of the compute)
    # goes on, so a step is the forward + max(backward, communication).
    c = ddp["compute_seconds"]
    overlapped = c / 3 + max(2 * c / 3, ddp["step_seconds"] - c)
    rows["allreduce, all-reduce overlapped with the backward"].append(
        ddp["batch_sequences"] * 1024 / overlapped / (g * base_rate))
    rows["fsdp (ZeRO-3)"].append(efficiency(g, layout(p, "ZeRO-3/FSDP")))
    per_node, nodes = min(g, 8), max(1, g // 8)
    # Each GPU pushes bf16 gradients and pulls bf16 parameters; a node's NIC carries what its
    # GPUs send to (and get from) shards on other nodes; within a node NVLink.
    cross = per_node * 2 * nparams * (nodes - 1) / nodes / (100 / 8 * 1e9)
    local = 2 * nparams / nodes / (p["device"]["intra_node_gbps"] * 1e9) if g > 1 else 0
    comm = 2 * max(cross, local)
    ps = ps_step(p, ddp, nparams, 2, 12, comm) if g > 1 else ddp["step_seconds"]
    rows["ps (co-located shards)"].append(8 * 1024 * g / ps / (g * base_rate))
    rows["pipeline (P = GPUs)"].append(efficiency(g, layout(p, f"T1xP{g}xD1")) if g > 1 else 1.0)
    rows["tensor (T = GPUs)"].append(efficiency(g, layout(p, f"T{g}xP1xD1")) if g > 1 else 1.0)
    best = p["layouts"][[l["name"] for l in p["layouts"]].index(p["recommended"])] if p["recommended"] else None
    rows["best layout (plan's choice)"].append(
        None if best is None else (efficiency(g, best), best["name"]))

print("\nThere: GPT-2 medium (%.0fM parameters), 8 sequences of 1024 per GPU, A100-80GB, 8 per node, "
      "100 Gb/s per node, MFU 0.5; efficiency = tokens/s per GPU / one GPU's\n" % (nparams / 1e6))
print("| mode | " + " | ".join(f"{g} GPUs" for g in counts) + " |")
print("|---|" + "---|" * len(counts))
for name, values in rows.items():
    cells = []
    for v in values:
        if v is None:
            cells.append("n/a")
        elif isinstance(v, tuple):
            cells.append("n/a" if v[0] is None else f"{v[0]:.2f} ({v[1]})")
        else:
            cells.append(f"{v:.2f}")
    print(f"| {name} | " + " | ".join(cells) + " |")
print("| DDP as usually quoted | | | ~0.90 | | ~0.75 |")
print(f"\nper-run output: {out}")
EOF
