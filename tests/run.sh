#!/usr/bin/env bash
# The test command: installs what is missing (Debian packages, as root), builds everything,
# runs every test (unit tests and the multi-process tests under tests/), builds and runs the
# CUDA targets wherever nvcc exists (GPU tests print why they skip without a GPU), and ends
# with one line: "N passed, N failed" counted over test cases.
set -uo pipefail
cd "$(dirname "$0")/.."

deploy/install_deps.sh --tests || { echo "tests/run.sh: installing packages failed"; echo "0 passed, 1 failed"; exit 1; }

BAZEL=(bazel)
failed_steps=0
run_tests() {  # bazel test args...; counts test cases from each target's test.xml
  "${BAZEL[@]}" test --nocache_test_results "$@" 2>&1 | tee -a /tmp/pscluster_test_run.log | grep -E "PASSED|FAILED|TIMEOUT|NO STATUS|ERROR|SKIPPED \(no GPU\)" || true
  return "${PIPESTATUS[0]}"
}

: > /tmp/pscluster_test_run.log
passed=0; failed=0; skipped=0
count_cases() {  # adds up the JUnit XML of the given test targets (bazel-testlogs = last config)
  local t xml n f e s
  for t in "$@"; do
    xml="bazel-testlogs/$(echo "${t#//}" | tr ':' '/')/test.xml"
    if [[ ! -f $xml ]]; then failed=$((failed + 1)); echo "no result for $t"; continue; fi
    read -r n f e s < <(python3 - "$xml" <<'PY'
import sys, xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
cases = list(r.iter("testcase"))
bad = sum(1 for c in cases if c.find("failure") is not None or c.find("error") is not None)
skip = sum(1 for c in cases if c.get("result") == "skipped" or c.find("skipped") is not None)
if not cases:  # a target that died before writing cases
    bad = int(r.get("failures", 0)) + int(r.get("errors", 0)) or 1
print(len(cases), bad, 0, skip)
PY
)
    passed=$((passed + n - f - e - s)); failed=$((failed + f + e)); skipped=$((skipped + s))
  done
}

run_tests //... || failed_steps=$((failed_steps + 1))

# The disk-full tests need a small file system: an 8 MiB tmpfs (root only), and no sandbox
# so the tests can reach it; one at a time, as each fills it. Elsewhere they stay skipped,
# with the reason in their logs.
if [[ $(id -u) -eq 0 ]] && small_fs=$(mktemp -d /tmp/pscluster_small_fs.XXXXXX) \
    && mount -t tmpfs -o size=8m pscluster_small_fs "$small_fs" 2>/dev/null; then
  run_tests --spawn_strategy=local --local_test_jobs=1 --test_env=PSCLUSTER_SMALL_FS="$small_fs" \
    //tests:disk_full_test //server/ps/table:sparse_table_tier_test \
    || failed_steps=$((failed_steps + 1))
  umount "$small_fs"; rmdir "$small_fs"
else
  echo "tests/run.sh: cannot mount a small tmpfs (not root?): //tests:disk_full_test stays skipped"
  [[ -n ${small_fs:-} ]] && rmdir "$small_fs" 2>/dev/null
fi
count_cases $("${BAZEL[@]}" query 'tests(//...)' 2>/dev/null)

# The numerical-equivalence tests again on OpenBLAS's generic kernels (Prescott: safe on any
# x86-64), so that a tolerance fitted to this CPU's kernels fails here rather than elsewhere.
# Never a faster core type: on some processors older OpenBLAS builds crash or are wrong.
numerics=$("${BAZEL[@]}" query 'attr(tags, numerics, tests(//...))' 2>/dev/null)
echo "tests/run.sh: the numerical-equivalence tests again with OPENBLAS_CORETYPE=Prescott"
run_tests --test_env=OPENBLAS_CORETYPE=Prescott $numerics || failed_steps=$((failed_steps + 1))
count_cases $numerics

# The Docker stage (tests/docker/run.sh): the image, the compose cluster (train, a shard
# crash, a network cut) and the .deb in a fresh container. The image is the multi-stage
# build from the sources (about 6 minutes here); PSCLUSTER_DOCKER_PREBUILT=1 makes it from
# the binaries just built above instead (CPU, before the CUDA build below replaces them).
# It counts its cases as skipped, saying why, where no Docker engine can run.
# A stage script: its output logged, and its last line "NAME stage: P passed, F failed, S
# skipped" added to the counts (a stage without that line is a failure).
run_stage() {  # name script args...
  local name=$1 p f s; shift
  bash "$@" 2>&1 | tee -a /tmp/pscluster_test_run.log | tee "/tmp/pscluster_${name}_stage.log"
  if read -r p f s < <(sed -n "s/^$name stage: \([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped\$/\1 \2 \3/p" "/tmp/pscluster_${name}_stage.log"); then
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  else
    echo "$1 ended without its summary line"; failed=$((failed + 1))
  fi
}

docker_args=(--full-build)
[[ ${PSCLUSTER_DOCKER_PREBUILT:-0} == 1 ]] && docker_args=(--bin-dir "$("${BAZEL[@]}" info bazel-bin 2>/dev/null)")
run_stage docker tests/docker/run.sh "${docker_args[@]}"

# Faults between hosts in network namespaces (tests/netem/run.sh): training through a link
# with latency and loss. Its cases count as skipped, saying why, where namespaces cannot be made.
run_stage netem tests/netem/run.sh "$("${BAZEL[@]}" info bazel-bin 2>/dev/null)"

# The Python examples as a user runs them, small (tests/examples/run.sh): each trains through
# a local cluster of its own and must learn something and clean up after itself.
run_stage examples tests/examples/run.sh "$("${BAZEL[@]}" info bazel-bin 2>/dev/null)"

# Every relative link in README.md, docs/ and bench/ names a file (and heading) that exists.
run_stage docs_links tests/docs_links.sh

# The fuzz targets under libFuzzer (bench/fuzz.sh builds them with clang in an output base
# of their own): 20000 inputs each from the checked-in seeds with a fixed seed, at most
# 60 s; each target that gets through without a crash is a case. The fresh-machine stage
# asks for fewer (PSCLUSTER_CI_FUZZ_RUNS, _SECONDS): there the build is what it checks.
rm -rf /tmp/pscluster_fuzz_ci
PSCLUSTER_FUZZ_SEED=1 PSCLUSTER_FUZZ_RUNS=${PSCLUSTER_CI_FUZZ_RUNS:-20000} \
  bash bench/fuzz.sh "${PSCLUSTER_CI_FUZZ_SECONDS:-60}" /tmp/pscluster_fuzz_ci 2>&1 | tee -a /tmp/pscluster_test_run.log | tee /tmp/pscluster_fuzz_stage.log
fuzz_ok=$(grep -cE '^[a-z_]+_fuzzer +[0-9]+ .* ok$' /tmp/pscluster_fuzz_stage.log || true)
fuzz_bad=$(grep -cE '^[a-z_]+_fuzzer .*CRASHED' /tmp/pscluster_fuzz_stage.log || true)
passed=$((passed + fuzz_ok)); failed=$((failed + fuzz_bad))
if grep -q '^fuzz: .* build failed$' /tmp/pscluster_fuzz_stage.log; then
  echo "tests/run.sh: the fuzz targets did not build (the compiler's errors are above)"; failed=$((failed + 1))
elif ((fuzz_ok + fuzz_bad != 4)); then
  echo "bench/fuzz.sh did not report its 4 targets"; failed=$((failed + 1))
fi

if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "tests/run.sh: nvcc found: building and testing --config=cuda"
  "${BAZEL[@]}" build --config=cuda //... >>/tmp/pscluster_test_run.log 2>&1 \
    || { echo "bazel build --config=cuda //... FAILED (see /tmp/pscluster_test_run.log)"; failed_steps=$((failed_steps + 1)); }
  gpu_tests=$("${BAZEL[@]}" query 'attr(tags, gpu, tests(//...))' 2>/dev/null)
  run_tests --config=cuda --test_output=all $gpu_tests || failed_steps=$((failed_steps + 1))
  count_cases $gpu_tests
else
  echo "tests/run.sh: no nvcc at /usr/local/cuda/bin: CUDA targets not built"
fi

if ((failed == 0 && failed_steps > 0)); then failed=$failed_steps; fi
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
((failed == 0 && failed_steps == 0))
