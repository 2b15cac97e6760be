"""The sparse row calls, one of Cluster's parts: a sparse table's row `key` lives on shard
Mix64(key) % num_shards (common/sharding.cc's SparseShardOf), so a call asks each shard
for its own keys only.
"""
from __future__ import annotations

from typing import Union

import grpc
import numpy as np

from pscluster._errors import PsError, _already_pushed, _float32, _step_and_worker
from pscluster._shards import _Shards
from pscluster.proto import ps_pb2

# The keys and gradients one PushSparse may carry: ps_server's default --max_chunk_bytes.
SPARSE_PUSH_BYTES = 4 << 20


def _mix64(x: np.ndarray) -> np.ndarray:
    """common/sharding.cc's Mix64 (splitmix64's finaliser), elementwise on uint64."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class _SparseCalls:
    """Offers shard_of, pull_sparse and push_sparse. Needs the host's _shards, timeout,
    chunk_bytes, num_shards, and the table and worker parts' _spec_of_kind, _check_finite
    and _ensure_registered."""

    _shards: _Shards
    timeout: float
    chunk_bytes: int
    num_shards: int

    def shard_of(self, keys: np.ndarray) -> np.ndarray:
        """The shard of each key (common/sharding.cc's SparseShardOf)."""
        return (_mix64(np.asarray(keys, dtype=np.uint64)) %
                np.uint64(self.num_shards)).astype(np.int64)

    def _sparse_keys(self, table: Union[str, int], keys, worker: int):
        """The sparse table's spec and `keys` checked and as uint64."""
        spec = self._spec_of_kind(table, worker, ps_pb2.TableSpec.SPARSE)
        keys = np.asarray(keys)
        if keys.ndim != 1 or (keys.size and keys.dtype.kind not in "iu"):
            raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"table {spec.table_id}: keys must be a 1-D array of integers, got "
                          f"shape {keys.shape} of {keys.dtype}")
        if keys.dtype.kind == "i" and keys.size and keys.min() < 0:
            raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"table {spec.table_id}: key {int(keys.min())} is negative")
        keys = keys.astype(np.uint64, copy=False)
        # Checked here, not only by each shard: a push one shard refused for its keys would
        # be applied by the others.
        if spec.key_space and keys.size and int(keys.max()) >= spec.key_space:
            raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"table {spec.table_id}: key {int(keys.max())} is outside the key "
                          f"space [0, {spec.key_space}); nothing was sent")
        return spec, keys

    def pull_sparse(self, table: Union[str, int], keys, step: int = 0, worker: int = 0
                    ) -> np.ndarray:
        """The rows of `keys` (any order, repeats allowed) at `step`: an array of shape
        (len(keys), dim). Each distinct key is asked once; rows not yet touched come from
        the table's initializer."""
        step, worker = _step_and_worker(step, worker)
        spec, keys = self._sparse_keys(table, keys, worker)
        unique, inverse = np.unique(keys, return_inverse=True)
        shards = self.shard_of(unique)
        rows = np.empty((unique.size, spec.dim), dtype=np.float32)
        per_call = max(1, self.chunk_bytes // (4 * spec.dim))
        self._ensure_registered(worker)

        def one(shard: int) -> None:
            idx = np.flatnonzero(shards == shard)
            for at in range(0, idx.size, per_call):
                part = idx[at:at + per_call]
                req = ps_pb2.SparseRequest(worker_id=worker, step=step,
                                           table_id=spec.table_id, keys=unique[part].tolist())
                resp = self._shards.call(shard, lambda stub: stub.PullSparse(
                    req, timeout=self.timeout))
                if len(resp.values) != part.size * spec.dim * 4:
                    raise PsError(grpc.StatusCode.INTERNAL,
                                  f"{self._shards.name(shard)} answered {len(resp.values)} "
                                  f"bytes for {part.size} rows of {spec.dim}", shard)
                rows[part] = np.frombuffer(resp.values, np.float32).reshape(part.size, spec.dim)

        self._shards.each(one)
        return rows[inverse]

    def push_sparse(self, table: Union[str, int], keys, grads: np.ndarray, step: int = 0,
                    worker: int = 0, repeat: bool = False) -> None:
        """Pushes one gradient row per key for `step` (repeated keys: their rows are summed,
        one optimizer update per key). Every shard gets the call, with no keys when none of
        them is its (BSP counts every worker's push per step on every shard). repeat: the
        same push again after it failed (BSP tables): a shard that took it then (it answers
        "already pushed" or "already applied") counts as done."""
        step, worker = _step_and_worker(step, worker)
        spec, keys = self._sparse_keys(table, keys, worker)
        shards = self.shard_of(keys)
        parts = [np.flatnonzero(shards == s) for s in range(self.num_shards)]
        shape = np.shape(grads)
        if len(shape) > 1 and tuple(shape) != (keys.size, spec.dim):
            raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"table {spec.table_id}: gradient rows of shape {tuple(shape)} for "
                          f"{keys.size} keys of dim {spec.dim} ({keys.size * spec.dim} values): "
                          "(keys, dim) or flat; nothing was sent")
        grads = _float32(grads, keys.size * spec.dim, f"table {spec.table_id}",
                         f"gradient ({keys.size} keys x dim {spec.dim})")
        self._check_finite(spec, grads)
        rows = grads.reshape(keys.size, spec.dim)
        # A shard takes at most SPARSE_PUSH_BYTES of keys and rows in one message: a larger
        # part goes in several, numbered (a BSP shard counts the push at its last part).
        per_push = max(1, SPARSE_PUSH_BYTES // (8 + 4 * spec.dim))
        self._ensure_registered(worker)
        applied = [False] * self.num_shards

        def one(s: int) -> None:
            idx = parts[s]
            count = max(1, -(-idx.size // per_push))
            for n, at in enumerate(range(0, max(idx.size, 1), per_push)):
                piece = idx[at:at + per_push]
                try:
                    self._shards.call(s, lambda stub: stub.PushSparse(
                        ps_pb2.SparseRequest(worker_id=worker, step=step,
                                             table_id=spec.table_id, keys=keys[piece].tolist(),
                                             grads=rows[piece].tobytes(), part=n,
                                             parts=count if count > 1 else 0),
                        timeout=self.timeout))
                except PsError as e:
                    if not (repeat and _already_pushed(e, step)):
                        raise
                applied[s] = applied[s] or piece.size > 0

        try:
            self._shards.each(one)
        except PsError as e:
            # A shard's own refusal (its row limit) comes after the others applied theirs.
            done = [s for s in range(self.num_shards) if applied[s]]
            if not done:
                raise
            raise PsError(e.code, f"{e.message}; shard(s) {', '.join(map(str, done))} applied "
                          "their keys of this push (a sparse push is not atomic across "
                          "shards): push the other shards' keys again for this step once they "
                          "can take them, or restore a checkpoint", e.shard) from None
