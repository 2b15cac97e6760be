#!/usr/bin/env bash
# The main job: a local pscluster training the MLP on Fashion-MNIST.
#
#   deploy/local_cluster.sh [--workers N] [--shards N] [--epochs N] [--consistency bsp|ssp:S|asp]
#                           [--mode ps|allreduce|fsdp|pipeline|tensor] [--switch "STEP:MODE,..."]
#                           [--micro_batches M] [--optimizer adam] [--lr 0.001]
#                           [--batch_size 64] [--model mlp|embedding|gpt] [--metrics on|off]
#                           [--tls on|off] [--tokens on|off] [--replicas 1|2|3]
#                           [--worker_args "ARGS"] [--out DIR] [--bin BIN]
#   deploy/local_cluster.sh --workers 0 [--shards N] [--run "COMMAND"] [--out DIR]
#
# Installs what is missing (Debian packages, as root), builds, starts a coordinator, the
# shards and the workers on free loopback ports, prints progress, and ends with the test
# accuracy. --model gpt trains a byte-level transformer on Debian's fortunes instead (the
# test loss in bits per byte); --worker_args passes more ps_worker flags (--gpt_layers=2).
# --bin BIN: no build; the binaries under BIN, in bazel-bin's layout (a copy of another
# commit's bazel-bin, to compare two builds side by side).
# DIR (default runs/<timestamp>) gets summary.json, loss.png, accuracy.png, prometheus.yml
# (every process serves metrics), every process's log and the shards'
# snapshots. Every process it started is stopped on exit, on Ctrl-C, or when one fails.
# The coordinator checkpoints every shard every epoch's worth of steps and whenever the
# test accuracy improves (in every mode: the collective modes write their state into the
# shards at each epoch's end); a shard or worker that dies is restarted and training rolls
# back to the last checkpoint. --switch schedules live mode switches (psctl switch-mode
# --at_step) before training starts; summary.json records each one.
# Tokens (default on): a cluster token and an admin token of this run's own, in DIR/tokens
# (readable by you alone). Every process checks the cluster token on every call and the
# admin token on admin calls (the built-in workers and the coordinator hold it); without
# TLS they serve and dial loopback only. psctl takes them with --flagfile=DIR/psctl.flags.
# --tokens off: plaintext and no tokens, open to anyone who reaches the ports.
# --tls on: a private CA and a certificate in DIR/tls too (deploy/make_certs.sh), and TLS
# on every connection. --run's command gets PSCLUSTER_TOKEN_FILE (and with TLS
# PSCLUSTER_TLS_CA, PSCLUSTER_TLS_CERT, PSCLUSTER_TLS_KEY), which pscluster.connect() uses.
# --replicas R keeps R copies of every shard, chain-replicated: a replica that dies is
# taken out of its chain by the coordinator and training goes on without a rollback; it
# is restarted and joins its chain again by a state transfer from the chain's tail.
# --workers 0 starts no built-in workers: a cluster for clients of your own (the Python
# client, pscluster.torch). It serves until Ctrl-C, or, with --run, runs COMMAND (with
# PSCLUSTER_COORDINATOR set to the coordinator's address) and stops when it exits, with
# its exit status. DIR/coordinator.address holds the address either way.
set -euo pipefail
cd "$(dirname "$0")/.."

workers=2 shards=2 epochs=10 consistency=bsp optimizer=adam lr=0.001 batch_size=64 mode=ps
switches="" micro_batches=4 model=mlp run="" metrics=on tls=off tokens=on replicas=1 worker_args= bin=
out="runs/$(date +%Y%m%d-%H%M%S)"
usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while (($#)); do
  case $1 in
    --workers) workers=$2; shift 2 ;;
    --shards) shards=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --consistency) consistency=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --switch) switches=$2; shift 2 ;;
    --micro_batches) micro_batches=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --optimizer) optimizer=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --batch_size) batch_size=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --run) run=$2; shift 2 ;;
    --metrics) metrics=$2; shift 2 ;;
    --tls) tls=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --replicas) replicas=$2; shift 2 ;;
    --worker_args) worker_args=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "local_cluster.sh: unknown argument '$1'" >&2; usage 2 ;;
  esac
