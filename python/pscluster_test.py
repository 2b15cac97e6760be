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

import contextlib
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

import socket
import subprocess
import tempfile
import threading
import time
import unittest
from typing import Dict, List, Tuple

import grpc
import numpy as np

import pscluster
from pscluster.local import LocalCluster, Process, find_binary
from pscluster.proto import coordinator_pb2, coordinator_pb2_grpc, ps_pb2

RPC_TIMEOUT = 10.0
# //python:client_pure_test runs this file with --pure: the dense calls on grpc-python.
PURE = "--pure" in sys.argv
if PURE:
    os.environ["PSCLUSTER_NATIVE"] = "0"

LR = 0.25
F32 = np.float32


class ClusterTestCase(unittest.TestCase):
    """One local cluster (coordinator + 2 shards) per test class."""
    num_shards = 2
    data_dir = False

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory(prefix="pscluster_test_")
        cls.local = LocalCluster(num_shards=cls.num_shards,
                                 data_dir=cls.tmp.name if cls.data_dir else None)
        try:
            cls.cluster = pscluster.connect(cls.local.coordinator, timeout=RPC_TIMEOUT)
        except BaseException:
            cls.local.stop()
            raise

    @classmethod
    def tearDownClass(cls) -> None:
        cls.cluster.close()
        cls.local.stop()
        cls.tmp.cleanup()


class ReplicatedTest(unittest.TestCase):
    """Shards of 2 chain-replicated replicas each."""

    @contextlib.contextmanager
    def replicated(self, num_shards: int, data_dir: bool = False, coordinator_args=()):
        """A local cluster of `num_shards` replicated shards, a client, and a 64-value ASP
        table on them (seeded)."""
        with tempfile.TemporaryDirectory(prefix="pscluster_replicated_") as tmp:
            local = LocalCluster(num_shards=num_shards, replicas=2, log_dir=tmp,
                                 data_dir=tmp if data_dir else None,
                                 coordinator_args=coordinator_args)
            try:
                with pscluster.connect(local.coordinator, timeout=RPC_TIMEOUT,
                                       wait_until_complete=True) as cluster:
                    table = cluster.create_dense("w", 64, optimizer="sgd", learning_rate=LR,
                                                 consistency="asp", initializer="uniform",
                                                 scale=1.0, seed=7)
                    yield local, cluster, table
            finally:
                local.stop()

    def test_push_after_the_head_is_killed_lands_once_on_the_new_head(self) -> None:
        """The client follows a failover of its head."""
        with self.replicated(1, coordinator_args=["--heartbeat_timeout_ms=600"]) as (
                local, cluster, table):
            w0 = cluster.pull_dense(table, step=0)
            g = np.random.default_rng(2).standard_normal((2, 64), dtype=np.float32)
            cluster.push_dense(table, g[0], step=0)
            local.replicas[0][0].kill()  # SIGKILL of the head
            cluster.push_dense(table, g[1], step=1)  # waits out the failover
            w2 = cluster.pull_dense(table, step=2)
            # The shard's SGD steps in float32, one push after the other.
            want = (w0 - np.float32(LR) * g[0]) - np.float32(LR) * g[1]
            np.testing.assert_array_equal(w2, want)
            if not cluster.native:  # (the C++ client keeps its own rotation)
                self.assertIn(local.replica_addresses[0][1], cluster._shards.name(0))

    def test_restore_returns_once_every_chain_is_whole_again(self) -> None:
        """A restore leaves each head alone while its backups copy the restored state back
        (a head lost then loses its shard): restore() returns once the chains are whole."""
        with self.replicated(2, data_dir=True) as (local, cluster, table):
            g = np.ones(64, F32)
            cluster.push_dense(table, g, step=0)
            step = cluster.checkpoint()["step"]
            saved = cluster.pull_dense(table, step=step)
            cluster.push_dense(table, g, step=1)
            cluster.restore(step)
            self.assertEqual([len(c.replicas) for c in cluster.view().chains], [2, 2])
            np.testing.assert_array_equal(cluster.pull_dense(table, step=step), saved)


