#!/usr/bin/env bash
# The fuzz targets (fuzz/) under libFuzzer with AddressSanitizer and UBSan: builds them with
# clang (--config=fuzz, in an output base of their own: the compiler differs), then runs
# each for SECONDS on a copy of its checked-in seeds, one after another, and prints per
# target: executions, executions/s, edges covered, features, corpus size, peak RSS, and
# whether it crashed (the crashing input is kept in OUT/<target>/, ready for fuzz/corpus/).
#   bench/fuzz.sh [SECONDS=60] [OUT=/tmp/pscluster_fuzz] [TARGET...]
# PSCLUSTER_FUZZ_SEED=S: libFuzzer's -seed (default: random); PSCLUSTER_FUZZ_RUNS=N: stop
# each after N inputs (SECONDS still bounds it), so that a run with a seed is reproducible
# (tests/run.sh runs it that way). Last line: "fuzz: N targets, C crashed", or "fuzz: N
# targets, build failed" after the compiler's errors. Exit status 1 when one crashed, 2 when
# the targets did not build.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60} out=${2:-/tmp/pscluster_fuzz}
shift $(($# < 2 ? $# : 2))
targets=("$@")
((${#targets[@]})) || targets=(ps_service_fuzzer coordinator_fuzzer snapshot_fuzzer dense_wire_fuzzer)
# clang alone cannot build them: the sanitizers' headers and runtimes are compiler-rt's.
dpkg-query -W -f='${Status}\n' clang libclang-rt-14-dev 2>/dev/null | grep -c "install ok installed" |
  grep -qx 2 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
fuzz_bazel=(bazel --output_base="${PSCLUSTER_FUZZ_OUTPUT_BASE:-$HOME/.cache/bazel_pscluster_fuzz}")
echo "== building ${targets[*]} with clang, libFuzzer, ASan, UBSan"
mkdir -p "$out"; build_log=$out/build.log
if ! "${fuzz_bazel[@]}" build -c opt --config=fuzz --symlink_prefix=/ "${targets[@]/#/\/\/fuzz:}" \
    >"$build_log" 2>&1; then
  # A target that never built has not crashed: say so, with the compiler's own words and the
  # usual cause, so that the line to act on is the first one read.
  grep -E 'error:|ERROR:|fatal' "$build_log" | head -n 20 | sed 's/^/    /'
  echo "    (whole log: $build_log; a missing sanitizer header means libclang-rt-14-dev is not" \
    "installed: deploy/install_deps.sh --tests installs it)"
  echo "fuzz: ${#targets[@]} targets, build failed"
  exit 2
fi
tail -n 3 "$build_log"
bin=$("${fuzz_bazel[@]}" info -c opt --config=fuzz bazel-bin 2>/dev/null)
crashed=0
printf '%-20s %12s %9s %7s %8s %7s %8s %s\n' target executions exec/s edges features corpus rss_mb result
for t in "${targets[@]}"; do
  corpus=fuzz/corpus/${t%_fuzzer}
  mkdir -p "$out/$t/corpus"
  cp -n "$corpus"/* "$out/$t/corpus/" 2>/dev/null || true
  # -timeout: an input running 10 s is a hang; -rss_limit_mb: memory without bound is a bug.
  (cd "$out/$t" && "$bin/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -close_fd_mask=3 -print_final_stats=1 -seed="${PSCLUSTER_FUZZ_SEED:-0}" \
      ${PSCLUSTER_FUZZ_RUNS:+-runs=$PSCLUSTER_FUZZ_RUNS} corpus >log.txt 2>&1)
  status=$?
  log=$out/$t/log.txt
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  per_s=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -n1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -n1)
  edges=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  features=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  result=ok
  if ((status != 0)) || ls "$out/$t"/crash-* "$out/$t"/timeout-* "$out/$t"/oom-* >/dev/null 2>&1; then
    result="CRASHED (exit $status; inputs in $out/$t; log $log)"; crashed=$((crashed + 1))
    grep -m3 -E "ERROR|SUMMARY|changed|failed" "$log" | sed 's/^/    /'
  fi
  printf '%-20s %12s %9s %7s %8s %7s %8s %s\n' "$t" "${execs:-?}" "${per_s:-?}" "${edges:-?}" \
    "${features:-?}" "${corp:-?}" "${rss:-?}" "$result"
done
echo "fuzz: ${#targets[@]} targets, $crashed crashed"
((crashed == 0))
