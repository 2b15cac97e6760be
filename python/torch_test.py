"""pscluster.torch against plain PyTorch: the same models, data and Adam, step by step, on
a real coordinator and two shards (see pscluster_test.py for how to run it by hand).

Tolerance: the server's Adam is PyTorch's float32 update (core/optimizer/optimizer.cc), so
one worker matches torch.optim.Adam to rounding (observed <= 1e-7); with two workers the
gradient is the sum of two half-batch means instead of one mean over the batch, which
rounds differently. Every parameter must stay within ATOL = 1e-5 (absolute) of PyTorch's
after 10 steps, while the parameters themselves move by ~1e-2 over those steps.
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile

DEBIAN_PYTHON = "/usr/bin/python3"  # see pscluster_test.py
if (os.path.exists(DEBIAN_PYTHON) and os.path.realpath(sys.executable) !=
        os.path.realpath(DEBIAN_PYTHON) and not os.environ.get("PSCLUSTER_TEST_REEXEC")):
    os.environ["PSCLUSTER_TEST_REEXEC"] = "1"
    os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON, os.path.abspath(__file__)] + sys.argv[1:])

import threading
import unittest
from typing import Callable, List

import grpc
import numpy as np
import torch

import pscluster
import pscluster.torch as pst
from pscluster.local import LocalCluster

torch.set_num_threads(1)
STEPS = 10
ATOL = 1e-5
TIMEOUT = 30.0


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32),
                                       torch.nn.ReLU(), torch.nn.Linear(32, 10))

    def forward(self, x):
        return self.net(x)


class ConvGru(torch.nn.Module):
    """A CNN front (conv, pool) and a GRU over the rows: not an MLP, and with parameters of
    several shapes (4-D kernels, stacked gate matrices)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.gru = torch.nn.GRU(input_size=4 * 4, hidden_size=12, batch_first=True)
        self.head = torch.nn.Linear(12, 10)

    def forward(self, x):  # x: (B, 1, 8, 8)
        h = torch.relu(self.conv(x))                   # (B, 4, 8, 8)
        h = torch.nn.functional.max_pool2d(h, (1, 2))  # (B, 4, 8, 4)
        h = h.permute(0, 2, 1, 3).reshape(x.shape[0], 8, 16)
        out, _ = self.gru(h)
        return self.head(out[:, -1])


def data(steps: int, batch: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 1, 8, 8, generator=g), torch.randint(0, 10, (batch,), generator=g))
            for _ in range(steps)]


def max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


class TorchTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls) -> None:
        cls.local = LocalCluster(num_shards=2)
        cls.next_base = 1000

    @classmethod
    def tearDownClass(cls) -> None:
        cls.local.stop()

    def base(self) -> int:
        TorchTest.next_base += 100
        return TorchTest.next_base

    def reference(self, make: Callable[[], torch.nn.Module], batches, lr: float,
                  one_step_old: bool = False):
        """torch.optim.Adam over the batches. one_step_old: step S >= 1 takes its gradient at
        the values before step S-1's update (what overlap=True computes with one worker)."""
        torch.manual_seed(0)
        model = make()
        torch.manual_seed(0)
        lag = make()  # one_step_old: the values before the last update
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        for x, y in batches:
            at = lag if one_step_old else model
            at.zero_grad()
            torch.nn.functional.cross_entropy(at(x), y).backward()
            if one_step_old:
                for p, q in zip(model.parameters(), lag.parameters()):
                    p.grad = q.grad.clone()
                lag.load_state_dict(model.state_dict())
            opt.step()
        return model

    def train(self, make: Callable[[], torch.nn.Module], batches, lr: float, workers: int,
              consistency: str = "bsp", staleness: int = 0,
              overlap: bool = False) -> List[torch.nn.Module]:
        """`workers` threads, each its own client and model copy and its part of every
        batch, through the cluster."""
        base, models, errors = self.base(), [None] * workers, []
        # Nobody leaves before everyone has started: an ASP worker could else finish and
        # unregister before a slower one saw it registered (wait_for_workers polls).
        started = threading.Barrier(workers, timeout=60)
        built = []
        for _ in range(workers):  # here: torch's seeded generator is one for all threads
            torch.manual_seed(0)
            built.append(make())

        def work(rank: int) -> None:
            try:
                with pscluster.connect(self.local.coordinator, timeout=TIMEOUT) as cluster:
                    model = built[rank]
                    opt = pst.ParameterServerOptimizer(
                        model, cluster, optimizer="adam", lr=lr, consistency=consistency,
                        staleness=staleness, worker=rank, num_workers=workers, table_base=base,
                        overlap=overlap)
                    started.wait()
                    for x, y in batches:
                        part = slice(rank * len(x) // workers, (rank + 1) * len(x) // workers)
                        opt.zero_grad()
                        torch.nn.functional.cross_entropy(model(x[part]), y[part]).backward()
                        opt.step()
                    opt.flush()
                    models[rank] = model
                    cluster.unregister_worker(rank)
            except BaseException as e:  # noqa: BLE001 - reported by the test thread
                errors.insert(0, e)

        threads = [threading.Thread(target=work, args=(r,)) for r in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
            self.assertFalse(t.is_alive(), "a worker did not finish within 120 s")
        if errors:
            raise AssertionError(" / ".join(repr(e) for e in reversed(errors))) from errors[-1]
        return models

    def check(self, make, lr: float, workers: int) -> None:
        batches = data(STEPS, 32)
        ref = self.reference(make, batches, lr)
        torch.manual_seed(0)
        start = make()
        models = self.train(make, batches, lr, workers)
        moved = max_diff(ref, start)
        self.assertGreater(moved, 100 * ATOL, "the reference did not train")
        for rank, m in enumerate(models):
            self.assertLess(max_diff(m, ref), ATOL, f"worker {rank} vs torch.optim.Adam")
        if workers > 1:  # BSP: every worker ends with the same values, bit for bit
            for m in models[1:]:
                self.assertEqual(max_diff(m, models[0]), 0.0)

    def test_mlp_one_worker_equals_torch_adam(self) -> None:
        self.check(Mlp, 1e-2, workers=1)

    def test_mlp_two_workers_bsp_equal_torch_adam(self) -> None:
        self.check(Mlp, 1e-2, workers=2)

    def test_conv_gru_two_workers_bsp_equal_torch_adam(self) -> None:
        self.check(ConvGru, 1e-2, workers=2)

    def test_asp_trains(self) -> None:
        batches = data(STEPS, 32)
        torch.manual_seed(0)
        start = Mlp()
        models = self.train(Mlp, batches, 1e-2, workers=2, consistency="asp")
        self.assertGreater(max_diff(models[0], start), 100 * ATOL)

    def test_overlap_trains_on_values_one_step_old(self) -> None:
        # One worker on ASP tables (each push applied as it arrives): whatever the timing,
        # step S computes on the values before step S-1's update; flush() brings the last.
        batches = data(STEPS, 32)
        ref = self.reference(Mlp, batches, 1e-2, one_step_old=True)
        synchronous = self.reference(Mlp, batches, 1e-2)
        self.assertGreater(max_diff(ref, synchronous), 100 * ATOL, "overlap would be a no-op")
        [model] = self.train(Mlp, batches, 1e-2, workers=1, consistency="asp", overlap=True)
        self.assertLess(max_diff(model, ref), ATOL)

    def test_overlap_with_two_workers_under_ssp_trains(self) -> None:
        batches = data(STEPS, 32)
        torch.manual_seed(0)
        start = Mlp()
        models = self.train(Mlp, batches, 1e-2, workers=2, consistency="ssp", staleness=1,
                            overlap=True)
        for m in models:
            self.assertGreater(max_diff(m, start), 100 * ATOL)

    def test_overlap_under_bsp_is_refused(self) -> None:
        with pscluster.connect(self.local.coordinator, timeout=TIMEOUT) as cluster:
            with self.assertRaises(pscluster.PsError) as e:
                pst.ParameterServerOptimizer(Mlp(), cluster, consistency="bsp", overlap=True,
                                             table_base=self.base())
            self.assertIn("overlap=True", str(e.exception))

    def test_a_module_with_the_same_sizes_in_another_layout_is_refused(self) -> None:
        """Worker 1's weight is worker 0's transposed (as many values): refused, not summed
        into the same table."""
        base = self.base()
        with pscluster.connect(self.local.coordinator, timeout=TIMEOUT) as cluster:
            with self.assertRaises(pscluster.PsError):  # worker 1 never comes: gives up at once
                pst.ParameterServerOptimizer(torch.nn.Linear(4, 2, bias=False), cluster,
                                             num_workers=2, table_base=base, wait_timeout=0.1)
            with self.assertRaises(pscluster.PsError) as e:
                pst.ParameterServerOptimizer(torch.nn.Linear(2, 4, bias=False), cluster,
                                             worker=1, num_workers=2, table_base=base)
            self.assertEqual(e.exception.code, grpc.StatusCode.ALREADY_EXISTS)
            self.assertIn("[2, 4]", str(e.exception))
            cluster.unregister_worker(0)

    def test_embedding_equals_torch_embedding_with_adagrad(self) -> None:
        # Adagrad leaves rows without gradient exactly as they are in both (sparse
        # semantics), so a sparse table matches a dense torch.nn.Embedding. The server's
        # rows start from its initializer: copy them into the reference first.
        num, dim, lr = 5000, 6, 0.1
        with pscluster.connect(self.local.coordinator, timeout=TIMEOUT) as cluster:
            emb = pst.Embedding(cluster, "emb_test", num, dim, table_id=self.base(),
                                optimizer="adagrad", lr=lr, initializer="normal", scale=0.5,
                                seed=3, epsilon=1e-10, initial_accumulator=0.1)
            head = torch.nn.Linear(3 * dim, 2)
            model = torch.nn.Sequential()
            model.emb, model.head = emb, head
            opt = pst.ParameterServerOptimizer(model, cluster, optimizer="adagrad", lr=lr,
                                               table_base=self.base(), epsilon=1e-10,
                                               initial_accumulator=0.1)
            ref_emb = torch.nn.Embedding(num, dim)
            with torch.no_grad():
                ref_emb.weight.copy_(torch.from_numpy(cluster.pull_sparse(emb.table,
                                                                          np.arange(num))))
            ref_head = torch.nn.Linear(3 * dim, 2)
            ref_head.load_state_dict(head.state_dict())
            ref_opt = torch.optim.Adagrad(list(ref_emb.parameters()) + list(ref_head.parameters()),
                                          lr=lr, eps=1e-10, initial_accumulator_value=0.1)
            g = torch.Generator().manual_seed(5)
            touched = set()
            for step in range(STEPS):
                ids = torch.randint(0, 50, (16, 3), generator=g)  # repeats within a batch
                touched.update(ids.reshape(-1).tolist())
                y = torch.randint(0, 2, (16,), generator=g)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(head(emb(ids).reshape(16, -1)), y).backward()
                opt.step()
                ref_opt.zero_grad()
                torch.nn.functional.cross_entropy(ref_head(ref_emb(ids).reshape(16, -1)),
                                                  y).backward()
                ref_opt.step()
            rows = cluster.pull_sparse(emb.table, np.arange(num), step=STEPS)
            self.assertLess(np.abs(rows - ref_emb.weight.detach().numpy()).max(), ATOL)
            self.assertLess(max_diff(head, ref_head), ATOL)
            # Pulls read untouched rows from the initializer; only pushes make rows.
            self.assertEqual(sum(i.num_rows for i in cluster.describe(emb.table)), len(touched))
            with self.assertRaises(pscluster.PsError) as e:
                emb(torch.tensor([num]))
            self.assertIn(str(num), e.exception.message)
            cluster.unregister_worker(0)

    def test_embedding_ids_near_the_top_of_a_huge_key_space_are_taken(self) -> None:
        """Ids are checked as integers: 2^63 - 1 is inside [0, 2^63) (numpy compared it as a
        float and refused it); -1 is not."""
        with pscluster.connect(self.local.coordinator, timeout=TIMEOUT) as cluster:
            emb = pst.Embedding(cluster, "huge_keys", 2 ** 63, 4, table_id=self.base(),
                                optimizer="sgd", lr=0.1)
            self.assertEqual(tuple(emb(torch.tensor([2 ** 63 - 1, 0])).shape), (2, 4))
            with self.assertRaises(pscluster.PsError) as e:
                emb(torch.tensor([-1]))
            self.assertIn("id -1 is outside", e.exception.message)

    def test_a_step_whose_wait_timed_out_can_be_taken_again(self) -> None:
        """Under BSP worker 0's step times out waiting for worker 1; once worker 1 has
        stepped, worker 0's step() again pulls (its push is in) instead of failing for ever
        with 'already pushed step 0', and both end with the same values."""
        base = self.base()
        models = [torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)]
        models[1].load_state_dict(models[0].state_dict())
        clusters = [pscluster.connect(self.local.coordinator, timeout=1.0),
                    pscluster.connect(self.local.coordinator, timeout=TIMEOUT)]
        opts = [None, None]

        def make(rank: int) -> None:
            opts[rank] = pst.ParameterServerOptimizer(models[rank], clusters[rank], lr=0.1,
                                                      worker=rank, num_workers=2,
                                                      table_base=base, wait_timeout=TIMEOUT)
        other = threading.Thread(target=make, args=(1,))
        other.start()
        make(0)
        other.join(timeout=60)
        x = torch.ones(4, 3)
        try:
            for rank in (0, 1):
                opts[rank].zero_grad()
                models[rank](x).sum().backward()
            with self.assertRaises(pscluster.PsError) as e:
                opts[0].step()  # worker 1 has not pushed: the wait times out
            self.assertEqual(e.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
            opts[1].step()
            opts[0].step()  # only pulls now
            self.assertEqual(max_diff(models[0], models[1]), 0.0)
        finally:
            for rank, c in enumerate(clusters):
                c.unregister_worker(rank)
                c.close()

    def test_a_step_cut_short_by_a_stopped_shard_is_finished_with_its_first_gradients(
            self) -> None:
        """Shard 1 is stopped while the (one) worker steps: the dense and the embedding
        pushes reach shard 0 only, and step() raises. Once the shard runs again, step() after
        a backward on other data finishes step 0 with the first gradients on both shards
        (before: the dense part took half of each gradient, and the Embedding failed on every
        later step with 'step 1 is already applied'), and training goes on."""
        base, lr = self.base(), 0.5
        with pscluster.connect(self.local.coordinator, timeout=1.0) as cluster:
            emb = pst.Embedding(cluster, f"cut_short_{base}", 64, 4, table_id=base + 50,
                                optimizer="sgd", lr=lr, initializer="normal", scale=0.5, seed=1)
            model = torch.nn.Sequential()
            model.emb, model.lin = emb, torch.nn.Linear(4, 8)
            opt = pst.ParameterServerOptimizer(model, cluster, optimizer="sgd", lr=lr,
                                               table_base=base)
            ids = torch.arange(16)  # distinct keys, on both shards
            self.assertEqual(set(cluster.shard_of(ids.numpy()).tolist()), {0, 1})
            w0 = model.lin.weight.detach().clone()
            rows0 = cluster.pull_sparse(emb.table, ids.numpy())

            def backward(x_scale: float) -> None:
                opt.zero_grad()
                (model.lin(model.emb(ids)) * x_scale).square().sum().backward()

            backward(1.0)
            g_lin = model.lin.weight.grad.clone()
            g_rows = emb._batches[0][1].grad.numpy().copy()
            os.kill(self.local.shards[1].proc.pid, signal.SIGSTOP)
            try:
                with self.assertRaises(pscluster.PsError) as e:
                    opt.step()
            finally:
                os.kill(self.local.shards[1].proc.pid, signal.SIGCONT)
            self.assertIn("step() again finishes it", e.exception.message)
            self.assertEqual(opt.step_count, 0)
            backward(3.0)  # the caller's retry: these gradients are not step 0's
            opt.step()
            self.assertEqual(opt.step_count, 1)
            np.testing.assert_allclose(model.lin.weight.detach().numpy(),
                                       (w0 - lr * g_lin).numpy(), rtol=0, atol=1e-6)
            np.testing.assert_allclose(cluster.pull_sparse(emb.table, ids.numpy(), step=1),
                                       rows0 - lr * g_rows, rtol=0, atol=1e-6)
            backward(1.0)
            opt.step()  # and the next step goes through
            self.assertEqual((opt.step_count, emb.step_), (2, 2))
            cluster.unregister_worker(0)

    def test_an_asp_step_cut_short_is_not_applied_twice_on_retry(self) -> None:
        """ASP shards apply every push they get: step() again after a step cut short by a
        stopped shard only pulls, so each value took the step's update once, or (on the shard
        that missed it) not at all; never twice."""
        base, lr = self.base(), 0.5
        with pscluster.connect(self.local.coordinator, timeout=1.0) as cluster:
            model = torch.nn.Linear(4, 8, bias=False)
            opt = pst.ParameterServerOptimizer(model, cluster, optimizer="sgd", lr=lr,
                                               consistency="asp", table_base=base)
            w0 = model.weight.detach().clone()
            opt.zero_grad()
            model(torch.ones(1, 4)).square().sum().backward()
            once = w0 - lr * model.weight.grad
            os.kill(self.local.shards[1].proc.pid, signal.SIGSTOP)
            try:
                with self.assertRaises(pscluster.PsError):
                    opt.step()
                with self.assertRaises(pscluster.PsError) as e:  # a retry while still stopped
                    opt.step()
                self.assertIn("step() again only pulls", e.exception.message)
            finally:
                os.kill(self.local.shards[1].proc.pid, signal.SIGCONT)
            opt.step()
            self.assertEqual(opt.step_count, 1)
            got = torch.from_numpy(cluster.pull_dense(opt.tables[0], step=1)).reshape(8, 4)
            self.assertTrue(bool(((got == once) | (got == w0)).all()), f"{got} vs {once}")
            self.assertTrue(bool((got == once).any()), "shard 0 took the push")
            cluster.unregister_worker(0)

    def test_a_replicated_shard_survives_its_head_right_after_the_start(self) -> None:
        """Worker 0's start-up writes the initial values (ImportDense), which leaves each
        chain's head alone until its backup has copied the state back; the optimizer waits
        for that, so the head's death right after the start fails over instead of losing the
        shard (before: the backup looped joining from the dead head)."""
        with tempfile.TemporaryDirectory(prefix="pst_replicated_") as tmp:
            local = LocalCluster(num_shards=1, replicas=2, log_dir=tmp,
                                 coordinator_args=["--heartbeat_timeout_ms=600"])
            try:
                with pscluster.connect(local.coordinator, timeout=TIMEOUT,
                                       wait_until_complete=True) as cluster:
                    model = torch.nn.Linear(3, 2, bias=False)
                    opt = pst.ParameterServerOptimizer(model, cluster, optimizer="sgd", lr=0.5)
                    self.assertTrue(cluster.wait_for_chains(0.0))
                    w0 = model.weight.detach().clone()
                    local.replicas[0][0].kill()  # SIGKILL of the head
                    opt.zero_grad()
                    model(torch.ones(1, 3)).sum().backward()
                    want = w0 - 0.5 * model.weight.grad
                    opt.step()  # waits out the failover
                    self.assertTrue(torch.equal(model.weight.detach(), want))
            finally:
                local.stop()

    def test_a_shard_restarted_under_asp_stops_the_steps_saying_why(self) -> None:
        """ASP goes on through a shard that restarted from an older snapshot, mixing its
        state with the others' without a word (red team); step() now notices the shard's new
        incarnation in the coordinator's view and says to roll back."""
        with tempfile.TemporaryDirectory(prefix="pst_restart_") as tmp:
            local = LocalCluster(num_shards=2, data_dir=tmp, log_dir=tmp,
                                 coordinator_args=["--heartbeat_timeout_ms=600"])
            try:
                with pscluster.connect(local.coordinator, timeout=TIMEOUT) as cluster:
                    model = torch.nn.Linear(4, 8, bias=False)
                    opt = pst.ParameterServerOptimizer(model, cluster, optimizer="sgd", lr=0.5,
                                                       consistency="asp", check_shards_every=0)

                    def step() -> None:
                        opt.zero_grad()
                        model(torch.ones(1, 4)).sum().backward()
                        opt.step()

                    step()
                    cluster.checkpoint()
                    step()
                    args = local.shards[1].args
                    local.shards[1].kill()
                    again = local._start("shard1-again", args + ["--restore=latest"])
                    again.wait_for(r"registered with the coordinator")
                    with self.assertRaises(pscluster.PsError) as e:
                        step()
                    self.assertEqual(e.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
                    self.assertIn("shard 1 registered again", e.exception.message)
                    self.assertEqual(opt.step_count, 2)
            finally:
                local.stop()

    def test_table_ids_past_the_limit_are_refused_before_any_table_is_made(self) -> None:
        with pscluster.connect(self.local.coordinator, timeout=TIMEOUT) as cluster:
            with self.assertRaises(pscluster.PsError) as e:
                pst.ParameterServerOptimizer(torch.nn.Linear(2, 2), cluster,
                                             table_base=2 ** 32 - 1)
            self.assertIn("ids up to 4294967296", e.exception.message)
            with self.assertRaises(pscluster.PsError) as e:
                cluster.describe(2 ** 32 - 1)
            self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_float64_model_is_refused(self) -> None:
        with pscluster.connect(self.local.coordinator, timeout=TIMEOUT) as cluster:
            with self.assertRaises(pscluster.PsError) as e:
                pst.ParameterServerOptimizer(torch.nn.Linear(3, 3).double(), cluster,
                                             table_base=self.base())
            self.assertIn("float32", e.exception.message)

    def test_a_second_run_on_a_trained_model_says_how_to_resume(self) -> None:
        """A script run again against the same cluster and table_base: worker 0 would write
        step 0's values into tables at a later step. It says to resume or use other tables
        (before: 'cannot export step 0 ... stop the workers')."""
        base = self.base()
        with pscluster.connect(self.local.coordinator, timeout=TIMEOUT) as cluster:
            model = torch.nn.Linear(3, 2)
            opt = pst.ParameterServerOptimizer(model, cluster, lr=0.1, table_base=base)
            for _ in range(2):
                opt.zero_grad()
                model(torch.ones(1, 3)).sum().backward()
                opt.step()
            cluster.unregister_worker(0)
            with self.assertRaises(pscluster.PsError) as e:
                pst.ParameterServerOptimizer(torch.nn.Linear(3, 2), cluster, lr=0.1,
                                             table_base=base)
            self.assertEqual(e.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("pass step=2 to resume", e.exception.message)
            resumed = pst.ParameterServerOptimizer(torch.nn.Linear(3, 2), cluster, lr=0.1,
                                                   table_base=base, step=2)
            self.assertEqual(resumed.step_count, 2)
            cluster.unregister_worker(0)

    def test_module_checks_come_before_any_table(self) -> None:
        """A parameter with no elements is refused before a table exists; consistency is
        taken in any case, as the tables take it."""
        base = self.base()
        with pscluster.connect(self.local.coordinator, timeout=TIMEOUT) as cluster:
            model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 0))
            with self.assertRaises(pscluster.PsError) as e:
                pst.ParameterServerOptimizer(model, cluster, table_base=base)
            self.assertIn("has no elements", e.exception.message)
            with self.assertRaises(pscluster.PsError):
                cluster.describe(base)  # no table was made
            opt = pst.ParameterServerOptimizer(torch.nn.Linear(3, 2), cluster,
                                               consistency="ASP", overlap=True,
                                               table_base=self.base())
            opt.flush()
            cluster.unregister_worker(0)


if __name__ == "__main__":
    import pytest
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-p", "no:cacheprovider"]))
