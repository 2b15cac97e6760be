#!/usr/bin/env bash
# Install test of the pscluster .deb. Runs INSIDE a fresh Debian 12 container, as root, with
# network access to Debian's archive (apt):
#
#   docker run --rm --network=host -v "$PWD/deploy:/src:ro" -v /path/to/out:/pkg debian:bookworm \
#     bash /src/debian/install_test.sh /pkg/pscluster_0.2.0_amd64.deb
#
# Installs the package (apt pulls its Depends and Recommends), checks what the maintainer
# scripts made and what was installed, runs systemd-analyze verify on the units, then starts
# the daemons the way the units do (each unit's ExecStart, %i substituted, as its User=, in
# its WorkingDirectory=) with the shipped confs: a coordinator, shards 0 and 1, workers 0
# and 1 with --epochs=1 added. Both workers must exit 0 and report a test accuracy; then a
# killed shard restarted from its unit's command line must restore its snapshot.
# Prints PASS/FAIL lines; exits non-zero on the first failure. Every wait is bounded and
# every process started is killed at the end.
set -euo pipefail

deb=${1:-}
[[ -n $deb && -f $deb ]] || { echo "usage: install_test.sh PATH/TO/pscluster_VERSION_amd64.deb" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "install_test.sh: run as root (inside a throwaway container)" >&2; exit 2; }
deb=$(cd "$(dirname "$deb")" && pwd)/$(basename "$deb")

units=/lib/systemd/system
state=/var/lib/pscluster
min_accuracy=0.80  # one epoch of the MLP gives about 0.85
logs=$(mktemp -d /tmp/pscluster-install-test.XXXXXX)
declare -A pid_of=()     # name -> pid of the daemon itself
declare -A runner_of=()  # name -> pid of the runuser that started it

pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; exit 1; }

