"""End-to-end tests of the Python client against a real ps_coordinator and two ps_servers.

Under Bazel (`bazel test //python:client_test`) the binaries come from the runfiles. Run
directly with the binaries' paths in PS_SERVER and PS_COORDINATOR, and the generated stubs
on PYTHONPATH, e.g.:

    bazel build //server/ps:ps_server //server/coordinator:ps_coordinator //python:pscluster
    PYTHONPATH=python:bazel-bin/python PS_SERVER=bazel-bin/server/ps/ps_server \
      PS_COORDINATOR=bazel-bin/server/coordinator/ps_coordinator \
      /usr/bin/python3 python/pscluster_test.py
"""
from __future__ import annotations

import os
import sys

# Bazel 4's py_test runs the first `python3` on PATH (its py3wrapper.sh), which need not be
# Debian's: the stubs come from Debian's protoc and need its python3-protobuf, python3-grpcio
# and python3-numpy. Start again under /usr/bin/python3 (the stub's PYTHONPATH carries over).
DEBIAN_PYTHON = "/usr/bin/python3"
if (os.path.exists(DEBIAN_PYTHON) and os.path.realpath(sys.executable) !=
        os.path.realpath(DEBIAN_PYTHON) and not os.environ.get("PSCLUSTER_TEST_REEXEC")):
    os.environ["PSCLUSTER_TEST_REEXEC"] = "1"
    os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])

import queue
import re
import subprocess
import threading
import time
import unittest
from typing import List, Optional

import grpc
import numpy as np

import pscluster
from proto import ps_pb2

PS_SERVER = os.environ.get("PS_SERVER", "server/ps/ps_server")
PS_COORDINATOR = os.environ.get("PS_COORDINATOR", "server/coordinator/ps_coordinator")
START_TIMEOUT = 30.0  # seconds for a process to print what it prints once it serves
RPC_TIMEOUT = 10.0
LR = 0.25


