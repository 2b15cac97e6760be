#!/bin/bash
# The Python examples as a user runs them, small, each through a local cluster of its own:
# examples/ctr.py (2 workers, 2 shards, BSP, 100,000 examples, 1 epoch) and
# examples/train_fashion_mnist.py (the MLP, 2 workers, 200 steps each). A case passes when
# the example exits 0 within its bound, ends with its JSON summary, learned something (AUC >
# 0.7; test accuracy > 0.6) and left no temporary folder behind. Without python3-torch the
# cases count as skipped, saying why. Usage: tests/examples/run.sh [BAZEL_BIN]
set -u
cd "$(dirname "$0")/../.."
bin=${1:-bazel-bin}
export PYTHONPATH=python:$bin/python
export PS_SERVER=$bin/server/ps/ps_server PS_COORDINATOR=$bin/server/coordinator/ps_coordinator
py=/usr/bin/python3
passed=0 failed=0 skipped=0
finish() { echo "examples stage: $passed passed, $failed failed, $skipped skipped"; exit 0; }
if ! "$py" -c "import torch" 2>/dev/null; then
  echo "examples: $py cannot import torch (python3-torch): 2 cases skipped"
  skipped=2
  finish
fi

# example NAME TMP_PREFIX CHECK(a Python expression over the summary d) ARGS...
example() {
  local name=$1 prefix=$2 check=$3; shift 3
  local out before after
  before=$(ls -d /tmp/"$prefix"* 2>/dev/null | wc -l)
  out=$(timeout 600 "$py" "$@" 2>&1)
  local rc=$?
  after=$(ls -d /tmp/"$prefix"* 2>/dev/null | wc -l)
  echo "$out" | tail -3
  if ((rc != 0)); then
    echo "examples: $name FAILED (exit status $rc)"; failed=$((failed + 1)); return
  fi
  local judge="import json, sys; d = json.loads(sys.stdin.read()); sys.exit(0 if ($check) else 1)"
  if ! echo "$out" | tail -1 | "$py" -c "$judge"; then
    echo "examples: $name FAILED: its summary does not satisfy $check"
    failed=$((failed + 1)); return
  fi
  if ((after > before)); then
    echo "examples: $name FAILED: it left a /tmp/$prefix* folder"; failed=$((failed + 1)); return
  fi
  echo "examples: $name ok"; passed=$((passed + 1))
}

example ctr ctr_ 'd["auc"] > 0.7 and d["shards"] == 2' \
  examples/ctr.py --train 100000 --test 20000 --epochs 1
example train_fashion_mnist train_fashion_mnist_ 'd["test_accuracy"] > 0.6 and d["steps"] == 200' \
  examples/train_fashion_mnist.py --model mlp --workers 2 --epochs 1 --max_steps 200
finish