cleanup() {
  local status=$? name t
  for name in "${!pid_of[@]}"; do kill -TERM "${pid_of[$name]}" 2>/dev/null || true; done
  for ((t = 0; t < 100; ++t)); do  # up to 10 s for a clean stop, then SIGKILL
    local alive=0
    for name in "${!pid_of[@]}"; do kill -0 "${pid_of[$name]}" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for name in "${!pid_of[@]}"; do kill -KILL "${pid_of[$name]}" 2>/dev/null || true; done
  for name in "${!runner_of[@]}"; do
    kill -KILL "${runner_of[$name]}" 2>/dev/null || true
    wait "${runner_of[$name]}" 2>/dev/null || true
  done
  if ((status != 0)); then
    for log in "$logs"/*.log; do
      [[ -f $log ]] || continue
      echo "---- last lines of $(basename "$log") ----"
      tail -n 20 "$log"
    done
  fi
  rm -rf "$logs"
  exit "$status"
}
trap cleanup EXIT
trap 'echo "FAIL: interrupted"; exit 130' INT TERM

# --- installation -------------------------------------------------------------------------
export DEBIAN_FRONTEND=noninteractive
timeout 300 apt-get update -q >"$logs/apt.log" 2>&1 \
  || fail "apt-get update (bounded to 300 s; see apt.log)"
timeout 900 apt-get install -y -q -o APT::Install-Recommends=true "$deb" systemd \
  >>"$logs/apt.log" 2>&1 || fail "apt-get install of $deb and systemd (bounded to 900 s; see apt.log)"
[[ $(dpkg-query -W -f='${Status}' pscluster) == "install ok installed" ]] \
  || fail "pscluster is not installed after apt-get install"
pass "installed $(dpkg-query -W -f='${Package} ${Version}' pscluster) with its Depends"
dpkg-query -W -f='${Status}' dataset-fashion-mnist 2>/dev/null | grep -q "install ok installed" \
  || fail "the Recommends dataset-fashion-mnist was not installed"
pass "Recommends dataset-fashion-mnist installed"

# --- what postinst made ----------------------------------------------------------------------
IFS=: read -r _ _ uid _ _ home shell < <(getent passwd pscluster) || fail "no user pscluster"
getent group pscluster >/dev/null || fail "no group pscluster"
((uid < 1000)) || fail "pscluster is not a system user (uid $uid)"
[[ $home == "$state" && $shell == /usr/sbin/nologin ]] \
  || fail "user pscluster has home '$home' and shell '$shell'"
pass "system user and group pscluster (uid $uid, home $home, shell $shell)"
for dir in "$state" "$state/checkpoints" "$state/coordinator"; do
  [[ -d $dir && $(stat -c %U:%G "$dir") == pscluster:pscluster ]] \
    || fail "$dir missing or not owned by pscluster:pscluster"
done
pass "$state, checkpoints/ and coordinator/ owned by pscluster"

# --- what was installed ---------------------------------------------------------------------
for f in /usr/bin/ps_coordinator /usr/bin/ps_server /usr/bin/ps_worker /usr/bin/psctl; do
  [[ $(stat -c %a "$f") == 755 ]] || fail "$f has mode $(stat -c %a "$f"), not 755"
  if ldd "$f" | grep -q "not found"; then fail "$f: $(ldd "$f" | grep "not found" | tr -s '\t\n' '  ')"; fi
done
pass "the 4 binaries are mode 755 and every library they need is installed"
[[ $(stat -c %a /usr/bin/pscluster-make-certs 2>/dev/null) == 755 ]] \
  || fail "/usr/bin/pscluster-make-certs missing or not mode 755"
pass "pscluster-make-certs installed"
for f in "$units"/pscluster-coordinator.service "$units"/pscluster-ps@.service \
         "$units"/pscluster-worker@.service "$units"/pscluster.target \
         /etc/pscluster/{coordinator,ps,worker}.conf /usr/share/doc/pscluster/README.Debian; do
  [[ -f $f && $(stat -c %a "$f") == 644 ]] || fail "$f missing or not mode 644"
done
pass "units, confs and README.Debian present, mode 644"
conffiles=$(dpkg-query -W -f='${Conffiles}\n' pscluster | awk 'NF {print $1}' | sort | tr '\n' ' ')
[[ $conffiles == "/etc/pscluster/coordinator.conf /etc/pscluster/ps.conf /etc/pscluster/worker.conf " ]] \
  || fail "conffiles are '$conffiles'"
pass "conffiles: $conffiles"
for unit in pscluster-coordinator.service pscluster-ps@0.service pscluster-worker@0.service; do
  [[ ! -e /etc/systemd/system/multi-user.target.wants/$unit ]] || fail "$unit was enabled by the installation"
done
pass "no unit enabled by the installation"

if ! timeout 60 systemd-analyze verify "$units"/pscluster-coordinator.service "$units"/pscluster-ps@.service \
    "$units"/pscluster-worker@.service "$units"/pscluster.target >"$logs/verify.log" 2>&1; then
  cat "$logs/verify.log"; fail "systemd-analyze verify of the units"
fi
sed 's/^/  systemd-analyze verify: /' "$logs/verify.log"
if grep -qi pscluster "$logs/verify.log"; then fail "systemd-analyze verify warns about the units"; fi
pass "systemd-analyze verify: no complaint about the pscluster units ($(wc -l <"$logs/verify.log") line(s) of output)"

# --- the daemons, started as the units start them ----------------------------------------------
# unit_key UNIT KEY: the value of KEY= in the installed unit.
unit_key() { sed -n "s/^$2=//p" "$units/$1" | tail -n 1; }

# start NAME UNIT INSTANCE [EXTRA FLAGS...]: the unit's ExecStart (%i -> INSTANCE) as its User=,
# in its WorkingDirectory=, output to $logs/NAME.log.
start() {
  local name=$1 unit=$2 instance=$3
  shift 3
  local cmd user dir
  cmd=$(unit_key "$unit" ExecStart)
  user=$(unit_key "$unit" User)
  dir=$(unit_key "$unit" WorkingDirectory)
  [[ $cmd == /* ]] || fail "$unit: ExecStart '$cmd' is not a plain absolute command line"
  cmd=${cmd//%i/$instance}
  [[ $cmd != *%* ]] || fail "$unit: ExecStart has a specifier this test does not substitute: $cmd"
  [[ $user == pscluster ]] || fail "$unit runs as User='$user', not pscluster"
  local -a argv
  read -r -a argv <<<"$cmd"
  : >"$logs/$name.pid"
  # The shell writes its own pid (the daemon's, after exec) to fd 3, opened here as root.
  (cd "${dir:-/}" && exec runuser -u "$user" -- sh -c 'echo $$ >&3; exec 3>&-; exec "$@"' sh \
     "${argv[@]}" "$@") 3>"$logs/$name.pid" >"$logs/$name.log" 2>&1 &
  runner_of[$name]=$!
  local t
  for ((t = 0; t < 100; ++t)); do [[ -s $logs/$name.pid ]] && break; sleep 0.1; done
  [[ -s $logs/$name.pid ]] || fail "timed out after 10 s waiting for $name ($unit) to start"
  pid_of[$name]=$(<"$logs/$name.pid")
  echo "started $name: ${argv[*]} $*"
}

# wait_for NAME REGEX SECONDS WHAT: until NAME's log matches, failing if NAME exits first.
wait_for() {
  local name=$1 regex=$2 seconds=$3 what=$4 t
  for ((t = 0; t < seconds * 10; ++t)); do
    grep -qE "$regex" "$logs/$name.log" && return 0
    kill -0 "${pid_of[$name]}" 2>/dev/null || fail "$name exited while waiting for $what"
    sleep 0.1
  done
  fail "timed out after $seconds s waiting for $what"
}

start coordinator pscluster-coordinator.service ""
wait_for coordinator "listening on 127\.0\.0\.1:4000 " 30 "the coordinator to listen on 127.0.0.1:4000"
pass "coordinator listening on 127.0.0.1:4000 (coordinator.conf defaults)"
start shard0 pscluster-ps@.service 0
start shard1 pscluster-ps@.service 1
for s in 0 1; do
  wait_for "shard$s" "shard $s/2 listening on" 30 "shard $s to listen"
  wait_for "shard$s" "registered with the coordinator" 30 "shard $s to register at the coordinator"
done
pass "shards 0 and 1 listening on free ports, registered at the coordinator"

start worker0 pscluster-worker@.service 0 --epochs=1
start worker1 pscluster-worker@.service 1 --epochs=1
declare -A worker_status=()
for ((t = 0; t < 6000; ++t)); do  # up to 600 s for one epoch
  for r in 0 1; do
    [[ -n ${worker_status[$r]:-} ]] && continue
    kill -0 "${runner_of[worker$r]}" 2>/dev/null && continue
    status=0; wait "${runner_of[worker$r]}" || status=$?
    worker_status[$r]=$status
    unset "runner_of[worker$r]" "pid_of[worker$r]"
  done
  ((${#worker_status[@]} == 2)) && break
  for name in coordinator shard0 shard1; do
    kill -0 "${pid_of[$name]}" 2>/dev/null || fail "$name exited while the workers trained"
  done
  sleep 0.1
done
((${#worker_status[@]} == 2)) || fail "timed out after 600 s waiting for both workers to finish 1 epoch"
for r in 0 1; do
  ((worker_status[$r] == 0)) || fail "worker $r exited with status ${worker_status[$r]}"
  line=$(grep -E "(^| )worker $r: done: .*test accuracy [0-9.]+" "$logs/worker$r.log") \
    || fail "worker $r printed no 'done: ... test accuracy' line"
  accuracy=$(sed -E 's/.*test accuracy ([0-9.]+).*/\1/' <<<"$line")
  summary=$state/worker-$r.json
  [[ -f $summary && $(stat -c %U "$summary") == pscluster ]] || fail "worker $r wrote no $summary as pscluster"
  grep -q '"test_accuracy"' "$summary" || fail "$summary has no test_accuracy"
  awk -v a="$accuracy" -v m="$min_accuracy" 'BEGIN { exit !(a >= m) }' \
    || fail "worker $r: test accuracy $accuracy is below $min_accuracy after 1 epoch"
  pass "worker $r exited 0 after 1 epoch: test accuracy $accuracy ($line)"
done

# --- psctl reaches the coordinator ------------------------------------------------------------
status=0
timeout 30 runuser -u pscluster -- psctl --coordinator=127.0.0.1:4000 status >"$logs/psctl.log" 2>&1 || status=$?
((status == 0 || status == 1)) || { cat "$logs/psctl.log"; fail "psctl status exited $status (3: unreachable)"; }
pass "psctl status reaches the coordinator (exit $status)"

# --- the Python client, installed in dist-packages with its Recommends ------------------------
py_out=$(timeout 60 runuser -u pscluster -- /usr/bin/python3 -c '
import pscluster
c = pscluster.connect("127.0.0.1:4000", timeout=20)
print(pscluster.__file__, c.num_shards)' 2>&1) \
  || { echo "$py_out"; fail "the installed Python client cannot reach the coordinator"; }
[[ $py_out == "/usr/lib/python3/dist-packages/pscluster/__init__.py 2" ]] \
  || fail "import pscluster: expected the installed package and 2 shards, got '$py_out'"
pass "the installed Python client reads the cluster's view ($py_out)"

# --- a restarted shard comes back from its snapshot (the unit's --restore=latest) --------------
for ((t = 0; t < 300; ++t)); do
  compgen -G "$state/checkpoints/shard-1/*" >/dev/null && break
  sleep 0.1
done
compgen -G "$state/checkpoints/shard-1/*" >/dev/null \
  || fail "timed out after 30 s waiting for a snapshot under $state/checkpoints/shard-1"
kill -KILL "${pid_of[shard1]}"
wait "${runner_of[shard1]}" 2>/dev/null || true
unset "runner_of[shard1]" "pid_of[shard1]"
mv "$logs/shard1.log" "$logs/shard1-first.log"
start shard1 pscluster-ps@.service 1
wait_for shard1 "restored snapshot of step [0-9]+" 60 "the restarted shard 1 to restore its snapshot"
wait_for shard1 "shard 1/2 listening on" 30 "the restarted shard 1 to listen"
pass "killed shard 1 restarted by its unit's command line: $(grep -oE 'restored snapshot of step [0-9]+' "$logs/shard1.log")"

echo "PASS: all install checks"