class Process:
    """A child process whose stdout (with stderr) is read line by line on a thread."""

    def __init__(self, args: List[str]):
        self.args = args
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, bufsize=1)
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.seen: List[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)  # end of output

    def wait_for(self, pattern: str, timeout: float = START_TIMEOUT) -> re.Match:
        """The first line (from now on) matching `pattern`, within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(0.0, left))
            except queue.Empty:
                line = ""
            if line is None or left <= 0:
                raise AssertionError(
                    f"{os.path.basename(self.args[0])} did not print /{pattern}/ within "
                    f"{timeout} s (exit code {self.proc.poll()}); it printed:\n"
                    + "\n".join(self.seen))
            self.seen.append(line)
            m = re.search(pattern, line)
            if m:
                return m

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


class LocalCluster:
    """A coordinator and `num_shards` shards registered with it, on free loopback ports."""

    def __init__(self, num_shards: int = 2):
        self.processes: List[Process] = []
        try:
            coordinator = self._start([PS_COORDINATOR, "--port=0", f"--num_shards={num_shards}",
                                       "--num_workers=1"])
            self.coordinator = coordinator.wait_for(r"listening on (\S+:\d+)").group(1)
            self.shards: List[Process] = []
            self.addresses: List[str] = []
            for i in range(num_shards):
                shard = self._start([PS_SERVER, "--port=0", f"--shard_id={i}",
                                     f"--num_shards={num_shards}",
                                     f"--coordinator={self.coordinator}"])
                self.addresses.append(shard.wait_for(r"listening on (\S+:\d+)").group(1))
                shard.wait_for(r"registered with the coordinator")
                self.shards.append(shard)
        except BaseException:
            self.stop()
            raise

    def _start(self, args: List[str]) -> Process:
        p = Process(args)
        self.processes.append(p)
        return p

    def stop(self) -> None:
        for p in reversed(self.processes):
            p.kill()


class DenseTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls) -> None:
        cls.local = LocalCluster(num_shards=2)
        try:
            cls.cluster = pscluster.connect(cls.local.coordinator, timeout=RPC_TIMEOUT)
        except BaseException:
            cls.local.stop()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls.cluster.close()
        cls.local.stop()

    def create(self, name: str, size: int) -> int:
        return self.cluster.create_dense(name, size, optimizer="sgd", learning_rate=LR,
                                         consistency="asp", initializer="uniform", scale=1.0,
                                         seed=7)

    def check_sgd(self, name: str, size: int) -> None:
        table = self.create(name, size)
        w0 = self.cluster.pull_dense(table, step=0)
        self.assertEqual(w0.dtype, np.float32)
        self.assertEqual(w0.shape, (size,))
        self.assertGreater(np.count_nonzero(w0), size // 2)  # the seeded initializer ran
        grad = np.random.default_rng(1).standard_normal(size, dtype=np.float32)
        self.cluster.push_dense(table, grad, step=0)
        w1 = self.cluster.pull_dense(table, step=1)
        np.testing.assert_array_equal(w1, w0 - np.float32(LR) * grad)

    def test_view_lists_the_shards(self) -> None:
        self.assertEqual(self.cluster.num_shards, 2)
        self.assertEqual(self.cluster.addresses, self.local.addresses)
        status = self.cluster.status()
        self.assertEqual(status["shard_addresses"], self.local.addresses)
        self.assertEqual(status["num_shards"], 2)
        shards = [m for m in status["members"] if m["role"] == "SHARD"]
        self.assertEqual([(m["id"], m["address"], m["alive"]) for m in shards],
                         [(0, self.local.addresses[0], True), (1, self.local.addresses[1], True)])
        self.assertIsInstance(status["version"], int)

    def test_shard_range_matches_the_servers(self) -> None:
        self.assertEqual(pscluster.shard_range(1001, 0, 2), (0, 500))
        self.assertEqual(pscluster.shard_range(1001, 1, 2), (500, 1001))
        table = self.create("ranges", 1001)
        for s, stub in enumerate(self.cluster._stubs):
            info = stub.DescribeTable(ps_pb2.DescribeTableRequest(table_id=table),
                                      timeout=RPC_TIMEOUT)
            self.assertEqual((info.shard_begin, info.shard_end),
                             pscluster.shard_range(1001, s, 2))

    def test_sgd_small(self) -> None:
        self.check_sgd("small", 1000)

    def test_sgd_large_streams_in_chunks(self) -> None:
        # 1.5 M floats (6 MB) per shard: more than ps_server's unary limit
        # (--max_chunk_bytes, 4 MiB), so it only works as streams of chunks.
        self.check_sgd("large", 3_000_000)

    def test_wrong_size_push_is_refused_and_changes_nothing(self) -> None:
        table = self.create("wrong_size", 1000)
        before = self.cluster.pull_dense(table)
        with self.assertRaises(pscluster.PsError) as e:
            self.cluster.push_dense(table, np.ones(999, dtype=np.float32))
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("1000", e.exception.message)
        self.assertIn("999", e.exception.message)
        with self.assertRaises(pscluster.PsError) as e:
            self.cluster.push_dense(table, np.ones(1000, dtype=np.float64))
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("float32", e.exception.message)
        np.testing.assert_array_equal(self.cluster.pull_dense(table), before)

    def test_server_refuses_a_wrong_range(self) -> None:
        # Past the client's checks: a shard asked for a range it does not hold.
        table = self.create("server_check", 1000)
        before = self.cluster.pull_dense(table)
        with self.assertRaises(pscluster.PsError) as e:
            self.cluster._call(1, lambda stub: stub.PushDense(ps_pb2.DenseChunk(
                table_id=table, offset=0, begin=0, total_length=10,
                data=np.ones(10, np.float32).tobytes()), timeout=RPC_TIMEOUT))
        self.assertEqual(e.exception.shard, 1)
        self.assertIn("shard 1", e.exception.message)
        self.assertEqual(e.exception.code, grpc.StatusCode.OUT_OF_RANGE)
        self.assertIn("outside this shard's range [500, 1000)", e.exception.message)
        np.testing.assert_array_equal(self.cluster.pull_dense(table), before)

    def test_unknown_table(self) -> None:
        with self.assertRaises(pscluster.PsError) as e:
            self.cluster.pull_dense(999_999)
        self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertIn("999999", e.exception.message)
        with self.assertRaises(pscluster.PsError) as e:
            self.cluster.push_dense(999_999, np.ones(3, dtype=np.float32))
        self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_unknown_optimizer(self) -> None:
        with self.assertRaises(pscluster.PsError) as e:
            self.cluster.create_dense("bad", 10, optimizer="rmsprop")
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("rmsprop", e.exception.message)


class DeadShardTest(unittest.TestCase):

    def test_dead_shard_is_unavailable_within_the_timeout(self) -> None:
        local = LocalCluster(num_shards=2)
        try:
            with pscluster.Cluster.from_shards(local.addresses, timeout=5.0) as cluster:
                table = cluster.create_dense("t", 1000, learning_rate=LR)
                before = cluster.pull_dense(table)
                local.shards[1].kill()
                start = time.monotonic()
                with self.assertRaises(pscluster.PsError) as e:
                    cluster.pull_dense(table, step=1)
                self.assertLess(time.monotonic() - start, 5.0 + 2.0)
                self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)
                self.assertEqual(e.exception.shard, 1)
                self.assertIn(f"shard 1 ({local.addresses[1]})", e.exception.message)
                with self.assertRaises(pscluster.PsError) as e:
                    cluster.push_dense(table, np.ones(1000, np.float32))
                self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)
                self.assertEqual(before.shape, (1000,))
        finally:
            local.stop()


if __name__ == "__main__":
    unittest.main()
