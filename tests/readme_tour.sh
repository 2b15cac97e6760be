#!/usr/bin/env bash
# The README's five-minute tour, run with the commands README.md itself shows (read from
# its "A five-minute tour" section, so what a reader copies is what runs): a run of 50
# epochs, psctl status and top, a shard killed with kill -9 and recovered, a live switch
# to allreduce. The run must end well, with the rollback and the switch in its summary.
#   tests/readme_tour.sh [OUT=/tmp/pscluster_readme_tour]
# Runs where the main job ran (deploy/local_cluster.sh installs and builds what it needs);
# tests/fresh_machine.sh runs it in the fresh root after the main job. Each wait is
# bounded and says what it waited for. Writes runs/tour as the README says.
# Last line: "readme_tour stage: P passed, F failed, 0 skipped" (one case: the tour).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/pscluster_readme_tour}
mkdir -p "$out"
log=$out/first_terminal.log
fail() {
  echo "readme_tour: $*"
  [[ -f $log ]] && tail -n 15 "$log" | sed 's/^/    /'
  [[ -n ${run_pid:-} ]] && kill "$run_pid" 2>/dev/null && wait "$run_pid" 2>/dev/null
  echo "readme_tour stage: 0 passed, 1 failed, 0 skipped"
  exit 1
}

# The tour's commands: the indented lines of its section, in order.
mapfile -t lines < <(awk '/^## /{on = ($0 == "## A five-minute tour")} on && /^    /{print substr($0, 5)}' README.md)
# tour_line VAR PATTERN: VAR gets the tour's first command matching PATTERN. Not in a
# subshell, so that a missing command ends the script here.
tour_line() {
  local l
  for l in "${lines[@]}"; do [[ $l =~ $2 ]] && { printf -v "$1" '%s' "$l"; return; }; done
  fail "README.md's tour has no command matching /$2/: update tests/readme_tour.sh with it"
}
tour_line start '^deploy/local_cluster\.sh '
tour_line coord_line '^coord='
tour_line psctl_line '^psctl='
tour_line status_line ' status'
tour_line top_line ' top'
tour_line kill_line '^kill -9 '
tour_line switch_line ' switch-mode '

# await SECONDS WHAT TEST...: polls TEST until it holds, while the run lives.
await() {
  local limit=$1 what=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@"; do
    ((SECONDS < end)) || fail "waited ${limit} s for $what"
    kill -0 "$run_pid" 2>/dev/null || fail "the run ended while waiting for $what"
    sleep 1
  done
}
said() { grep -q -- "$1" "$log"; }

rm -rf runs/tour
echo "readme_tour: $start (its output: $log)"
bash -c "$start" >"$log" 2>&1 &
run_pid=$!
# The first build of the optimised binaries can take a while on a fresh machine.
await 1800 "runs/tour/coordinator.address" test -s runs/tour/coordinator.address
eval "$coord_line" && eval "$psctl_line" || fail "the tour's set-up lines failed"
await 300 "the first epoch's test accuracy" said "epoch 1 test accuracy"
echo "readme_tour: $status_line"
eval "$status_line" >"$out/status.txt" 2>&1 || fail "psctl status failed: $(cat "$out/status.txt")"
grep -q "worker" "$out/status.txt" || fail "psctl status names no worker: $(cat "$out/status.txt")"
# Away from a terminal, top redraws until Ctrl-C (SIGINT), which quits it cleanly.
echo "readme_tour: $top_line (for 3 s, then Ctrl-C)"
eval "timeout --preserve-status -s INT 3 $top_line" </dev/null >"$out/top.txt" 2>&1 \
  || fail "psctl top failed: $(tail -n 5 "$out/top.txt")"
grep -q "worker" "$out/top.txt" || fail "psctl top drew no worker: $(tail -n 5 "$out/top.txt")"
echo "readme_tour: $kill_line"
eval "$kill_line" || fail "the kill found no shard 1"
await 120 "'shard1 died' in the first terminal" said "shard1 died"
await 300 "the workers' rollback" said "rolled back from step"
echo "readme_tour: $switch_line"
eval "$switch_line" >"$out/switch.txt" 2>&1 || fail "switch-mode failed: $(cat "$out/switch.txt")"
await 300 "the workers' switch to allreduce" said "switched from ps to allreduce"
# The run goes on to its 50th epoch: a few minutes on a 2-core machine.
end=$((SECONDS + 900))
while kill -0 "$run_pid" 2>/dev/null; do
  ((SECONDS < end)) || fail "waited 900 s for the run to finish"
  sleep 1
done
wait "$run_pid"; rc=$?
run_pid=""
((rc == 0)) || fail "deploy/local_cluster.sh exited $rc"
/usr/bin/python3 - runs/tour/summary.json <<'PY' || fail "the summary lacks the rollback or the switch"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["rollbacks"], "no rollback in summary.json"
assert any(w["to"] == "allreduce" for w in s["switches"]), "no switch to allreduce"
print(f"readme_tour: summary.json lists {len(s['rollbacks'])} rollback(s) and the switch")
PY
echo "readme_tour stage: 1 passed, 0 failed, 0 skipped"