done
modes_re='^(ps|allreduce|fsdp|pipeline|tensor)$'
[[ $mode =~ $modes_re ]] || { echo "local_cluster.sh: --mode must be ps, allreduce, fsdp, pipeline or tensor" >&2; exit 2; }
if [[ -n $switches ]]; then
  IFS=, read -r -a switch_list <<<"$switches"
  for sw in "${switch_list[@]}"; do
    [[ $sw =~ ^[1-9][0-9]*:(ps|allreduce|fsdp|pipeline|tensor)$ ]] \
      || { echo "local_cluster.sh: --switch entry '$sw' is not STEP:MODE (MODE: ps, allreduce, fsdp, pipeline, tensor)" >&2; exit 2; }
  done
fi
[[ $shards =~ ^[0-9]+$ ]] || { echo "local_cluster.sh: --shards '$shards' is not a count" >&2; exit 2; }
[[ $replicas =~ ^[123]$ ]] || { echo "local_cluster.sh: --replicas must be 1, 2 or 3" >&2; exit 2; }
ps_re='(^|,)[0-9]+:ps(,|$)'
if ((shards == 0)) && { [[ $mode == ps ]] || [[ $switches =~ $ps_re ]]; }; then
  echo "local_cluster.sh: ps mode needs --shards >= 1" >&2; exit 2
fi
[[ $workers =~ ^[0-9]+$ ]] || { echo "local_cluster.sh: --workers '$workers' is not a count" >&2; exit 2; }
if ((workers == 0 && shards == 0)); then
  echo "local_cluster.sh: --workers 0 needs --shards >= 1 (a cluster for your own clients)" >&2; exit 2
fi
[[ $metrics =~ ^(on|off)$ ]] || { echo "local_cluster.sh: --metrics must be on or off" >&2; exit 2; }
[[ $tls =~ ^(on|off)$ ]] || { echo "local_cluster.sh: --tls must be on or off" >&2; exit 2; }
[[ $tokens =~ ^(on|off)$ ]] || { echo "local_cluster.sh: --tokens must be on or off" >&2; exit 2; }
[[ $tls == off || $tokens == on ]] || { echo "local_cluster.sh: --tls on comes with tokens (drop --tokens off)" >&2; exit 2; }
# Metrics endpoints and the status page on free ports (-1), or none (0).
any_port=$([[ $metrics == on ]] && echo -1 || echo 0)
[[ -z $run ]] || ((workers == 0)) || { echo "local_cluster.sh: --run goes with --workers 0" >&2; exit 2; }
for n in "$epochs" "$batch_size" "$micro_batches"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "local_cluster.sh: '$n' is not a positive count" >&2; exit 2; }
done

deploy/install_deps.sh --plots
# The binaries this script runs, as paths under bazel-bin (and so as Bazel targets).
binaries=(server/coordinator/ps_coordinator server/ps/ps_server worker/ps_worker tools/psctl/psctl)
if [[ -n $bin ]]; then
  [[ -d $bin ]] || { echo "local_cluster.sh: --bin: no folder $bin" >&2; exit 2; }
  bin=$(cd "$bin" && pwd)
  for b in "${binaries[@]}"; do
    [[ -x $bin/$b ]] || { echo "local_cluster.sh: --bin: no $bin/$b" >&2; exit 2; }
  done
else
  echo "== building (bazel -c opt)"
  targets=()
  for b in "${binaries[@]}"; do targets+=("//${b%/*}:${b##*/}"); done
  bazel build -c opt "${targets[@]}" //python:pscluster 2>&1 | tail -n 2
  bin=$(bazel info -c opt bazel-bin 2>/dev/null)
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
echo "== run directory: $out"
# Every process's TLS and token flags (none with --tokens off), and psctl's in a flag file.
sec=() tokens_dir=$out/tokens
if [[ $tls == on ]]; then
  deploy/make_certs.sh "$out/tls" localhost 127.0.0.1 >/dev/null
  sec=(--tls_ca="$out/tls/ca.pem" --tls_cert="$out/tls/node.pem" --tls_key="$out/tls/node.key")
  tokens_dir=$out/tls
  echo "== TLS and tokens on: certificates and tokens in $out/tls"
