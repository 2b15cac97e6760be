"""PyTorch on the parameter server: any torch.nn.Module's parameters on the shards.

    import torch, pscluster, pscluster.torch as pst
    cluster = pscluster.connect("127.0.0.1:7000")
    torch.manual_seed(0)                         # the same initial model on every worker
    model = MyModel()
    opt = pst.ParameterServerOptimizer(model, cluster, optimizer="adam", lr=1e-3,
                                       consistency="bsp", worker=rank, num_workers=world)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()                               # push the gradients, pull the new values

The optimizer runs on the servers (the tables' optimizer: sgd, momentum, adagrad, adam,
adamw, ftrl), so a step is one PushPullDenseBatch per shard: every parameter's gradient
goes up and its new value comes back into the parameter's own memory, in one round trip.
Worker 0 writes the model's initial values into the tables; the workers then meet (every
one registered with every shard) before the first step, so BSP step 0 waits for all.

Gradients are scaled by 1 / num_workers before the push: a BSP step applies the sum of the
workers' gradients, which is then the gradient of the mean loss over the global batch, as
with DistributedDataParallel.

With `overlap=True` (needs consistency "ssp" with staleness >= 1, or "asp") a step's push
and pull run on the client's pool while the next forward and backward run on the values
the step before brought, one step older, which that consistency allows (ps_worker
--overlap_push does the same): the step then takes about the longer of compute and round
trip, not their sum. The module's values then trail by the step in flight: call
`flush()` before evaluating or saving the module, and at the end.

`Embedding` is an embedding bag whose rows live in a sparse table: forward pulls the rows a
batch touches (each distinct id once), backward gives their gradients, and the optimizer's
step pushes them, so the table can be far larger than one worker's memory.
"""
from __future__ import annotations

import time
from typing import Dict, Iterable, List, Optional, Tuple, Union

import grpc
import numpy as np
import torch

from pscluster.client import Cluster, PsError, _already_pushed

# Table ids of a model: `table_base + i` for its i-th parameter (every worker numbers the
# same module's parameters identically) and `table_base + 10000 + j` for its j-th Embedding.
DEFAULT_TABLE_BASE = 1000
EMBEDDING_OFFSET = 10000


def _numpy(t: torch.Tensor, what: str) -> np.ndarray:
    if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
        raise PsError(_invalid(), f"{what} must be a contiguous float32 CPU tensor, not "
                      f"{t.dtype} on {t.device}{'' if t.is_contiguous() else ' (strided)'}")
    return t.detach().numpy().reshape(-1)


def _invalid():
    import grpc
    return grpc.StatusCode.INVALID_ARGUMENT


