"""A cluster of real processes on this machine: a ps_coordinator and N ps_servers on free
loopback ports, for tests, examples and benchmarks.

    with pscluster.local.LocalCluster(num_shards=2) as local:
        cluster = pscluster.connect(local.coordinator)

The binaries are found in $PS_SERVER / $PS_COORDINATOR, else the repository's bazel-bin,
else PATH (the .deb installs them in /usr/bin).
"""
from __future__ import annotations

import os
import queue
import sys
import re
import shutil
import subprocess
import threading
import time
from typing import List, Optional, Sequence

START_TIMEOUT = 30.0  # seconds for a process to print what it prints once it serves
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_binary(name: str, env: str, bazel_path: str) -> str:
    """$env, else <repo>/bazel-bin/<bazel_path>, else `name` on PATH."""
    if os.environ.get(env):
        return os.environ[env]
    for candidate in (os.path.join(_REPO, "bazel-bin", bazel_path), bazel_path):
        if os.path.exists(candidate):
            return candidate
    found = shutil.which(name)
    if found:
        return found
    raise FileNotFoundError(
        f"{name} not found: set ${env}, or build it (bazel build -c opt //{os.path.dirname(bazel_path)}"
        f":{name}), or install the pscluster .deb")


class Process:
    """A child process whose stdout (with stderr) is read line by line on a thread."""

    def __init__(self, args: Sequence[str], log: Optional[str] = None):
        self.args = list(args)
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, bufsize=1)
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.seen: List[str] = []
        self._log = open(log, "a") if log else None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if self._log:
                self._log.write(line)
                self._log.flush()
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)  # end of output

    def wait_for(self, pattern: str, timeout: float = START_TIMEOUT) -> "re.Match[str]":
        """The first line (from now on) matching `pattern`, within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(0.0, left))
            except queue.Empty:
                line = ""
            if line is None or left <= 0:
                raise RuntimeError(
                    f"{os.path.basename(self.args[0])} did not print /{pattern}/ within "
                    f"{timeout} s (exit code {self.proc.poll()}); it printed:\n"
                    + "\n".join(self.seen[-40:]))
            self.seen.append(line)
            m = re.search(pattern, line)
            if m:
                return m

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()
        if self._log:
            self._log.close()


class LocalCluster:
    """A coordinator and `num_shards` shards registered with it, on free loopback ports.
    `num_workers` is what the coordinator expects of built-in workers (0: the cluster is
    complete once the shards are up; Python workers talk to the shards directly).
    `data_dir`: where shards keep snapshots and the coordinator its manifest (none: no
    snapshots). `log_dir`: every process's output, one file each. `replicas`: copies of
    each shard (ps_coordinator --replicas); replicas[i] are shard i's processes, head
    first, and replica_addresses[i] their addresses."""

    def __init__(self, num_shards: int = 2, num_workers: int = 0,
                 data_dir: Optional[str] = None, log_dir: Optional[str] = None,
                 shard_args: Sequence[str] = (), coordinator_args: Sequence[str] = (),
                 replicas: int = 1):
        self.processes: List[Process] = []
        self.log_dir = log_dir
        server = find_binary("ps_server", "PS_SERVER", "server/ps/ps_server")
        coordinator = find_binary("ps_coordinator", "PS_COORDINATOR",
                                  "server/coordinator/ps_coordinator")
        try:
            args = [coordinator, "--port=0", f"--num_shards={num_shards}",
                    f"--num_workers={num_workers}", f"--replicas={replicas}", *coordinator_args]
            if data_dir:
                args.append(f"--data_dir={data_dir}/coordinator")
            c = self._start("coordinator", args)
            self.coordinator = c.wait_for(r"listening on (\S+:\d+)").group(1)
            self.shards: List[Process] = []
            self.addresses: List[str] = []
            self.replicas: List[List[Process]] = []
            self.replica_addresses: List[List[str]] = []
            for i in range(num_shards):
                self.replicas.append([])
                self.replica_addresses.append([])
                for r in range(replicas):
                    args = [server, "--port=0", f"--shard_id={i}", f"--num_shards={num_shards}",
                            f"--replica={r}", f"--coordinator={self.coordinator}", *shard_args]
                    if data_dir:  # one root for all: each shard writes shard-<id>/ under it
                        args.append(f"--data_dir={data_dir}/shards")
                    shard = self._start(f"shard{i}" + (f"-r{r}" if r else ""), args)
                    address = shard.wait_for(r"listening on (\S+:\d+)").group(1)
                    shard.wait_for(r"registered with the coordinator")
                    self.replicas[-1].append(shard)
                    self.replica_addresses[-1].append(address)
                self.shards.append(self.replicas[-1][0])
                self.addresses.append(self.replica_addresses[-1][0])
        except BaseException:
            self.stop()
            raise

    def _start(self, name: str, args: List[str]) -> Process:
        log = os.path.join(self.log_dir, f"{name}.log") if self.log_dir else None
        p = Process(args, log)
        self.processes.append(p)
        return p

    def stop(self) -> None:
        for p in reversed(self.processes):
            p.kill()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def run_workers(script: str, argv: Sequence[str], num_workers: int, coordinator: str,
                out: str) -> bool:
    """Runs `num_workers` training processes, `python script *argv --coordinator C --out OUT
    --rank r`, until all have exited; the first that fails stops the others. Worker 0's
    output goes to this terminal, the others' to OUT/worker<r>.log. True when every worker
    exited 0; else says which one failed and where its output is."""
    procs: List[subprocess.Popen] = []
    logs = []
    try:
        for r in range(num_workers):
            log = None if r == 0 else open(os.path.join(out, f"worker{r}.log"), "w")
            logs += [log] if log else []
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(script), *argv, "--coordinator", coordinator,
                 "--out", out, "--rank", str(r)],
                stdout=log, stderr=subprocess.STDOUT if log else None))
        failed = None
        while failed is None and any(p.poll() is None for p in procs):
            failed = next((r for r, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            time.sleep(0.2)
        failed = next((r for r, p in enumerate(procs) if p.returncode), failed)
        if failed is not None:
            where = ("its output above" if failed == 0
                     else os.path.join(out, f"worker{failed}.log"))
            print(f"worker {failed} failed (exit status {procs[failed].returncode}); see "
                  f"{where}", flush=True)
            return False
        return True
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
