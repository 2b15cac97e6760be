#!/usr/bin/env bash
# PS-mode training of a BASE checkout against this one, interleaved (base, new, base, new,
# ...), ROUNDS rounds: the C++ workers (deploy/local_cluster.sh --mode ps: 2 workers, 2
# shards, the MLP, EPOCHS epochs) and pscluster.torch (examples/train_fashion_mnist.py
# --model mlp: 2 Python workers, 1 epoch, on 1 and on 2 shards). Prints, per run kind, the
# median samples/s of each side and the median of the per-round new/base ratios.
#   bench/training_ab.sh BASE_DIR [ROUNDS=6] [EPOCHS=3]
# BASE_DIR: another checkout, built, e.g. `git worktree add --detach /work/base <commit>`.
set -euo pipefail
cd "$(dirname "$0")/.."
base=$(cd "${1:?usage: bench/training_ab.sh BASE_DIR [ROUNDS] [EPOCHS]}" && pwd)
new=$(pwd)
rounds=${2:-6} epochs=${3:-3}
for tree in "$base" "$new"; do
  (cd "$tree" && bazel build -c opt //server/ps:ps_server //server/coordinator:ps_coordinator \
    //worker:ps_worker //tools/psctl:psctl //python:pscluster 2>&1 | tail -n 1)
done
tmp=$(mktemp -d /tmp/training_ab.XXXXXX)
echo "runs under $tmp"
for ((r = 0; r < rounds; ++r)); do
  for side in base new; do
    tree=$base; [[ $side == new ]] && tree=$new
    (cd "$tree" && deploy/local_cluster.sh --mode ps --epochs "$epochs" \
      --out "$tmp/$side-ps$r" >/dev/null 2>&1) \
      || { echo "training_ab.sh: $side ps round $r failed; see $tmp/$side-ps$r" >&2; exit 1; }
    for shards in 1 2; do
      (cd "$tree" && OMP_NUM_THREADS=1 /usr/bin/python3 examples/train_fashion_mnist.py \
        --model mlp --workers 2 --epochs 1 --local-shards "$shards" 2>&1 | grep '^{' | tail -n 1 \
        >"$tmp/$side-py$shards-$r.json") \
        || { echo "training_ab.sh: $side pscluster.torch, $shards shards, round $r failed" >&2
             exit 1; }
    done
  done
  echo "round $((r + 1))/$rounds done"
done
/usr/bin/python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
def sps(path):
    with open(f"{tmp}/{path}") as f:
        return json.load(f)["samples_per_sec"]
print("| training (samples/s) | base (median) | new (median) | **new / base** (median) "
      "| per round |")
print("|---|---|---|---|---|")
for name, pattern in [("ps mode, C++ workers, 2 shards", "{side}-ps{r}/summary.json"),
                      ("pscluster.torch, 1 shard", "{side}-py1-{r}.json"),
                      ("pscluster.torch, 2 shards", "{side}-py2-{r}.json")]:
    b = [sps(pattern.format(side="base", r=r)) for r in range(rounds)]
    n = [sps(pattern.format(side="new", r=r)) for r in range(rounds)]
    ratios = [y / x for x, y in zip(b, n)]
    print(f"| {name} | {statistics.median(b):,.0f} | {statistics.median(n):,.0f} | "
          f"**{statistics.median(ratios):.2f}** | {' / '.join(f'{q:.2f}' for q in ratios)} |")
PY
