#!/usr/bin/env bash
# Failover at the defaults (issue 49): how long training pauses when a chain loses a
# replica, with ps_coordinator's default liveness timeout (5 s) and 2 replicas a shard.
#
#   bench/failover.sh [RUNS=5]
#
# Runs tests/failover_test RUNS times, one run at a time (a run is a whole cluster on this
# machine's cores: coordinator, 2 shards x 2 replicas, 2 workers), and takes the median of
# each figure the test prints:
#   - a head SIGKILLed: from the kill to a whole step applied by the new head;
#   - a tail SIGKILLed: from the kill to a whole step applied by the head, alone now;
#   - a replica killed, restarted on a new port and rejoined, then its partner (the head)
#     killed: the pause until the rejoined replica, at its new address, applies a step;
#   - both replicas of a chain killed: from the kills to both workers stopping to roll back.
# Each test also checks what the figures stand on: the coordinator took the replica out on
# a report (its own probe), not by the timeout; no rollback where the chain held the state;
# the final parameters bitwise those of an uninterrupted run (the rollback's too).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
bazel test --nocache_test_results --runs_per_test="$runs" --local_test_jobs=1 \
  --test_output=errors //tests:failover_test 2>&1 | tail -n 3
logs=$(bazel info bazel-testlogs 2>/dev/null)/tests/failover_test
/usr/bin/python3 - "$runs" "$logs" <<'PY'
import glob, re, statistics, sys
sys.path.insert(0, "bench")
import figures

runs, logs = int(sys.argv[1]), sys.argv[2]
paths = sorted(glob.glob(f"{logs}/run_*_of_{runs}/test.log")) or [f"{logs}/test.log"]
patterns = {
    "head": r"head_killed: training paused (\d+) ms",
    "tail": r"tail_killed: training paused (\d+) ms",
    "rejoined": r"the rejoined replica \(new port\) made head: (\d+) ms",
    "both": r"both replicas of shard 1 killed: the workers stopped (\d+) ms after",
}
seen = {k: [] for k in patterns}
for path in paths:
    text = open(path, errors="replace").read()
    for k, p in patterns.items():
        seen[k] += [int(m) for m in re.findall(p, text)]
for k, v in seen.items():
    if len(v) != runs:
        sys.exit(f"failover: {len(v)} figures for {k!r} in {len(paths)} logs, not {runs}: "
                 f"a run failed (see {logs})")
med = {k: statistics.median(v) for k, v in seen.items()}
print(f"median of {runs} runs (ms), liveness timeout 5000 ms:")
for k in patterns:
    print(f"  {k:9s} {med[k]:7.0f}   runs: {', '.join(str(x) for x in seen[k])}")
figures.record(
    "failover", order=60, what="training's pause when a chain loses a replica, at the defaults",
    command=f"bench/failover.sh {runs}",
    figure=f"head killed {med['head']:.0f} ms, tail killed {med['tail']:.0f} ms, a rejoined "
           f"replica made head {med['rejoined']:.0f} ms; both replicas killed: the workers stop "
           f"to roll back after {med['both']:.0f} ms",
    beside="the liveness timeout (5000 ms), which bounded a head's failover before the "
           "clients' reports; every run ends bitwise as its uninterrupted run",
    measured=dict(medians_ms=med, runs_ms=seen))
PY
