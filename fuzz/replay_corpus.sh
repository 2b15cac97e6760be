#!/bin/bash
# A fuzz target over its checked-in seeds (fuzz/fuzz.bzl): every input must run to the end.
#   replay_corpus.sh TARGET CORPUS_DIR (relative to the runfiles root)
set -euo pipefail
target=$1 corpus=fuzz/$2
[[ -d $corpus ]] || { echo "no corpus folder $corpus" >&2; exit 1; }
"$target" "$corpus"