class Embedding(torch.nn.Module):
    """An embedding whose `num_embeddings` x `embedding_dim` rows are a sparse table on the
    shards (rows made on first touch by the table's initializer: `initializer`, `scale`,
    `seed`). forward(ids) returns (*ids.shape, embedding_dim); the rows' gradients are
    pushed by ParameterServerOptimizer.step() (or push()). Holds only the rows of the
    batches since the last push."""

    def __init__(self, cluster: Cluster, name: str, num_embeddings: int, embedding_dim: int,
                 *, table_id: Optional[int] = None, optimizer: str = "adam",
                 lr: float = 1e-3, consistency: str = "bsp", staleness: int = 0,
                 initializer: str = "normal", scale: float = 0.01, seed: int = 0,
                 worker: int = 0, grad_scale: float = 1.0, **optimizer_fields):
        super().__init__()
        if num_embeddings <= 0 or embedding_dim <= 0:
            raise PsError(_invalid(), f"embedding {name}: num_embeddings and embedding_dim "
                          f"must be > 0, got {num_embeddings} x {embedding_dim}")
        self.cluster, self.name = cluster, name
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.worker = worker
        self.step_ = 0
        self._spec = dict(key_space=num_embeddings, optimizer=optimizer, learning_rate=lr,
                          consistency=consistency, staleness=staleness,
                          initializer=initializer, scale=scale, seed=seed,
                          **optimizer_fields)
        self.table: Optional[int] = None
        if table_id is not None:
            self.create(table_id)
        self._batches: List[Tuple[np.ndarray, torch.Tensor]] = []
        # A push that failed: (step, keys, gradients), sent again by the next push().
        self._unfinished: Optional[Tuple[int, np.ndarray, np.ndarray]] = None
        # Each row's gradient is multiplied by this before the push (the optimizer that
        # holds the Embedding sets it to its own: 1 / workers, the mean over workers).
        self.grad_scale = grad_scale

    def create(self, table_id: int) -> int:
        """Creates (or finds, for an identical spec) the sparse table: done by the optimizer
        when the Embedding has no table id of its own."""
        self.table = self.cluster.create_sparse(self.name, self.embedding_dim, worker=self.worker,
                                                table_id=table_id, **self._spec)
        return self.table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.table is None:
            raise PsError(_invalid(), f"embedding {self.name} has no table yet: give it a "
                          "table_id or hand its module to ParameterServerOptimizer first")
        if ids.dtype not in (torch.int64, torch.int32):
            raise PsError(_invalid(), f"embedding {self.name}: ids must be int64 or int32, "
                          f"not {ids.dtype}")
        flat = ids.reshape(-1).numpy()
        # Compared as Python ints: numpy would compare an int64 array with a bound past
        # 2^63 - 1 through float64 and refuse valid ids near it.
        lo, hi = (int(flat.min()), int(flat.max())) if flat.size else (0, -1)
        if lo < 0 or hi >= self.num_embeddings:
            raise PsError(_invalid(), f"embedding {self.name}: id {lo if lo < 0 else hi} is "
                          f"outside [0, {self.num_embeddings})")
        unique, inverse = np.unique(flat, return_inverse=True)
        rows = self.cluster.pull_sparse(self.table, unique, step=self.step_, worker=self.worker)
        weight = torch.from_numpy(rows).requires_grad_(self.training)
        if self.training:
            self._batches.append((unique, weight))
        return weight[torch.from_numpy(inverse)].reshape(*ids.shape, self.embedding_dim)

    def push(self) -> None:
        """Pushes the gradients of every row pulled since the last push, for this step, and
        moves to the next step. Pushes (with no rows) even when forward did not run: a BSP
        step waits for every worker's push. After a push that failed (some shards may have
        taken their rows), the next push() sends that same push again, the shards that took
        it counting it done, and keeps the rows pulled since for the step after."""
        repeat = self._unfinished is not None and self._unfinished[0] == self.step_
        if repeat and self._spec["consistency"].lower() != "bsp":
            # SSP/ASP shards apply every push they get (no record of steps to answer a
            # repeat with): a shard that took the failed push would apply it twice. The
            # shards that did not take it lose it, as an asynchronous update may be lost.
            self._unfinished = None
            self.step_ += 1
            return
        if not repeat:
            keys = [k for k, _ in self._batches]
            grads = [(w.grad if w.grad is not None else torch.zeros_like(w)).numpy()
                     for _, w in self._batches]
            self._batches = []
            dim = self.embedding_dim
            keys = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
            grads = (np.concatenate(grads) if grads else np.zeros((0, dim), np.float32))
            if self.grad_scale != 1.0:
                grads = grads * np.float32(self.grad_scale)
            self._unfinished = (self.step_, keys, np.ascontiguousarray(grads, np.float32))
        step, keys, grads = self._unfinished
        self.cluster.push_sparse(self.table, keys, grads, step=step, worker=self.worker,
                                 repeat=repeat)
        self._unfinished = None
        self.step_ += 1


