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
# psctl help: the commands, and one command's synopsis and flags; an unknown one is a usage
# error (exit 2).
out=$(tools/psctl/psctl help 2>&1) || { echo "FAIL: psctl help exited $?"; failed=1; }
grep -q "switch-mode" <<<"$out" || { echo "FAIL: psctl help does not list switch-mode"; failed=1; }
out=$(tools/psctl/psctl help switch-mode 2>&1) || { echo "FAIL: psctl help switch-mode exited $?"; failed=1; }
grep -q -- "--at_step=0" <<<"$out" || { echo "FAIL: psctl help switch-mode lacks --at_step: $out"; failed=1; }
tools/psctl/psctl help nope >/dev/null 2>&1
rc=$?; ((rc == 2)) || { echo "FAIL: psctl help nope exited $rc, not 2"; failed=1; }
# export without its flags says which it needs (exit 2), before touching any file.
out=$(tools/psctl/psctl export --table=emb 2>&1)
rc=$?; ((rc == 2)) || { echo "FAIL: psctl export without --data_dir exited $rc, not 2"; failed=1; }
grep -q -- "--data_dir=" <<<"$out" || { echo "FAIL: psctl export does not name --data_dir: $out"; failed=1; }
((failed == 0)) && echo PASS
exit "$failed"
