#!/usr/bin/env bash
# bench/fuzz.sh reports fuzz targets that did not build as a build failure, with the compiler's
# error, never as crashes: before, a missing compiler-rt made all four targets "CRASHED (exit
# 127)" and hid the compiler's message. Bazel and dpkg-query are fakes on PATH here: the fake
# build fails as clang does without libclang-rt-14-dev.
set -uo pipefail
fakes=$(mktemp -d) out=$(mktemp -d)
trap 'rm -rf "$fakes" "$out"' EXIT
cat >"$fakes/bazel" <<'FAKE'
#!/bin/sh
[ "$2" = build ] || { echo "fake bazel: only build is expected, got: $*" >&2; exit 3; }
echo "fuzz/ps_service_fuzzer.cc:12:10: fatal error: 'sanitizer/asan_interface.h' file not found"
echo "ERROR: /src/fuzz/BUILD.bazel:4:13: Compiling fuzz/ps_service_fuzzer.cc failed: (Exit 1)"
exit 1
FAKE
printf '#!/bin/sh\necho "install ok installed"\necho "install ok installed"\n' >"$fakes/dpkg-query"
chmod +x "$fakes/bazel" "$fakes/dpkg-query"

log=$(HOME=$fakes PATH="$fakes:$PATH" bash bench/fuzz.sh 1 "$out" 2>&1)
status=$?
echo "$log"
fail() { echo "FAIL: $*"; exit 1; }
((status == 2)) || fail "exit status $status, expected 2 (the targets did not build)"
grep -q "asan_interface.h' file not found" <<<"$log" || fail "the compiler's error is not shown"
grep -qx "fuzz: 4 targets, build failed" <<<"$log" || fail "no 'build failed' summary line"
! grep -q CRASHED <<<"$log" || fail "a target that never built is reported as crashed"
[[ $(ls "$out") == build.log ]] || fail "targets were run: $(ls "$out")"
echo "PASS"