class ParameterServerOptimizer:
    """Trains `module`'s parameters (and its Embeddings' tables) on the cluster's shards
    with a server-side optimizer. Every worker builds the same module (same seed) and one of
    these with its own `worker` rank; `num_workers` of them train together.

    optimizer/lr/optimizer_fields: the tables' OptimizerConfig (e.g. beta1, weight_decay).
    consistency: bsp, ssp (with staleness) or asp. step: the step to start at (0, or a
    restored checkpoint's: then the values come from the server, not the module).
    overlap: each step's push and pull in the background while the next step computes
    (ssp with staleness >= 1, or asp; see the module's docstring and flush()).
    check_shards_every: seconds between step()'s looks at the coordinator's view for a shard
    that restarted (FAILED_PRECONDITION then: roll back to a checkpoint)."""

    def __init__(self, module: torch.nn.Module, cluster: Cluster, *, optimizer: str = "adam",
                 lr: float = 1e-3, consistency: str = "bsp", staleness: int = 0,
                 worker: int = 0, num_workers: int = 1, step: int = 0,
                 table_base: int = DEFAULT_TABLE_BASE, name: str = "model",
                 grad_scale: Optional[float] = None, wait_timeout: Optional[float] = None,
                 overlap: bool = False, check_shards_every: float = 2.0,
                 **optimizer_fields):
        if not 0 <= worker < num_workers:
            raise PsError(_invalid(), f"worker {worker} is outside [0, {num_workers})")
        consistency = str(consistency).lower()  # as the tables take it
        if overlap and not (consistency == "asp" or (consistency == "ssp" and staleness >= 1)):
            raise PsError(_invalid(), "overlap=True reads values one step old: it needs "
                          "consistency='ssp' with staleness >= 1, or 'asp'")
        self.overlap = overlap
        self.bsp = consistency == "bsp"
        self._in_flight = None  # overlap: the push/pull running (a Future), into _incoming
        # A step that failed: (step, its gradients, or None when its dense part got through),
        # finished by the next step() with those gradients.
        self._unfinished: Optional[Tuple[int, Optional[List[np.ndarray]]]] = None
        self.cluster, self.worker, self.num_workers = cluster, worker, num_workers
        self.step_count = step
        self.grad_scale = 1.0 / num_workers if grad_scale is None else grad_scale
        spec = dict(optimizer=optimizer, learning_rate=lr, consistency=consistency,
                    staleness=staleness, **optimizer_fields)
        self.params: List[Tuple[str, torch.nn.Parameter]] = [
            (n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.embeddings: List[Embedding] = [m for m in module.modules()
                                            if isinstance(m, Embedding)]
        self._check_module(table_base)
        self._incoming = ([np.empty(p.numel(), np.float32) for _, p in self.params]
                          if overlap else [])
        # Without overlap each step's scaled gradients are sent before step() returns: one
        # buffer per parameter, reused (with overlap a step's are in flight during the next).
        self._scaled = [] if overlap else [torch.empty(p.shape, dtype=torch.float32)
                                           for _, p in self.params]
        self._create_tables(name, table_base, spec)
        if worker == 0 and step == 0:
            self._write_initial_values(wait_timeout)
        # Registered only now: no other worker's step 0 can be applied before worker 0 has
        # written the initial values (a BSP step waits for every registered worker).
        cluster.register_worker(worker)
        cluster.wait_for_workers(num_workers, wait_timeout)
        if step > 0 or worker != 0:
            self._pull(step)
        # A shard that restarts holds its snapshot's state (or none): under SSP/ASP the
        # steps go on without a word (BSP waits, then names the missing steps). Every
        # check_shards_every seconds step() compares the shards' incarnations with these.
        self._check_every = check_shards_every
        self._incarnations = cluster.shard_incarnations()
        self._checked_at = time.monotonic()

    def _check_module(self, table_base: int) -> None:
        """Refuses a module the tables cannot hold before any table is made: a refusal
        leaves none behind."""
        for n, p in self.params:
            _numpy(p.data, f"parameter {n}")
            if p.numel() == 0:
                raise PsError(_invalid(), f"parameter {n} has no elements (shape "
                              f"{list(p.shape)}): a table needs at least one value")
        ids = [table_base + i for i in range(len(self.params))] + [
            table_base + EMBEDDING_OFFSET + j for j, e in enumerate(self.embeddings)
            if e.table is None]
        last = max(ids, default=table_base)
        if table_base < 0 or last > 2 ** 32 - 1:
            raise PsError(_invalid(), f"table_base={table_base}: this module's tables would "
                          f"take ids up to {last}; table ids are in [0, 2^32 - 1]")

    def _create_tables(self, name: str, table_base: int, spec: dict) -> None:
        # The shape in the name: a worker whose module has the same sizes in another layout
        # (a transposed weight) is refused (ALREADY_EXISTS naming both) instead of summing
        # its gradients into this one's.
        self.tables = [self.cluster.create_dense(f"{name}/{n}{list(p.shape)}", p.numel(),
                                                 table_id=table_base + i,
                                                 worker=self.worker, **spec)
                       for i, (n, p) in enumerate(self.params)]
        for j, e in enumerate(self.embeddings):
            if e.table is None:
                e.create(table_base + EMBEDDING_OFFSET + j)
            e.worker, e.step_, e.grad_scale = self.worker, self.step_count, self.grad_scale

    def _write_initial_values(self, wait_timeout: Optional[float]) -> None:
        """Worker 0 at step 0: the module's values into fresh tables, refusing tables that
        a run before has trained."""
        for t, (n, p) in zip(self.tables, self.params):
            trained = self.cluster.applied_step(t)
            if trained > 0:
                raise PsError(grpc.StatusCode.FAILED_PRECONDITION,
                              f"table {t} ({n}) has trained to step {trained} already (a "
                              "run against this cluster before, with the same table_base"
                              f"): pass step={trained} to resume it, or another "
                              "table_base and name for a new model")
            self.cluster.set_dense(t, _numpy(p.data, f"parameter {n}"), step=0)
        # Replicated shards: the imports left each head alone until its backups copy
        # the state back; training starts once they have (a head lost before would
        # lose its shard).
        self.cluster.wait_for_chains(wait_timeout)

    def _check_shards(self) -> None:
        if self._incarnations is None or time.monotonic() - self._checked_at < self._check_every:
            return
        now = self.cluster.shard_incarnations() or {}
        self._checked_at = time.monotonic()
        for shard, was in sorted(self._incarnations.items()):
            if now.get(shard, was) != was:
                raise PsError(grpc.StatusCode.FAILED_PRECONDITION,
                              f"shard {shard} registered again since this optimizer started "
                              f"(incarnation {was} -> {now[shard]}): a restarted shard holds "
                              "its snapshot's state or none, and training on would mix it with "
                              "the others'. Roll the cluster back to a checkpoint "
                              "(cluster.restore(step)) and build the optimizer again with "
                              "step=that step", shard)

    def _pull(self, step: int) -> None:
        for t, (n, p) in zip(self.tables, self.params):
            self.cluster.pull_dense(t, step=step, worker=self.worker,
                                    out=_numpy(p.data, f"parameter {n}"))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self) -> None:
        """Pushes every gradient for this step (missing ones as zeros) and pulls the values
        of the next into the parameters: one round trip per shard; the Embeddings' rows are
        pushed at the same time.

        A step that raised (a shard stopped or cut off past the timeout) may have reached
        some shards and not others: calling step() again finishes that step with the
        gradients it sent then, the shards that took them only pulling (BSP), so every shard
        applies the same step; the gradients of that second call are not used. Under SSP and
        ASP, whose shards keep no record of steps to answer a repeat with, step() again only
        pulls: the shards that missed the push lose it (an asynchronous update lost), and
        none applies it twice."""
        self._check_shards()
        step = self.step_count
        if self._unfinished is not None and self._unfinished[0] == step:
            self._finish(step, self._unfinished[1])
            return
        grads = []
        for i, (n, p) in enumerate(self.params):
            g = torch.zeros_like(p.data) if p.grad is None else p.grad.detach()
            if self.grad_scale != 1.0 and not self.overlap:  # into a buffer kept for it
                g = torch.mul(g, self.grad_scale, out=self._scaled[i])
            elif self.grad_scale != 1.0:
                g = g * self.grad_scale
            elif self.overlap:  # sent while the next backward writes p.grad
                g = g.clone()
            grads.append(_numpy(g.contiguous(), f"gradient of {n}"))
        if self.overlap:
            pushes = [self.cluster.submit(e.push) for e in self.embeddings]
            try:
                self.flush()  # the step before's values into the module, _incoming free
                self._in_flight = self.cluster.submit(
                    self.cluster.push_pull_dense, self.tables, grads, step=step,
                    worker=self.worker, outs=self._incoming)
            finally:
                for f in pushes:
                    f.result()
            self.step_count += 1
            return
        self._finish(step, grads, first=True)

    def _finish(self, step: int, grads: Optional[List[np.ndarray]], first: bool = False
                ) -> None:
        """Step `step` without overlap: the dense push/pull (unless grads is None: done)
        and the pushes of the Embeddings still at this step, together. A failure keeps the
        step's gradients for the next step() and says so."""
        pushes = [self.cluster.submit(e.push) for e in self.embeddings if e.step_ == step]
        error: Optional[PsError] = None
        if grads is not None and not first and not self.bsp:
            # SSP/ASP: a repeat would be applied again by the shards that took the push (they
            # keep no record of steps): only pull; the shards that missed it lose it.
            try:
                self._pull(step + 1)
                grads = None
            except PsError as e:
                error = e  # the next retry pulls again, and pushes nothing
        if grads is not None and error is None:
            outs = [_numpy(p.data, f"parameter {n}") for n, p in self.params]
            with torch.no_grad():
                try:
                    # A first try refused as already pushed: this step's push reached the
                    # shards before (a new optimizer at a step some worker process of this
                    # rank already ran): only pull, as a repeat does.
                    try:
                        self.cluster.push_pull_dense(self.tables, grads, step=step,
                                                     worker=self.worker, outs=outs,
                                                     repeat=not first)
                    except PsError as e:
                        if not first or not _already_pushed(e, step):
                            raise
                        self.cluster.push_pull_dense(self.tables, grads, step=step,
                                                     worker=self.worker, outs=outs, repeat=True)
                    grads = None
                except PsError as e:
                    error = e
                    if first:  # the buffers they are in are reused: keep a copy
                        grads = [g.copy() for g in grads]
        for f in pushes:
            try:
                f.result()
            except PsError as e:
                error = error or e
        if error is None:
            self._unfinished = None
            self.step_count += 1
            return
        self._unfinished = (step, grads)
        retry = ("step() again finishes it with the gradients it sent (not that call's)"
                 if self.bsp else "step() again only pulls (the shards that missed this push "
                 "lose it: SSP/ASP shards keep no record of steps to take it again safely)")
        raise PsError(error.code, f"{error.message}; step {step} may have reached some shards "
                      f"and not others: {retry}, or restore a checkpoint", error.shard) from None

    def flush(self) -> None:
        """overlap: waits for the push/pull in flight and puts the values it brought into
        the module (raises its PsError; the module then keeps the older values). A no-op
        without overlap, or with nothing in flight."""
        if self._in_flight is None:
            return
        f, self._in_flight = self._in_flight, None
        f.result()
        with torch.no_grad():
            for (n, p), values in zip(self.params, self._incoming):
                _numpy(p.data, f"parameter {n}")[:] = values

    def state(self) -> Dict[str, Union[int, List[int]]]:
        return {"step": self.step_count, "tables": list(self.tables),
                "embeddings": [e.table for e in self.embeddings]}