class DenseTest(ClusterTestCase):

    def test_the_dense_calls_take_the_path_asked_for(self) -> None:
        # Built beside the stubs (python/BUILD.bazel): a missing module must not pass unseen.
        self.assertEqual(self.cluster.native, not PURE)

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
        for s, stub in enumerate(self.cluster._shards.stubs):
            info = stub.DescribeTable(ps_pb2.DescribeTableRequest(table_id=table),
                                      timeout=RPC_TIMEOUT)
            self.assertEqual((info.shard_begin, info.shard_end),
                             pscluster.shard_range(1001, s, 2))

    def test_sgd_small(self) -> None:
        self.check_sgd("small", 1000)

    def test_a_table_with_nothing_on_a_shard_keeps_its_clock_there(self) -> None:
        # One value over 2 shards: one shard's part is empty. Pushed in a batch with another
        # table, that shard's clock for it must move all the same, or a pull of it alone at
        # the next step waits on the shard until the timeout (examples/ctr.py's bias).
        one = self.cluster.create_dense("one_value", 1, optimizer="sgd", learning_rate=LR,
                                        consistency="bsp", initializer="uniform", scale=1.0,
                                        seed=7)
        five = self.cluster.create_dense("five_values", 5, optimizer="sgd", learning_rate=LR,
                                         consistency="bsp", initializer="uniform", scale=1.0,
                                         seed=7)
        w = [self.cluster.pull_dense(t, step=0) for t in (one, five)]
        g = [np.full(1, 2, F32), np.arange(5, dtype=F32)]
        got = self.cluster.push_pull_dense([one, five], g, step=0)
        want = [wi - np.float32(LR) * gi for wi, gi in zip(w, g)]
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(self.cluster.pull_dense(one, step=1), want[0])
        self.cluster.push_dense(one, g[0], step=1)
        np.testing.assert_array_equal(self.cluster.pull_dense(one, step=2),
                                      want[0] - np.float32(LR) * g[0])

    def test_a_name_means_one_table_to_every_client(self) -> None:
        # Two clients (two worker processes, say) create their tables in different orders:
        # a name still means one table; a name another client made is usable directly.
        other = pscluster.connect(self.local.coordinator, timeout=RPC_TIMEOUT)
        try:
            same = dict(optimizer="sgd", learning_rate=LR, consistency="asp",
                        initializer="uniform", scale=1.0, seed=7)
            a1 = self.cluster.create_dense("order_a", 3, **same)
            b2 = other.create_dense("order_b", 4, **same)
            b1 = self.cluster.create_dense("order_b", 4, **same)
            a2 = other.create_dense("order_a", 3, **same)
            self.assertEqual((a1, b1), (a2, b2))
            self.assertNotEqual(a1, b1)
            other.push_dense("order_a", np.ones(3, F32), step=0)
            np.testing.assert_array_equal(self.cluster.pull_dense(a1, step=1),
                                          other.pull_dense("order_a", step=1))
            with self.assertRaises(pscluster.PsError) as e:
                other.pull_dense("no_such_table")
            self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
            self.assertIn("no table named 'no_such_table'", e.exception.message)
        finally:
            other.close()

    def test_integers_outside_the_wire_range_are_refused_before_sending(self) -> None:
        # Python's ints are unbounded: step 2^64 went out as step 0 (the push applied) on
        # the grpc-python path and raised TypeError on the C++ one.
        t = self.create("wire_ints", 4)
        before = self.cluster.pull_dense(t, step=0).copy()
        g = np.ones(4, F32)
        for call, what in [(lambda: self.cluster.push_dense(t, g, step=2 ** 64), "step"),
                           (lambda: self.cluster.push_dense(t, g, step=-1), "step"),
                           (lambda: self.cluster.pull_dense(t, worker=2 ** 31), "worker"),
                           (lambda: self.cluster.pull_dense(2 ** 32), "table id"),
                           (lambda: self.cluster.push_pull_dense([t], [g], step=1.5), "step"),
                           (lambda: self.cluster.pull_sparse(t, [1], step=2 ** 63), "step"),
                           (lambda: self.cluster.restore(2 ** 64), "step"),
                           (lambda: pscluster.connect(self.local.coordinator, timeout=-1),
                            "timeout")]:
            with self.subTest(what=what), self.assertRaises(pscluster.PsError) as e:
                call()
            self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(what, e.exception.message)
        np.testing.assert_array_equal(self.cluster.pull_dense(t, step=0), before)

    def test_clients_racing_to_create_tables_agree_on_every_shard(self) -> None:
        # 3 clients at once: 4 new names each, and one name with 3 different sizes. Every
        # name gets one id, every shard the same spec of it; the same-name race has one
        # winner, the others ALREADY_EXISTS (before, ids came from a count of the tables
        # and shards ended up with different tables under one id).
        clients = [pscluster.connect(self.local.coordinator, timeout=RPC_TIMEOUT)
                   for _ in range(3)]
        ids: Dict[str, int] = {}
        same: List[object] = [None] * 3
        start = threading.Barrier(3)

        def run(r: int) -> None:
            start.wait(timeout=30)
            for k in range(4):
                ids[f"race_{r}_{k}"] = clients[r].create_dense(f"race_{r}_{k}", 5 + k)
            try:
                same[r] = clients[r].create_dense("race_same", 10 + r)
            except pscluster.PsError as e:
                same[r] = e

        try:
            threads = [threading.Thread(target=run, args=(r,)) for r in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            self.assertEqual(len(set(ids.values())), 12)
            for name, t in ids.items():
                infos = self.cluster.describe(t)
                self.assertEqual({(i.spec.name, i.spec.size) for i in infos},
                                 {(name, 5 + int(name[-1]))})
            won = [r for r in range(3) if isinstance(same[r], int)]
            self.assertEqual(len(won), 1, same)
            for r in set(range(3)) - set(won):
                self.assertEqual(same[r].code, grpc.StatusCode.ALREADY_EXISTS)
            self.assertEqual({i.spec.size for i in self.cluster.describe("race_same")},
                             {10 + won[0]})
        finally:
            for c in clients:
                c.close()

    def test_sgd_large_streams_in_chunks(self) -> None:
        # 1.5 M floats (6 MB) per shard: more than ps_server's unary limit
        # (--max_chunk_bytes, 4 MiB), so it only works as streams of chunks.
        self.check_sgd("large", 3_000_000)

    def test_pull_streams_in_the_chunks_asked_for(self) -> None:
        table = self.create("chunked", 1_000_000)  # 500 000 values (2 MB) per shard
        self.cluster.register_worker(0)
        for asked, expected in [(1 << 16, 31), (1 << 40, 1), (0, 1)]:
            req = ps_pb2.PullDenseRequest(table_id=table, offset=0, length=500_000,
                                          chunk_bytes=asked)
            chunks = list(self.cluster._shards.stubs[0].PullDenseStream(req, timeout=RPC_TIMEOUT))
            self.assertEqual(len(chunks), expected, f"chunk_bytes={asked}")
            self.assertEqual(sum(len(c.data) for c in chunks), 2_000_000)

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
            self.cluster._shards.call(1, lambda stub: stub.PushDense(ps_pb2.DenseChunk(
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


class RegisteringShardTest(unittest.TestCase):

    def test_calls_wait_for_a_shard_still_registering_within_the_timeout(self) -> None:
        # A shard whose coordinator is not up yet refuses data calls (UNAVAILABLE, naming the
        # registration); a client retries them within its timeout, and a call made before the
        # coordinator starts goes through once the shard has registered.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = find_binary("ps_server", "PS_SERVER", "server/ps/ps_server")
        shard = Process([server, "--port=0", "--shard_id=0", "--num_shards=1",
                         f"--coordinator=127.0.0.1:{port}"])
        coordinator = None
        try:
            address = shard.wait_for(r"listening on (\S+:\d+)").group(1)
            with pscluster.Cluster.from_shards([address], timeout=0.5) as impatient:
                with self.assertRaises(pscluster.PsError) as e:
                    impatient.create_dense("t", 10, learning_rate=LR)
                self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)
                self.assertIn("registering with the coordinator", e.exception.message)
            with pscluster.Cluster.from_shards([address], timeout=60.0) as cluster:
                created = cluster.submit(cluster.create_dense, "t", 10, learning_rate=LR)
                coordinator = Process([find_binary("ps_coordinator", "PS_COORDINATOR",
                                                   "server/coordinator/ps_coordinator"),
                                       f"--port={port}", "--num_shards=1", "--num_workers=0"])
                table = created.result(timeout=60)
                np.testing.assert_array_equal(cluster.pull_dense(table), np.zeros(10, F32))
        finally:
            shard.kill()
            if coordinator is not None:
                coordinator.kill()


class PartialSparsePushTest(unittest.TestCase):
    """A sparse push that one shard refuses for its own row limit (only it knows how full it
    is) after the other applied its keys: the error says which shards applied."""

    def test_the_refusal_names_the_shards_that_applied(self) -> None:
        local = LocalCluster(num_shards=2, shard_args=["--max_table_bytes=1048576"])
        try:
            with pscluster.connect(local.coordinator, timeout=RPC_TIMEOUT) as cluster:
                t = cluster.create_sparse("rows", 8, optimizer="sgd", learning_rate=1.0,
                                          consistency="asp")
                keys = np.arange(10 ** 9, 10 ** 9 + 100000, dtype=np.uint64)
                shard = cluster.shard_of(keys)
                on0, on1 = keys[shard == 0], keys[shard == 1]
                full = None
                for i in range(0, on1.size, 1000):  # shard 1 up to its row limit
                    try:
                        cluster.push_sparse(t, on1[i:i + 1000], np.zeros((1000, 8), np.float32))
                    except pscluster.PsError as e:
                        full = e
                        break
                self.assertIsNotNone(full, "shard 1 took every row")
                self.assertIn("--max_table_bytes", full.message)
                mixed = np.concatenate([on0[:5], on1[-2000:]])
                with self.assertRaises(pscluster.PsError) as e:
                    cluster.push_sparse(t, mixed, np.ones((mixed.size, 8), np.float32))
                self.assertEqual(e.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
                self.assertIn("shard(s) 0 applied their keys", e.exception.message)
        finally:
            local.stop()


class WireTest(unittest.TestCase):
    """_wire.py's hand-coded DenseChunk against protobuf's own encoding."""

    def test_encoding_is_protobufs(self) -> None:
        from pscluster import _wire
        data = np.arange(7, dtype=F32)
        for fields in [dict(), dict(worker_id=3, step=5, table_id=9, offset=100,
                                    total_length=7, begin=100),
                       dict(worker_id=-1, step=-(1 << 62), table_id=(1 << 32) - 1,
                            offset=(1 << 64) - 1, total_length=1 << 40, begin=127)]:
            with self.subTest(**fields):
                header = _wire.chunk_header(**{k: fields.get(k, 0) for k in (
                    "worker_id", "step", "table_id", "offset", "total_length", "begin")})
                mine = _wire.encode_chunk((header, memoryview(data).cast("B")))
                theirs = ps_pb2.DenseChunk(data=data.tobytes(), **fields)
                self.assertEqual(mine, theirs.SerializeToString())
                back = _wire.decode_chunk(mine)
                for k, v in fields.items():
                    self.assertEqual(getattr(back, k), v)
                self.assertEqual(bytes(back.data), data.tobytes())
        with self.assertRaises(ValueError):
            _wire.decode_chunk(b"\x3a\x10abc")  # a length past the end
        header = _wire.chunk_header(1, 2, 3, 4, 5, 6)
        batch = _wire.encode_batch([(header, memoryview(data).cast("B")),
                                    (b"", memoryview(data[:2]).cast("B"))])
        theirs = ps_pb2.DenseBatch(chunks=[
            ps_pb2.DenseChunk(worker_id=1, step=2, table_id=3, offset=4, total_length=5,
                              begin=6, data=data.tobytes()),
            ps_pb2.DenseChunk(data=data[:2].tobytes())])
        self.assertEqual(batch, theirs.SerializeToString())
        back = _wire.decode_batch(batch)
        self.assertEqual([(c.table_id, bytes(c.data)) for c in back],
                         [(3, data.tobytes()), (0, data[:2].tobytes())])


# ---- numpy references of the server's optimizers (core/optimizer/optimizer.cc) -------------
# Every option is given explicitly (0 means "the default" for some proto fields). The float32
# operations are those of the C++ loops, in the same order: the results are bit-exact.

OPTIMIZERS: Dict[str, dict] = {
    "sgd": dict(learning_rate=0.1),
    "momentum": dict(learning_rate=0.1, momentum=0.9),
    "nesterov": dict(optimizer="momentum", learning_rate=0.1, momentum=0.8, nesterov=True),
    "adagrad": dict(learning_rate=0.1, epsilon=1e-6, initial_accumulator=0.1),
    "adam": dict(learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8),
    "adamw": dict(learning_rate=0.01, beta1=0.8, beta2=0.99, epsilon=1e-7, weight_decay=0.1),
    "ftrl": dict(learning_rate=0.5, l1=0.01, l2=0.1, ftrl_beta=1.0, initial_accumulator=0.1),
}


def ref_slots(kind: str, o: dict, shape) -> List[np.ndarray]:
    if kind == "sgd":
        return []
    if kind in ("momentum", "nesterov"):
        return [np.zeros(shape, F32)]
    if kind == "adagrad":
        return [np.full(shape, o["initial_accumulator"], F32)]
    if kind == "ftrl":
        return [np.zeros(shape, F32), np.full(shape, o["initial_accumulator"], F32)]
    return [np.zeros(shape, F32), np.zeros(shape, F32)]


def ref_apply(kind: str, o: dict, w: np.ndarray, g: np.ndarray, slots: List[np.ndarray],
              t: int) -> None:
    """One update, in place, at update count t (1-based)."""
    lr = F32(o["learning_rate"])
    if kind == "sgd":
        w -= lr * g
    elif kind in ("momentum", "nesterov"):
        mu, v = F32(o["momentum"]), slots[0]
        v[...] = mu * v + g
        w -= lr * (g + mu * v) if o.get("nesterov") else lr * v
    elif kind == "adagrad":
        acc = slots[0]
        acc += g * g
        w -= lr * g / (np.sqrt(acc) + F32(o["epsilon"]))
    elif kind in ("adam", "adamw"):
        b1, b2, m, v = F32(o["beta1"]), F32(o["beta2"]), slots[0], slots[1]
        bc1, bc2 = F32(1.0 - float(b1) ** t), F32(1.0 - float(b2) ** t)
        step_size, inv_sqrt_bc2 = lr / bc1, F32(1.0) / np.sqrt(bc2)
        decay = F32(1.0) - lr * F32(o.get("weight_decay", 0.0))
        m[...] = b1 * m + (F32(1) - b1) * g
        v[...] = b2 * v + (F32(1) - b2) * g * g
        denom = np.sqrt(v) * inv_sqrt_bc2 + F32(o["epsilon"])
        w[...] = w * decay - step_size * m / denom
    elif kind == "ftrl":
        z, n = slots
        inv_alpha = F32(1.0) / lr
        beta, l1, l2 = F32(o["ftrl_beta"]), F32(o["l1"]), F32(o["l2"])
        n_new = n + g * g
        sqrt_n_new = np.sqrt(n_new)
        sigma = (sqrt_n_new - np.sqrt(n)) * inv_alpha
        zi = z + g - sigma * w
        z[...] = zi
        n[...] = n_new
        shrunk = np.where(zi > 0, zi - l1, zi + l1)
        denom = (beta + sqrt_n_new) * inv_alpha + l2
        w[...] = np.where(np.abs(zi) <= l1, F32(0), -shrunk / denom)
    else:
        raise ValueError(kind)


def spec_of(kind: str) -> dict:
    o = dict(OPTIMIZERS[kind])
    o.setdefault("optimizer", kind)
    return o


class OptimizerTest(ClusterTestCase):
    """Dense and sparse pushes, for every optimizer, exact against the numpy references."""

    def test_dense_every_optimizer(self) -> None:
        rng = np.random.default_rng(3)
        for kind in OPTIMIZERS:
            with self.subTest(optimizer=kind):
                o = spec_of(kind)
                t = self.cluster.create_dense(f"dense_{kind}", 1001, consistency="bsp",
                                              initializer="uniform", scale=0.5, seed=11, **o)
                w = self.cluster.pull_dense(t, step=0).copy()
                slots = ref_slots(kind, o, w.shape)
                for step in range(4):
                    g = rng.standard_normal(w.size, dtype=F32)
                    got = self.cluster.push_pull_dense([t], [g], step=step)[0]
                    ref_apply(kind, o, w, g, slots, step + 1)
                    np.testing.assert_array_equal(got, w, err_msg=f"{kind} step {step}")

    def test_sparse_every_optimizer(self) -> None:
        rng = np.random.default_rng(4)
        dim = 5
        for kind in OPTIMIZERS:
            with self.subTest(optimizer=kind):
                o = spec_of(kind)
                t = self.cluster.create_sparse(f"sparse_{kind}", dim, key_space=1 << 40,
                                               consistency="bsp", initializer="normal",
                                               scale=0.1, seed=5, **o)
                rows: Dict[int, Tuple[np.ndarray, List[np.ndarray], int]] = {}
                for step in range(4):
                    # Repeats within a push (summed in request order, one update per key)
                    # and keys on both shards; some rows first touched late.
                    keys = rng.integers(0, 12, size=9).astype(np.uint64) * np.uint64(1 << 33)
                    keys[0] = step * 1000
                    before = self.cluster.pull_sparse(t, keys, step=step)
                    for i, k in enumerate(keys.tolist()):
                        if k not in rows:
                            rows[k] = (before[i].copy(), ref_slots(kind, o, (dim,)), 0)
                        np.testing.assert_array_equal(before[i], rows[k][0])
                    g = rng.standard_normal((keys.size, dim), dtype=F32)
                    self.cluster.push_sparse(t, keys, g, step=step)
                    summed: Dict[int, np.ndarray] = {}
                    for i, k in enumerate(keys.tolist()):
                        summed[k] = summed[k] + g[i] if k in summed else g[i].copy()
                    for k, gk in summed.items():
                        w, slots, n = rows[k]
                        ref_apply(kind, o, w, gk, slots, n + 1)
                        rows[k] = (w, slots, n + 1)
                keys = np.array(sorted(rows), dtype=np.uint64)
                np.testing.assert_array_equal(self.cluster.pull_sparse(t, keys, step=4),
                                              np.stack([rows[k][0] for k in keys.tolist()]))
                self.assertEqual(sum(i.num_rows for i in self.cluster.describe(t)), len(rows))

    def test_sparse_gradient_rows_of_another_shape_are_refused(self) -> None:
        t = self.cluster.create_sparse("rows_shape", 4, optimizer="sgd", learning_rate=LR,
                                       consistency="asp")
        with self.assertRaises(pscluster.PsError) as e:  # 8 values, but not 2 rows of 4
            self.cluster.push_sparse(t, [1, 2], np.ones((4, 2), F32))
        self.assertIn("(keys, dim) or flat", e.exception.message)
        self.cluster.push_sparse(t, [1, 2], np.ones(8, F32))  # flat is fine

    def test_sparse_admission_and_eviction(self) -> None:
        # An id gets a row at its second push; a row no push touched in the last 2 steps
        # goes at the next sweep (each step). Both ids live on one shard: a shard sweeps
        # when it applies updates.
        t = self.cluster.create_sparse("admitted", 2, optimizer="sgd", learning_rate=LR,
                                       consistency="asp", initializer="zeros",
                                       admit_after_pushes=2, evict_after_steps=2)
        shard = self.cluster.shard_of(np.array([5], np.uint64))[0]
        other = next(k for k in range(6, 1000)
                     if self.cluster.shard_of(np.array([k], np.uint64))[0] == shard)
        one, zero = np.ones((1, 2), F32), np.zeros((1, 2), F32)
        self.cluster.push_sparse(t, [5], one, step=0)  # its first push: no row yet
        np.testing.assert_array_equal(self.cluster.pull_sparse(t, [5], step=1), zero)
        self.cluster.push_sparse(t, [5], one, step=1)  # its second: a row, updated
        np.testing.assert_array_equal(self.cluster.pull_sparse(t, [5], step=2),
                                      np.full((1, 2), -LR, F32))
        self.cluster.push_sparse(t, [other], one, step=2)
        self.cluster.push_sparse(t, [other], one, step=3)  # step 3 sweeps rows of step <= 1
        np.testing.assert_array_equal(self.cluster.pull_sparse(t, [5], step=4), zero)
        counts = [(s.rows_admitted, s.rows_not_admitted, s.rows_evicted)
                  for r in self.cluster.stats() for s in r.tables if s.info.spec.table_id == t]
        self.assertEqual(tuple(map(sum, zip(*counts))), (2, 2, 1))
        with self.assertRaises(pscluster.PsError) as e:
            self.cluster.create_sparse("admit_too_late", 2, admit_after_pushes=256)
        self.assertIn("admit_after_pushes must be <= 255", e.exception.message)

    def test_a_sparse_push_over_one_message(self) -> None:
        # 160,000 rows of dim 16 on 2 shards: about 5.8 MB a shard with their keys, over the
        # 4 MiB one message may carry: each shard's part goes in numbered parts (a BSP shard
        # counts the push at its last).
        keys = np.arange(160_000, dtype=np.uint64)
        grads = np.ones((keys.size, 16), F32)
        asp = self.cluster.create_sparse("big_push_asp", 16, optimizer="sgd", learning_rate=LR,
                                         consistency="asp", initializer="zeros")
        self.cluster.push_sparse(asp, keys, grads, step=0)
        np.testing.assert_array_equal(self.cluster.pull_sparse(asp, keys[::997], step=1),
                                      np.full((keys[::997].size, 16), -LR, F32))
        bsp = self.cluster.create_sparse("big_push_bsp", 16, optimizer="sgd", learning_rate=LR,
                                         consistency="bsp", initializer="zeros")
        self.cluster.push_sparse(bsp, keys, grads, step=0)
        np.testing.assert_array_equal(self.cluster.pull_sparse(bsp, keys[::997], step=1),
                                      np.full((keys[::997].size, 16), -LR, F32))

    def test_sparse_rows_split_by_the_servers_hash(self) -> None:
        t = self.cluster.create_sparse("placement", 2, optimizer="sgd", learning_rate=1.0)
        keys = np.arange(200, dtype=np.uint64)
        self.cluster.push_sparse(t, keys, np.ones((200, 2), F32))
        on = self.cluster.shard_of(keys)
        self.assertEqual([i.num_rows for i in self.cluster.describe(t)],
                         [int((on == s).sum()) for s in range(2)])
        self.assertTrue(0 < (on == 0).sum() < 200)


class ConcurrencyTest(ClusterTestCase):

    def test_threads_pushing_sum_exactly(self) -> None:
        # SGD with lr 1 on zeros, small integer gradients: every sum is exact in float32, so
        # a lost or doubled push shows. 4 threads x 25 pushes, dense and sparse.
        size, threads, pushes = 10_000, 4, 25
        dense = self.cluster.create_dense("concurrent", size, optimizer="sgd",
                                          learning_rate=1.0, consistency="asp")
        sparse = self.cluster.create_sparse("concurrent_rows", 3, optimizer="sgd",
                                            learning_rate=1.0, consistency="asp")
        keys = np.arange(50, dtype=np.uint64)

        def work(worker: int) -> None:
            for step in range(pushes):
                g = np.full(size, worker + 1, F32)
                self.cluster.push_dense(dense, g, step=step, worker=worker)
                self.cluster.push_sparse(sparse, keys, np.full((50, 3), worker + 1, F32),
                                         step=step, worker=worker)

        pool = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join(timeout=120)
            self.assertFalse(th.is_alive(), "a pushing thread did not finish in 120 s")
        total = -float(pushes * sum(range(1, threads + 1)))
        np.testing.assert_array_equal(self.cluster.pull_dense(dense), np.full(size, total, F32))
        np.testing.assert_array_equal(self.cluster.pull_sparse(sparse, keys),
                                      np.full((50, 3), total, F32))

    def test_futures(self) -> None:
        t = self.cluster.create_dense("futures", 5000, optimizer="sgd", learning_rate=1.0)
        fs = [self.cluster.push_dense_async(t, np.ones(5000, F32), step=i) for i in range(8)]
        for f in fs:
            self.assertIsNone(f.result(timeout=60))
        np.testing.assert_array_equal(self.cluster.pull_dense_async(t).result(timeout=60),
                                      np.full(5000, -8, F32))
        bad = self.cluster.pull_dense_async(424242)
        with self.assertRaises(pscluster.PsError) as e:
            bad.result(timeout=60)
        self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)


class CppClientTest(ClusterTestCase):
    """The Python client and the C++ client (python/testing/cpp_peer.cc) on the same tables."""

    def peer(self, *args: str) -> None:
        binary = find_binary("cpp_peer", "CPP_PEER", "python/cpp_peer")
        r = subprocess.run([binary, f"--shards={','.join(self.cluster.addresses)}", *args],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_dense_both_ways(self) -> None:
        size, d = 300_001, self.tmp.name
        t = self.cluster.create_dense("interop", size, optimizer="adam", learning_rate=0.01,
                                      consistency="bsp", initializer="normal", scale=1.0,
                                      seed=9)
        self.cluster.register_worker(0)
        self.peer("--worker=1", "pull_dense", "--table", str(t), "--size", str(size),
                  f"{d}/w0")
        np.testing.assert_array_equal(np.fromfile(f"{d}/w0", F32),
                                      self.cluster.pull_dense(t, step=0))
        # BSP with workers 0 (Python) and 1 (C++): step 0 applies their sum.
        g0 = np.random.default_rng(0).standard_normal(size, dtype=F32)
        g1 = np.random.default_rng(1).standard_normal(size, dtype=F32)
        g1.tofile(f"{d}/g1")
        self.cluster.push_dense(t, g0, step=0)
        self.peer("--worker=1", "--step=0", "push_dense", "--table", str(t), f"{d}/g1")
        self.peer("--worker=1", "--step=1", "pull_dense", "--table", str(t), "--size",
                  str(size), f"{d}/w1")
        w1 = self.cluster.pull_dense(t, step=1)
        np.testing.assert_array_equal(np.fromfile(f"{d}/w1", F32), w1)
        w, slots = np.fromfile(f"{d}/w0", F32), ref_slots("adam", spec_of("adam"), size)
        o = dict(spec_of("adam"), learning_rate=0.01)
        ref_apply("adam", o, w, g0 + g1, slots, 1)
        np.testing.assert_array_equal(w1, w)
        self.cluster.unregister_worker(1)

    def test_sparse_both_ways(self) -> None:
        d = self.tmp.name
        t = self.cluster.create_sparse("interop_rows", 4, optimizer="sgd", learning_rate=0.5,
                                       initializer="uniform", scale=1.0, seed=2)
        keys = np.array([7, 1 << 50, 7, 123456789], dtype=np.uint64)
        keys.tofile(f"{d}/keys")
        np.full((4, 4), 2, F32).tofile(f"{d}/g")
        before = self.cluster.pull_sparse(t, keys)
        self.peer("--worker=3", "push_sparse", "--table", str(t), f"{d}/keys", f"{d}/g")
        after = self.cluster.pull_sparse(t, keys)
        np.testing.assert_array_equal(after, before - F32(0.5) * np.where(
            (keys == 7)[:, None], F32(4), F32(2)))
        self.peer("--worker=3", "pull_sparse", "--table", str(t), "--dim=4", f"{d}/keys",
                  f"{d}/rows")
        np.testing.assert_array_equal(np.fromfile(f"{d}/rows", F32).reshape(4, 4), after)


class BadInputTest(ClusterTestCase):
    """Malformed calls raise PsError with the server's or the client's reason; the tables
    are exactly as before."""

    def test_nonfinite_gradients_are_refused(self) -> None:
        t = self.cluster.create_dense("nan", 1000, optimizer="adam", learning_rate=0.1,
                                      initializer="uniform", scale=1.0)
        before = self.cluster.pull_dense(t)
        g = np.ones(1000, F32)
        g[700] = np.nan
        with self.assertRaises(pscluster.PsError) as e:
            self.cluster.push_dense(t, g)
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("index 700", e.exception.message)
        np.testing.assert_array_equal(self.cluster.pull_dense(t), before)
        # Past the client's check, the shard that holds index 700 refuses its part.
        with self.assertRaises(pscluster.PsError) as e:
            self.cluster._push_shard(1, t, 0, 0, 500, 1000, g)
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(e.exception.shard, 1)
        self.assertRegex(e.exception.message, r"(?i)nan|finite")
        np.testing.assert_array_equal(self.cluster.pull_dense(t), before)
        s = self.cluster.create_sparse("nan_rows", 2, optimizer="sgd", learning_rate=1.0)
        with self.assertRaises(pscluster.PsError) as e:
            self.cluster.push_sparse(s, [1, 2], np.array([[1, np.inf], [1, 1]], F32))
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(sum(i.num_rows for i in self.cluster.describe(s)), 0)

    def test_sparse_shapes_and_keys(self) -> None:
        s = self.cluster.create_sparse("bounded", 3, key_space=100, optimizer="sgd",
                                       learning_rate=1.0)
        cases = [
            (lambda: self.cluster.push_sparse(s, [1, 2], np.ones((2, 2), F32)), "6"),
            (lambda: self.cluster.pull_sparse(s, [[1, 2]]), "1-D"),
            (lambda: self.cluster.pull_sparse(s, [-1]), "negative"),
            (lambda: self.cluster.pull_sparse(s, [5, 100]), "100"),
            (lambda: self.cluster.push_sparse(s, [5, 100], np.ones((2, 3), F32)), "100"),
            (lambda: self.cluster.pull_dense(s), "SPARSE"),
        ]
        for call, needle in cases:
            with self.subTest(needle=needle), self.assertRaises(pscluster.PsError) as e:
                call()
            self.assertIn(needle, e.exception.message)
        self.assertEqual(sum(i.num_rows for i in self.cluster.describe(s)), 0)

    def test_wrong_output_and_spec(self) -> None:
        t = self.cluster.create_dense("outputs", 10)
        with self.assertRaises(pscluster.PsError) as e:
            self.cluster.pull_dense(t, out=np.empty(11, F32))
        self.assertIn("10 values", e.exception.message)
        with self.assertRaises(pscluster.PsError) as e:
            self.cluster.create_dense("typo", 10, optimizer="adam", betta1=0.9)
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("betta1", e.exception.message)
        with self.assertRaises(pscluster.PsError) as e:  # the server's own check
            self.cluster.create_dense("negative_lr", 10, learning_rate=-1.0)
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("learning_rate", e.exception.message)


class CheckpointTest(ClusterTestCase):
    """checkpoint(), checkpoints(), restore() and switch_mode() through the coordinator."""
    data_dir = True

    def test_checkpoint_and_restore(self) -> None:
        c = self.cluster
        t = c.create_dense("ckpt", 2000, optimizer="adam", learning_rate=0.1,
                           consistency="bsp", initializer="uniform", scale=1.0)
        s = c.create_sparse("ckpt_rows", 4, optimizer="adagrad", learning_rate=0.1,
                            consistency="bsp", initial_accumulator=0.1)
        keys = np.array([3, 4, 5], np.uint64)
        g = np.ones(2000, F32)
        for step in range(3):
            c.push_pull_dense([t], [g], step=step)
            c.push_sparse(s, keys, np.ones((3, 4), F32), step=step)
        self.assertEqual(c.clock(0), 3)
        with self.assertRaises(pscluster.PsError) as e:
            c.clock(77)  # never registered: no clock, rather than a misleading 0
        self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertIn("worker 77 is not registered", e.exception.message)
        self.assertEqual(c.applied_step(t), 3)
        for bad in (float("nan"), float("inf")):
            with self.assertRaises(pscluster.PsError) as e:
                c.checkpoint(metric=bad)
            self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("not a finite number", e.exception.message)
        self.assertEqual(c.checkpoints(), [])
        record = c.checkpoint()
        self.assertEqual(record["step"], 3)
        self.assertEqual([k["step"] for k in c.checkpoints()], [3])
        saved, saved_rows = c.pull_dense(t, step=3), c.pull_sparse(s, keys, step=3)
        for step in range(3, 5):
            c.push_pull_dense([t], [g], step=step)
            c.push_sparse(s, keys, np.ones((3, 4), F32), step=step)
        self.assertFalse(np.array_equal(c.pull_dense(t, step=5), saved))
        c.restore(3)
        self.assertEqual(c.applied_step(t), 3)
        np.testing.assert_array_equal(c.pull_dense(t, step=3), saved)
        np.testing.assert_array_equal(c.pull_sparse(s, keys, step=3), saved_rows)
        with self.assertRaises(pscluster.PsError) as e:
            c.restore(99)
        self.assertIn("99", e.exception.message)

    def test_switch_mode_is_scheduled(self) -> None:
        r = self.cluster.switch_mode("allreduce", at_step=1000)
        self.assertEqual(r["at_step"], 1000)
        pending = self.cluster.status()["pending_switches"]
        self.assertEqual([(p["at_step"], p["to_mode"]) for p in pending], [(1000, "ALLREDUCE")])
        with self.assertRaises(pscluster.PsError) as e:
            self.cluster.switch_mode("bogus")
        self.assertIn("bogus", e.exception.message)


class OwnRestoreTest(ClusterTestCase):
    """A cluster of its own: a checkpoint asked for before the tables pass the newest one's
    step answers that one, marked earlier; after another class's BSP tables it would
    lack these tests' tables."""
    data_dir = True

    def test_restore_is_refused_under_another_clients_workers(self) -> None:
        """A Python worker is no member of the coordinator: the shards' Stats tell it trains
        (idle_ms), so another client's restore (psctl's, an operator's script) is refused
        instead of rolling the tables back under it; its own Cluster may restore."""
        c = self.cluster
        t = c.create_dense("guarded", 50, optimizer="sgd", learning_rate=0.5,
                           consistency="asp", initializer="uniform", scale=1.0)
        g = np.ones(50, F32)
        c.register_worker(4)
        base = c.clock(4)
        for step in range(base, base + 2):
            c.push_dense(t, g, step=step, worker=4)
        step = c.checkpoint()["step"]
        c.push_dense(t, g, step=base + 2, worker=4)
        c.restore(step)  # its own calls do not count ...
        self.assertEqual(c.checkpoints()[-1]["step"], step)
        c.push_dense(t, g, step=step, worker=4)  # ... its workers stay registered ...
        after = c.pull_dense(t, step=step + 1, worker=4)
        c.restore(step)  # ... and it may restore again at once
        c.push_dense(t, g, step=step, worker=4)
        other = pscluster.connect(self.local.coordinator, timeout=RPC_TIMEOUT)
        try:
            # Pulling as worker 4 itself does not make it the other client's worker (it
            # did: a worker id it had registered was its own).
            other.pull_dense(t, step=step + 1, worker=4)
            with self.assertRaises(pscluster.PsError) as e:
                other.restore(step)
            self.assertEqual(e.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("worker 4 (", e.exception.message)
            self.assertIn("--force", e.exception.message)
            np.testing.assert_array_equal(c.pull_dense(t, step=step + 1, worker=4), after)
        finally:
            other.close()


    def test_a_checkpoint_the_tables_did_not_pass_says_it_is_earlier(self) -> None:
        """Checkpoints are named by step: asked again before the tables pass the newest
        one's step, the coordinator answers that one, now marked earlier (it was answered
        as if new, without what changed since at that step)."""
        c = self.cluster
        first = c.checkpoint()
        again = c.checkpoint(metric=0.5)
        self.assertEqual(again["step"], first["step"])
        self.assertTrue(again["earlier"])
        self.assertFalse(c.checkpoints()[-1]["earlier"], "the manifest's record is unmarked")
        # A metric measured at that step is filed under it (it was dropped).
        self.assertEqual((again["has_metric"], again["metric"]), (True, 0.5))
        self.assertEqual(c.checkpoints()[-1]["metric"], 0.5)

class RestoreGuardTest(unittest.TestCase):
    """A restore counts the calls of every client but the caller (told apart by the
    ps-client-id each client sends), a call waiting in a shard too."""

    def test_a_restore_counts_other_clients_by_id_and_their_waiting_calls(self) -> None:
        with tempfile.TemporaryDirectory(prefix="pscluster_guard_") as tmp, \
                contextlib.ExitStack() as stack:
            local = LocalCluster(num_shards=1, data_dir=tmp)
            stack.callback(local.stop)
            admin, other = (
                stack.enter_context(pscluster.connect(local.coordinator, timeout=RPC_TIMEOUT))
                for _ in range(2))
            t = admin.create_dense("guard", 8, optimizer="sgd", learning_rate=1.0,
                                   consistency="bsp")
            admin.register_worker(0)
            admin.register_worker(1)  # it never pushes: a pull at step 1 waits in the shard
            step = admin.checkpoint()["step"]

            def calls() -> Tuple[bool, int]:  # worker 0's calls in progress
                n = sum(w.calls for s in admin.stats() for w in s.workers if w.worker_id == 0)
                return n > 0, n

            def waiting(c: pscluster.Cluster):
                pull = c.pull_dense_async(t, step=1, worker=0)
                self.assertTrue(admin._poll(calls, RPC_TIMEOUT)[0], "the pull never waited")
                return pull

            # The caller's own waiting pull does not count; the restore ends it, naming it.
            pull = waiting(admin)
            admin.restore(step)
            with self.assertRaises(pscluster.PsError) as e:
                pull.result(timeout=RPC_TIMEOUT)
            self.assertEqual(e.exception.code, grpc.StatusCode.ABORTED)
            self.assertIn("rolled back to its snapshot of step", e.exception.message)
            # Another client's does (it looked idle: its call began long ago), named as a
            # call in progress, and to a caller without an id (psctl) as well.
            pull = waiting(other)
            with self.assertRaises(pscluster.PsError) as e:
                admin.restore(step)
            self.assertEqual(e.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("worker 0 (1 call(s) now)", e.exception.message)
            channel = stack.enter_context(grpc.insecure_channel(local.coordinator))
            with self.assertRaises(grpc.RpcError) as raw:
                coordinator_pb2_grpc.CoordinatorStub(channel).RestoreCheckpoint(
                    coordinator_pb2.RestoreCheckpointRequest(step=step), timeout=RPC_TIMEOUT)
            self.assertEqual(raw.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
            admin.restore(step, force=True)
            with self.assertRaises(pscluster.PsError) as e:
                pull.result(timeout=RPC_TIMEOUT)
            self.assertEqual(e.exception.code, grpc.StatusCode.ABORTED)


    def test_a_restore_some_shards_took_says_which_and_drops_the_later_checkpoints(self):
        """Shard 1 killed: a forced restore rolls shard 0 back (deleting its later snapshots)
        and fails on shard 1. It says which shards rolled back, and the manifest drops the
        later checkpoints (it kept them, and one was answered that no shard could restore);
        once the shard is declared dead a restore is refused before any shard is touched."""
        with tempfile.TemporaryDirectory(prefix="pscluster_partial_") as tmp, \
                contextlib.ExitStack() as stack:
            local = LocalCluster(num_shards=2, data_dir=tmp,
                                 coordinator_args=["--heartbeat_timeout_ms=2000"])
            stack.callback(local.stop)
            c = stack.enter_context(pscluster.connect(local.coordinator, timeout=RPC_TIMEOUT))
            t = c.create_dense("partial", 64, optimizer="sgd", learning_rate=1.0,
                               consistency="asp")
            c.push_dense(t, np.ones(64, F32), step=0)
            first = c.checkpoint()["step"]
            c.push_dense(t, np.ones(64, F32), step=1)
            self.assertGreater(c.checkpoint()["step"], first)
            local.shards[1].kill()
            with self.assertRaises(pscluster.PsError) as e:
                c.restore(first, force=True)
            self.assertIn(f"shard(s) 0 did roll back to step {first}", e.exception.message)
            self.assertEqual([k["step"] for k in c.checkpoints()], [first])

            def shard1_dead() -> Tuple[bool, None]:
                return not any(m.alive for m in c.view().members
                               if m.role == coordinator_pb2.SHARD and m.id == 1), None

            self.assertTrue(c._poll(shard1_dead, 30.0)[0], "shard 1 was never declared dead")
            with self.assertRaises(pscluster.PsError) as e:
                c.restore(first, force=True)
            self.assertEqual(e.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("shard(s) 1 have no live replica", e.exception.message)


    def test_a_worker_a_restore_made_the_shards_forget_registers_again(self) -> None:
        """Another client restored to a checkpoint from before this Cluster's worker
        registered: its next call fails saying so, and the one after registers it again."""
        with tempfile.TemporaryDirectory(prefix="pscluster_forgot_") as tmp, \
                contextlib.ExitStack() as stack:
            local = LocalCluster(num_shards=2, data_dir=tmp)
            stack.callback(local.stop)
            admin, c = (stack.enter_context(pscluster.connect(local.coordinator,
                                                              timeout=RPC_TIMEOUT))
                        for _ in range(2))
            t = admin.create_dense("forgot", 64, optimizer="sgd", learning_rate=1.0,
                                   consistency="asp")
            step = admin.checkpoint()["step"]
            g = np.ones(64, F32)
            c.push_dense(t, g, step=0, worker=5)  # registers 5, after the checkpoint
            admin.restore(step, force=True)
            with self.assertRaises(pscluster.PsError) as e:
                c.push_dense(t, g, step=0, worker=5)
            self.assertEqual(e.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("the shard forgot it", e.exception.message)
            c.push_dense(t, g, step=0, worker=5)
            self.assertEqual(c.clock(5), 1)


class AspCheckpointTest(ClusterTestCase):
    """A checkpoint of ASP tables is taken at the slowest worker's clock (before: at step 0,
    the BSP steps applied, so no checkpoint after the first was ever taken)."""
    data_dir = True

    def test_checkpoint_is_at_the_slowest_clock_and_restores(self) -> None:
        c = self.cluster
        t = c.create_dense("asp_ckpt", 100, optimizer="sgd", learning_rate=0.1,
                           consistency="asp", initializer="uniform", scale=1.0)
        g = np.ones(100, F32)
        c.register_worker(0)
        c.register_worker(1)  # both before any push (a late joiner starts at the others' clock)
        for step in range(6):
            c.push_dense(t, g, step=step, worker=0)
        for step in range(3):
            c.push_dense(t, g, step=step, worker=1)
        self.assertEqual(c.applied_step(t), 3)
        saved = c.pull_dense(t, step=3)
        record = c.checkpoint()
        self.assertEqual(record["step"], 3)
        c.push_dense(t, g, step=3, worker=1)
        self.assertFalse(np.array_equal(c.pull_dense(t, step=4), saved))
        c.restore(3)
        np.testing.assert_array_equal(c.pull_dense(t, step=3), saved)


class CloseTest(ClusterTestCase):
    def test_a_closed_cluster_refuses_every_call_and_changes_nothing(self) -> None:
        """After close() no call reaches the shards, on the C++ data path too (it used to
        push on), and every one raises the client's exception."""
        t = self.cluster.create_dense("closed", 8, optimizer="sgd", learning_rate=1.0,
                                      consistency="asp")
        before = self.cluster.pull_dense(t, step=0)
        c = pscluster.connect(self.local.coordinator, timeout=RPC_TIMEOUT)
        c.pull_dense(t, step=0)  # the table known, the data path set up
        c.close()
        c.close()  # idempotent
        ones = np.ones(8, F32)
        for call in (lambda: c.push_dense(t, ones, step=0), lambda: c.pull_dense(t, step=0),
                     lambda: c.push_pull_dense([t], [ones], step=0), lambda: c.checkpoints(),
                     lambda: c.submit(c.pull_dense, t, 0)):
            with self.assertRaises(pscluster.PsError) as e:
                call()
            self.assertEqual(e.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("closed", str(e.exception))
        np.testing.assert_array_equal(self.cluster.pull_dense(t, step=0), before)


class RestoreTest(ClusterTestCase):
    data_dir = True

    def test_a_restored_checkpoint_becomes_the_newest_and_later_ones_are_retaken(self) -> None:
        """Restoring an older checkpoint drops the later ones (manifest and snapshots): the
        run from there checkpoints its own steps (before: the old timeline's checkpoint of
        the same step was handed back, and restoring it brought back the other run)."""
        c = self.cluster
        t = c.create_dense("rewind", 16, optimizer="sgd", learning_rate=0.1, consistency="asp")
        c.register_worker(0)
        g = np.ones(16, F32)
        for step in range(3):
            c.push_dense(t, g, step=step, worker=0)
        self.assertEqual(c.checkpoint()["step"], 3)
        for step in range(3, 6):
            c.push_dense(t, g, step=step, worker=0)
        self.assertEqual(c.checkpoint()["step"], 6)
        c.restore(3)
        self.assertEqual([x["step"] for x in c.checkpoints()][-1], 3)
        for step in range(3, 6):
            c.push_dense(t, 2 * g, step=step, worker=0)
        now = c.pull_dense(t, step=6)
        self.assertEqual(c.checkpoint()["step"], 6)
        c.push_dense(t, g, step=6, worker=0)
        c.restore(6)
        np.testing.assert_array_equal(c.pull_dense(t, step=6), now)
        with self.assertRaises(pscluster.PsError) as e:
            c.restore(5)
        self.assertIn("no checkpoint of step 5", str(e.exception))


class MixedConsistencyCheckpointTest(ClusterTestCase):
    data_dir = True

    def test_a_bsp_table_beside_asp_ones_sets_the_step(self) -> None:
        """With a BSP table beside an ASP table whose clocks ran ahead, the checkpoint is
        taken at the BSP table's step (before: at the ASP clock, which the BSP table waited
        for until the request's deadline, and every later checkpoint with it)."""
        c = self.cluster
        asp = c.create_dense("ahead", 10, optimizer="sgd", learning_rate=0.1, consistency="asp")
        bsp = c.create_dense("exact", 10, optimizer="sgd", learning_rate=0.1, consistency="bsp")
        c.register_worker(0)
        g = np.ones(10, F32)
        for step in range(5):
            c.push_dense(asp, g, step=step, worker=0)
        for step in range(2):
            c.push_dense(bsp, g, step=step, worker=0)
        self.assertEqual(c.checkpoint()["step"], 2)


if __name__ == "__main__":
    import pytest  # Debian's python3-pytest; it runs the unittest classes too
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-p", "no:cacheprovider"]))
