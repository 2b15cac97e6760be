#!/usr/bin/env bash
# Every binary's --help exits 0 and lists its own flags; --version prints the repository's
# VERSION. (Before: "No flags matched." with exit 1, and "Debug build (NDEBUG not #defined)".)
set -uo pipefail
version=$(cat VERSION) failed=0
check() {  # binary flag-it-must-list
  local bin=$1 flag=$2 out rc
  out=$("$bin" --help 2>&1); rc=$?
  if ((rc != 0)) || ! grep -q -- "--$flag=" <<<"$out"; then
    echo "FAIL: $bin --help exited $rc, listing --$flag: $(grep -c -- "--$flag=" <<<"$out")"
    failed=1
  fi
  out=$("$bin" --version 2>&1); rc=$?
  if ((rc != 0)) || [[ $out != *" $version" ]]; then
    echo "FAIL: $bin --version exited $rc and printed '$out', not the version $version"
    failed=1
  fi
}
check server/ps/ps_server shard_id
check server/coordinator/ps_coordinator num_workers
check worker/ps_worker micro_batches
check tools/psctl/psctl coordinator
((failed == 0)) && echo PASS
exit "$failed"