elif [[ $tokens == on ]]; then
  (umask 077 && mkdir -p "$tokens_dir" \
    && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$tokens_dir/cluster.token" \
    && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$tokens_dir/admin.token")
  echo "== tokens on (loopback only, no TLS): $tokens_dir; psctl --flagfile=$out/psctl.flags"
fi
[[ $tokens == on ]] && sec+=(--token_file="$tokens_dir/cluster.token" --admin_token_file="$tokens_dir/admin.token")
# psctl's flags: operators act as the admin (checkpoint, restore, switch-mode).
printf '%s\n' ${sec[@]+"${sec[@]}"} | grep -v -e '--token_file=' -e '--tls_key=' -e '--tls_cert=' >"$out/psctl.flags" || true

pids=() names=()
# The members first and the coordinator once they are gone: a shard that outlives it logs
# its heartbeats failing, which reads as a fault at the end of a clean run.
cleanup() {
  local members=()
  for i in "${!pids[@]}"; do
    [[ -z ${pids[$i]} || ${names[$i]} == coordinator ]] && continue
    kill "${pids[$i]}" 2>/dev/null && members+=("${pids[$i]}")
  done
  ((${#members[@]})) && wait "${members[@]}" 2>/dev/null
  for i in "${!pids[@]}"; do
    [[ -n ${pids[$i]} && ${names[$i]} == coordinator ]] && kill "${pids[$i]}" 2>/dev/null
  done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'echo; echo "local_cluster.sh: interrupted, stopping every process"; exit 130' INT TERM

# Fails naming the process, its exit status and the end of its log.
die_with() {
  echo "local_cluster.sh: $1 failed ($2); last lines of $out/$1.log:" >&2
  tail -n 15 "$out/$1.log" >&2
  exit 1
}

# An address a process prints in its log: what follows PREFIX on the first line holding it,
# up to TERMINATOR. Waits for it (60 s at most); the run stops if the process exits first.
await_address() {  # name index prefix terminator what-it-waits-for
  local line t
  for ((t = 0; t < 600; ++t)); do
    line=$(grep -m1 -F "$3" "$out/$1.log" 2>/dev/null || true)
    [[ -n $line ]] && { line=${line##*"$3"}; echo "${line%%"$4"*}"; return; }
    kill -0 "${pids[$2]}" 2>/dev/null || die_with "$1" "exited at start-up"
    sleep 0.1
  done
  die_with "$1" "did not $5 within 60 s"
}
# Where it serves ("... listening on HOST:PORT"), and its Prometheus endpoint's host:port.
address_of() { await_address "$1" "$2" "listening on " " " "start serving"; }
metrics_of() { await_address "$1" "$2" "metrics on http://" "/" "serve metrics"; }

start=$(date +%s)
# Cluster checkpoints: every epoch's worth of steps and whenever the test accuracy improves.
# Its state (members, switch schedule, manifest) lives in --data_dir: a restart on the same
# port continues where it stopped.
start_coordinator() {  # port [metrics port]
  "$bin/server/coordinator/ps_coordinator" --port="$1" --num_shards="$shards" --num_workers="$workers" \
    --replicas="$replicas" \
    --mode="$mode" --data_dir="$out/coordinator" --http_port="$any_port" --metrics_port="${2:-$any_port}" \
    --checkpoint_every_steps=$((workers > 0 ? 60000 / (workers * batch_size) : 0)) \
    ${sec[@]+"${sec[@]}"} >>"$out/coordinator.log" 2>&1 &
}
start_coordinator 0
pids+=($!) names+=("coordinator")
coordinator=$(address_of coordinator 0)
page=""
[[ $metrics == on ]] && page="; status page: $(grep -m1 -o 'http://[^ ]*/$' "$out/coordinator.log")"
echo "== coordinator: $coordinator$page"
for sw in ${switch_list[@]+"${switch_list[@]}"}; do
  "$bin/tools/psctl/psctl" --coordinator="$coordinator" ${sec[@]+"${sec[@]}"} switch-mode --mode="${sw#*:}" --at_step="${sw%%:*}" \
    || { echo "local_cluster.sh: scheduling the switch $sw failed" >&2; exit 1; }
done
# Replica r > 0 of shard s is "shard<s>-r<r>" (its log, and in messages).
for ((s = 0; s < shards; ++s)); do
  for ((r = 0; r < replicas; ++r)); do
    name=shard$s; ((r > 0)) && name=shard$s-r$r
    "$bin/server/ps/ps_server" --port=0 --shard_id=$s --num_shards="$shards" --replica=$r \
      --coordinator="$coordinator" --data_dir="$out/checkpoints" --metrics_port="$any_port" \
      ${sec[@]+"${sec[@]}"} >"$out/$name.log" 2>&1 &
    pids+=($!) names+=("$name")
  done
done
addresses=()
for ((i = 1; i <= shards * replicas; ++i)); do addresses+=("$(address_of "${names[$i]}" "$i")"); done
((shards > 0)) && echo "== $shards shard(s)$( ((replicas > 1)) && echo " x $replicas replicas"): ${addresses[*]}"

start_worker() {  # rank [metrics port]
  "$bin/worker/ps_worker" --coordinator="$coordinator" --rank="$1" --world="$workers" --epochs="$epochs" \
    --consistency="$consistency" --optimizer="$optimizer" --lr="$lr" --batch_size="$batch_size" \
    --micro_batches="$micro_batches" --model="$model" --summary_json="$out/worker$1.json" --steps_file="$out/worker$1.steps.jsonl" \
    --metrics_port="${2:-$any_port}" --progress_every=1s ${sec[@]+"${sec[@]}"} $worker_args \
    >>"$out/worker$1.log" 2>&1 &
}
echo "$coordinator" >"$out/coordinator.address"
for ((r = 0; r < workers; ++r)); do
  start_worker $r
  pids+=($!) names+=("worker$r")
done
# Every process serves Prometheus metrics on a free port: a scrape config for them all.
# A process restarted below serves them on the same port again.
targets=() metrics_ports=()
for i in "${!names[@]}"; do
  [[ $metrics == on ]] || { metrics_ports[$i]=0; continue; }
  targets+=("'$(metrics_of "${names[$i]}" "$i")'")
  metrics_ports[$i]=${targets[-1]##*:}; metrics_ports[$i]=${metrics_ports[$i]%\'}
done
[[ $metrics == on ]] && printf 'scrape_configs:\n- job_name: pscluster\n  scrape_interval: 5s\n  static_configs:\n  - targets: [%s]\n' \
  "$(IFS=,; echo "${targets[*]}")" >"$out/prometheus.yml"
[[ $metrics == on ]] && echo "== metrics of every process: prometheus --config.file=$out/prometheus.yml"
tail_pid=""
if ((workers > 0)); then
  echo "== $workers worker(s) training $epochs epoch(s) in $mode mode, $optimizer lr=$lr (progress of worker 0):"
  tail -n +1 -f "$out/worker0.log" & tail_pid=$!
elif [[ -n $run ]]; then
  echo "== running: $run"
  [[ $tokens == on ]] && export PSCLUSTER_TOKEN_FILE=$tokens_dir/admin.token
  if [[ $tls == on ]]; then
    export PSCLUSTER_TLS_CA=$out/tls/ca.pem PSCLUSTER_TLS_CERT=$out/tls/node.pem \
      PSCLUSTER_TLS_KEY=$out/tls/node.key
  fi
  PSCLUSTER_COORDINATOR=$coordinator PYTHONPATH="$PWD/python:$bin/python${PYTHONPATH:+:$PYTHONPATH}" bash -c "$run" > >(tee -a "$out/run.log") 2>&1 &
  pids+=($!) names+=("run")
else
  echo "== no built-in workers; the cluster serves until Ctrl-C. Train through it with e.g."
  env_line=""
  [[ $tokens == on ]] && env_line="PSCLUSTER_TOKEN_FILE=$tokens_dir/admin.token "
  [[ $tls == on ]] && env_line+="PSCLUSTER_TLS_CA=$out/tls/ca.pem "
  echo "     $env_line/usr/bin/python3 examples/train_fashion_mnist.py --coordinator $coordinator"
fi

# Wait for the workers (or --run's command); any process that dies early stops the run.
remaining=1 restarts=0 run_status=0
while ((remaining > 0)); do
  remaining=0
  ((workers == 0)) && [[ -z $run ]] && remaining=1  # serve until interrupted
  for i in "${!pids[@]}"; do
    [[ -n ${pids[$i]} ]] || continue
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      [[ ${names[$i]} == worker* || ${names[$i]} == run ]] && remaining=$((remaining + 1))
      continue
    fi
    status=0; wait "${pids[$i]}" || status=$?
    pids[$i]=""
    if [[ ${names[$i]} == shard* ]] && ((replicas > 1 && restarts < 3)); then
      # Its chain went on without it; the restarted replica joins it again by a state
      # transfer from the chain's tail, while training goes on.
      name=${names[$i]} s=${name#shard}; s=${s%-r*} r=0
      [[ $name == *-r* ]] && r=${name##*-r}
      restarts=$((restarts + 1))
      echo "== $name died (exit status $status); restarting it: it joins its chain again"
      "$bin/server/ps/ps_server" --port=0 --shard_id="$s" --num_shards="$shards" --replica="$r" \
        --coordinator="$coordinator" --data_dir="$out/checkpoints" \
        --metrics_port="${metrics_ports[$i]}" ${sec[@]+"${sec[@]}"} >>"$out/$name.log" 2>&1 &
      pids[$i]=$!
      continue
    fi
    if [[ ${names[$i]} == shard* ]] && ((restarts < 3)); then
      # The launcher's part of recovery: bring the shard back from its last checkpoint;
      # the workers wait for it, roll every shard back to that checkpoint and go on.
      s=${names[$i]#shard}; restarts=$((restarts + 1))
      echo "== ${names[$i]} died (exit status $status); restarting it with --restore=latest"
      "$bin/server/ps/ps_server" --port=0 --shard_id="$s" --num_shards="$shards" \
        --coordinator="$coordinator" --data_dir="$out/checkpoints" --restore=latest \
        --metrics_port="${metrics_ports[$i]}" ${sec[@]+"${sec[@]}"} \
        >>"$out/${names[$i]}.log" 2>&1 &
      pids[$i]=$!
      continue
    fi
    if [[ ${names[$i]} == coordinator ]] && ((restarts < 3)); then
      # The members keep retrying; the coordinator comes back on its port with its state.
      restarts=$((restarts + 1))
      echo "== coordinator died (exit status $status); restarting it on ${coordinator##*:}"
      start_coordinator "${coordinator##*:}" "${metrics_ports[$i]}"
      pids[$i]=$!
      continue
    fi
    if [[ ${names[$i]} == worker* ]] && ((status >= 128 && restarts < 3)); then
      # Killed by a signal: start a replacement with the same rank; it joins the others'
      # rollback to the last checkpoint.
      restarts=$((restarts + 1))
      echo "== ${names[$i]} was killed (exit status $status); starting a replacement"
      start_worker "${names[$i]#worker}" "${metrics_ports[$i]}"
      pids[$i]=$!
      remaining=$((remaining + 1))
      continue
    fi
    if [[ ${names[$i]} == run ]]; then
      run_status=$status
      continue
    fi
    if [[ ${names[$i]} != worker* || $status -ne 0 ]]; then
      [[ -n $tail_pid ]] && kill "$tail_pid" 2>/dev/null
      die_with "${names[$i]}" "exit status $status"
    fi
  done
  ((remaining > 0)) && sleep 0.5
done
[[ -n $tail_pid ]] && kill "$tail_pid" 2>/dev/null
wall=$(( $(date +%s) - start ))
if ((workers == 0)); then
  echo "== '$run' exited with status $run_status after ${wall} s; logs in $out"
  exit "$run_status"
fi

# loss.png and accuracy.png from the workers' logs (deploy/plot_run.py, with Debian's
# python3-matplotlib); the run has succeeded either way, so a failure only warns.
plots=$(/usr/bin/python3 deploy/plot_run.py "$out") \
  || echo "local_cluster.sh: warning: deploy/plot_run.py failed (matplotlib: apt-get install" \
          "python3-matplotlib); the run itself succeeded" >&2
# summary.json: rank 0's figures, every worker's rollbacks, the plots (deploy/summarize.py).
python3 deploy/summarize.py "$out" "$workers" "$shards" "$epochs" "$consistency" "$wall" "$mode" \
  "$micro_batches" "$plots"
