#!/usr/bin/env bash
# The GPT (ps_worker --model=gpt: 4 blocks, 4 heads, width 256, context 128 by default) in
# every mode against PyTorch DDP (bench/gpt_torch.py --world 2: the same model, data, batch,
# Adam and learning-rate decay) on the same 2 processes of this machine, interleaved.
#
#   bench/gpt_modes.sh                       # ROUNDS=3 STEPS=60: throughput
#   STEPS=0 EPOCHS=2 ROUNDS=1 bench/gpt_modes.sh   # whole epochs: validation bits per byte
#
# Each round runs torch DDP and then each mode (local_cluster.sh --model gpt --mode M: a
# coordinator, 2 shards, 2 workers), the one going first rotating. tokens/s = the sum over
# both workers of steps * batch * context / training seconds (evaluation excluded, as
# gpt_torch.py does). Prints a markdown table: medians over rounds, the median of the
# per-round ratios to DDP, the held-out bits per byte of the last round (test loss / ln 2),
# the pipeline's bubble (stage 0 and the last) against (K-1)/(M+K-1), and FSDP's state per
# worker against a replica's. Also: MODES, BATCH (16 per worker), MICRO (4), GPT_ARGS
# (more --gpt_* flags for both sides' shapes: give them as e.g. "--gpt_layers=2").
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-60} EPOCHS=${EPOCHS:-1} BATCH=${BATCH:-16} MICRO=${MICRO:-4}
MODES=${MODES:-"ps allreduce fsdp pipeline"} GPT_ARGS=${GPT_ARGS:-}
PY=/usr/bin/python3
deploy/install_deps.sh --torch
bazel build -c opt //worker:ps_worker //server/ps:ps_server //server/coordinator:ps_coordinator \
  2>&1 | tail -n 1
out=$(mktemp -d /tmp/gpt_modes.XXXXXX)
echo "== per-run output in $out"
steps_flag=() torch_steps=()
if ((STEPS > 0)); then steps_flag=("--max_steps=$STEPS"); torch_steps=(--max_steps "$STEPS"); fi
torch_shape=()
for a in $GPT_ARGS; do torch_shape+=("--${a#--gpt_}"); done

run_torch() {  # round
  OMP_NUM_THREADS=1 $PY bench/gpt_torch.py --world 2 --batch_size "$BATCH" --epochs "$EPOCHS" \
    ${torch_steps[@]+"${torch_steps[@]}"} ${torch_shape[@]+"${torch_shape[@]}"} \
    >"$out/torch-$1.log" 2>&1 || { tail -n 20 "$out/torch-$1.log" >&2; exit 1; }
  grep '^{' "$out/torch-$1.log" | tail -n 1 >"$out/torch-$1.json"
  echo "   torch ddp: $($PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.0f tokens/s, %.4f bits per byte" % (d["tokens_per_sec"], d["bits_per_byte"]))' "$out/torch-$1.json")"
}
run_mode() {  # mode round
  deploy/local_cluster.sh --model gpt --mode "$1" --batch_size "$BATCH" --epochs "$EPOCHS" \
    --micro_batches "$MICRO" --metrics off --out "$out/$1-$2" \
    --worker_args "${steps_flag[*]} $GPT_ARGS" >"$out/$1-$2.log" 2>&1 \
    || { tail -n 20 "$out/$1-$2.log" >&2; exit 1; }
  echo "   $1: $(tail -n 1 "$out/$1-$2.log")"
}

for ((r = 0; r < ROUNDS; ++r)); do
  echo "-- round $r"
  runs=(torch $MODES)
  for ((i = 0; i < ${#runs[@]}; ++i)); do
    name=${runs[$(((i + r) % ${#runs[@]}))]}
    if [[ $name == torch ]]; then run_torch "$r"; else run_mode "$name" "$r"; fi
  done
done

context=128
for a in $GPT_ARGS; do [[ $a == --gpt_context=* ]] && context=${a#--gpt_context=}; done
$PY - "$out" "$ROUNDS" "$MODES" "$context" <<'EOF'
import json, math, statistics, sys
out, rounds, modes, context = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), int(sys.argv[4])
med = statistics.median
torch = [json.load(open(f"{out}/torch-{r}.json")) for r in range(rounds)]
print(f"\n{rounds} round(s); tokens/s summed over the 2 workers, medians over rounds\n")
print("| run | tokens/s | **/ DDP** | held-out bits per byte (last round) | notes |")
print("|---|---|---|---|---|")
print(f"| PyTorch DDP (gloo) | {med(t['tokens_per_sec'] for t in torch):,.0f} | 1.00 "
      f"| {torch[-1]['bits_per_byte']:.4f} | bigram baseline "
      f"{torch[-1]['bigram_bits_per_byte']:.4f} |")
for m in modes:
    runs = [json.load(open(f"{out}/{m}-{r}/summary.json")) for r in range(rounds)]
    rates = [s["samples_per_sec"] * context for s in runs]
    ratios = [rates[r] / torch[r]["tokens_per_sec"] for r in range(rounds)]
    figs = runs[-1]["figures"]
    notes = ""
    if m == "pipeline":
        last = figs[f"worker{len(figs) - 1}"]
        notes = (f"bubble {figs['worker0']['pipeline_bubble']:.2f} / "
                 f"{last['pipeline_bubble']:.2f} vs ideal "
                 f"{figs['worker0']['pipeline_bubble_ideal']:.2f}")
    if m == "fsdp":
        f = figs["worker0"]
        notes = (f"state {f['fsdp_state_bytes'] / 1e6:.1f} MB of a replica's "
                 f"{f['replica_state_bytes'] / 1e6:.1f} MB "
                 f"({f['fsdp_state_bytes'] / f['replica_state_bytes']:.2f})")
    bpb = runs[-1]["test_loss"] / math.log(2)
    print(f"| {m} | {med(rates):,.0f} | **{med(ratios):.2f}** | {bpb:.4f} | {notes} |")
print(f"\nper-run output: {out}")
EOF
