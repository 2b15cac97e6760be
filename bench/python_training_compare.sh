#!/usr/bin/env bash
# Training through pscluster.torch (examples/train_fashion_mnist.py: 2 Python worker
# processes, 2 shards, BSP, Adam on the shards) against PyTorch's own ways of training the
# same network on the same 2 processes of this machine, interleaved, ROUNDS rounds:
#   mlp: the MLP 784-256-128-64-10, batch 64, against torch.distributed.rpc's parameter
#        server (bench/torch_rpc_ps.py: one PS process, 2 trainers, BSP);
#   cnn: examples/fashion_mnist.py's CNN, batch 64, against DistributedDataParallel on gloo
#        (bench/cnn_ddp_torch.py).
# pscluster.torch runs once per shard count in SHARDS (default "1 2"): 1 shard is as many
# processes as the RPC parameter server's (one PS, 2 trainers).
# samples/s = sum over workers of steps * batch / training seconds (evaluation excluded),
# the figure each script prints in its last JSON line. Prints a markdown table of the
# medians over rounds and the median of the per-round ratios.
#
#   bench/python_training_compare.sh                   # ROUNDS=3 EPOCHS=1 MODELS="mlp cnn"
#   ROUNDS=5 MODELS=mlp bench/python_training_compare.sh
#
# CNN_STEPS caps the CNN runs (default 300 steps per worker; 0: the whole epochs).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3} EPOCHS=${EPOCHS:-1} MODELS=${MODELS:-"mlp cnn"} CNN_STEPS=${CNN_STEPS:-300}
SHARDS=${SHARDS:-"1 2"}
PY=/usr/bin/python3
deploy/install_deps.sh --torch
bazel build -c opt //server/ps:ps_server //server/coordinator:ps_coordinator //python:pscluster \
  2>&1 | tail -n 1
out=$(mktemp -d /tmp/python_training_compare.XXXXXX)
echo "== per-run output in $out"

run() {  # name log command...
  local name=$1 log=$2
  shift 2
  if ! OMP_NUM_THREADS=1 "$@" >"$log" 2>&1; then
    echo "python_training_compare: $name failed; the end of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  # The last JSON line (torch.distributed.rpc logs its shutdown after it).
  grep '^{' "$log" | tail -n 1 >>"$out/$name.jsonl"
  echo "   $name: $(grep '^{' "$log" | tail -n 1 | $PY -c 'import json,sys; d=json.load(sys.stdin); print("%.0f samples/s, test accuracy %.4f" % (d["samples_per_sec"], d["test_accuracy"]))')"
}

for ((r = 0; r < ROUNDS; ++r)); do
  echo "-- round $r"
  for model in $MODELS; do
    steps=()
    [[ $model == cnn && $CNN_STEPS != 0 ]] && steps=(--max_steps "$CNN_STEPS")
    if [[ $model == mlp ]]; then
      baseline=(bench/torch_rpc_ps.py --trainers 2 --epochs "$EPOCHS")
    else
      baseline=(bench/cnn_ddp_torch.py --world 2 --epochs "$EPOCHS" "${steps[@]}")
    fi
    ours=(examples/train_fashion_mnist.py --model "$model" --workers 2 --epochs "$EPOCHS" "${steps[@]}")
    if ((r % 2 == 0)); then  # who goes first alternates
      run "$model-baseline" "$out/$model-baseline-$r.log" $PY "${baseline[@]}"
    fi
    for shards in $SHARDS; do
      run "$model-pscluster-s$shards" "$out/$model-pscluster-s$shards-$r.log" $PY "${ours[@]}" \
        --local-shards "$shards"
    done
    if ((r % 2 == 1)); then
      run "$model-baseline" "$out/$model-baseline-$r.log" $PY "${baseline[@]}"
    fi
  done
done

$PY - "$out" "$SHARDS" $MODELS <<'EOF'
import json, statistics, sys
out, shards, models = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
names = {"mlp": "torch.distributed.rpc PS", "cnn": "torch DDP (gloo)"}
print("\n| model | baseline | baseline samples/s | shards | pscluster.torch samples/s | **pscluster / baseline** | accuracy (baseline, pscluster) |")
print("|---|---|---|---|---|---|---|")
for m in models:
    b = [json.loads(l) for l in open(f"{out}/{m}-baseline.jsonl")]
    for s in shards:
        p = [json.loads(l) for l in open(f"{out}/{m}-pscluster-s{s}.jsonl")]
        ratio = statistics.median(y["samples_per_sec"] / x["samples_per_sec"] for x, y in zip(b, p))
        print(f"| {m} | {names[m]} | {statistics.median(x['samples_per_sec'] for x in b):,.0f} | {s} | "
              f"{statistics.median(y['samples_per_sec'] for y in p):,.0f} | **{ratio:.2f}** | "
              f"{b[-1]['test_accuracy']:.4f}, {p[-1]['test_accuracy']:.4f} |")
EOF
