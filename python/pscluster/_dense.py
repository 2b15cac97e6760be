"""The dense tensor calls, one of Cluster's parts: a dense tensor is split into contiguous
balanced ranges, one per shard (shard_range); each shard's slice travels unary, streamed in
chunks, or batched with the step's other tensors. With pscluster._native built, the same
calls go through the C++ client instead.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple, TypeVar, Union

import grpc
import numpy as np

from pscluster import _wire
from pscluster._errors import PsError, _already_pushed, _float32, _output, _step_and_worker
from pscluster._shards import UNARY_PULL_BYTES, _Shards, _native, _native_error
from pscluster.proto import ps_pb2

T = TypeVar("T")


def shard_range(size: int, shard: int, num_shards: int) -> Tuple[int, int]:
    """[begin, end) of a dense tensor of `size` values that `shard` holds (DenseShardRange)."""
    return size * shard // num_shards, size * (shard + 1) // num_shards


class _DenseCalls:
    """Offers pull_dense, push_dense, push_pull_dense, set_dense and native. Needs the host's
    _shards, timeout, chunk_bytes, num_shards, _native (the C++ client, or None), and the
    table and worker parts' _spec_of_kind, _check_finite, _ensure_registered and
    _forgot_worker."""

    _shards: _Shards
    timeout: float
    chunk_bytes: int
    num_shards: int

    @property
    def native(self) -> bool:
        """Whether the dense data calls go through the C++ client (pscluster._native)."""
        return self._native is not None

    def _native_call(self, fn: Callable[..., T], *args) -> T:
        """fn(*args) on the C++ client; its error becomes a PsError (the shard it names)."""
        self._shards.check_open()
        try:
            return fn(*args)
        except _native.Error as e:
            code, message, shard = _native_error(e)
            raise PsError(code, self._forgot_worker(code, message), shard) from None

    def pull_dense(self, table: Union[str, int], step: int = 0, worker: int = 0,
                   out: Optional[np.ndarray] = None) -> np.ndarray:
        """The whole tensor at `step` (BSP/SSP: waits, bounded by the timeout, until the
        table's consistency bound lets `worker` read it): into `out` (a C-contiguous float32
        array of the table's size, any shape) or a new flat array."""
        step, worker = _step_and_worker(step, worker)
        spec = self._spec_of_kind(table, worker)
        out = _output(out, spec.size, f"table {spec.table_id}")
        self._ensure_registered(worker)
        if self._native is not None:
            self._native_call(self._native.pull_dense, worker, spec.table_id, step, out)
            return out
        self._shards.each(lambda s: self._pull_shard(
            s, spec.table_id, step, worker, *shard_range(spec.size, s, self.num_shards), out))
        return out

    def _pull_shard(self, shard: int, table_id: int, step: int, worker: int, begin: int,
                    end: int, out: np.ndarray) -> None:
        req = ps_pb2.PullDenseRequest(worker_id=worker, step=step, table_id=table_id,
                                      offset=begin, length=end - begin,
                                      chunk_bytes=self.chunk_bytes)
        view = memoryview(out.reshape(-1)[begin:end]).cast("B")  # each chunk lands here
        nbytes = (end - begin) * 4
        name = self._shards.name
        if nbytes <= min(self.chunk_bytes, UNARY_PULL_BYTES):
            chunk = self._shards.call(shard, lambda _: self._shards.head(shard).pull_unary(
                req, timeout=self.timeout))
            if chunk.data.nbytes != nbytes:
                raise PsError(grpc.StatusCode.INTERNAL,
                              f"{name(shard)} answered {chunk.data.nbytes} bytes, "
                              f"expected {nbytes}", shard)
            view[:] = chunk.data
            return

        def stream(_) -> int:
            got = 0
            for chunk in self._shards.head(shard).pull_stream(req, timeout=self.timeout):
                n = chunk.data.nbytes
                if chunk.offset * 4 != begin * 4 + got or n > nbytes - got or n % 4:
                    raise PsError(grpc.StatusCode.INTERNAL,
                                  f"{name(shard)} sent a chunk at offset {chunk.offset} "
                                  f"with {n} bytes after {got // 4} of {end - begin} values",
                                  shard)
                view[got:got + n] = chunk.data
                got += n
            return got

        got = self._shards.call(shard, stream)
        if got != nbytes:
            raise PsError(grpc.StatusCode.DATA_LOSS,
                          f"{name(shard)} pull stream ended after {got // 4} of "
                          f"{end - begin} values", shard)

    def push_dense(self, table: Union[str, int], grad: np.ndarray, step: int = 0,
                   worker: int = 0) -> None:
        """Pushes the whole tensor's gradient for `step` (float32, the table's size; the
        server's optimizer applies it)."""
        step, worker = _step_and_worker(step, worker)
        spec = self._spec_of_kind(table, worker)
        flat = _float32(grad, spec.size, f"table {spec.table_id}", "gradient")
        if self._native is None:  # the C++ client checks as it sends
            self._check_finite(spec, flat)
        self._ensure_registered(worker)
        if self._native is not None:
            self._native_call(self._native.push_dense, worker, spec.table_id, step, flat)
            return
        self._shards.each(lambda s: self._push_shard(
            s, spec.table_id, step, worker, *shard_range(spec.size, s, self.num_shards), flat))

    def _push_shard(self, shard: int, table_id: int, step: int, worker: int, begin: int,
                    end: int, grad: np.ndarray) -> None:
        # A shard whose part is empty still gets the (empty) push: the table's clock there
        # moves with the others' (a checkpoint's step and later pulls wait on it).
        per_chunk = max(1, self.chunk_bytes // 4)
        data = memoryview(grad).cast("B")  # grad: flat C-contiguous float32

        def chunk(offset: int, n: int):
            return (_wire.chunk_header(worker, step, table_id, offset, end - begin, begin),
                    data[offset * 4:(offset + n) * 4])

        if end - begin <= per_chunk:
            self._shards.call(shard, lambda _: self._shards.head(shard).push_unary(
                chunk(begin, end - begin), timeout=self.timeout))
            return
        chunks = (chunk(o, min(per_chunk, end - o)) for o in range(begin, end, per_chunk))
        self._shards.call(shard, lambda _: self._shards.head(shard).push_stream(
            chunks, timeout=self.timeout))

    def push_pull_dense(self, tables: Sequence[Union[str, int]], grads: Sequence[np.ndarray],
                        step: int, worker: int = 0,
                        outs: Optional[Sequence[np.ndarray]] = None,
                        repeat: bool = False) -> List[np.ndarray]:
        """One training step of a model's dense tensors: pushes grads[i] to tables[i] for
        `step` and pulls every table at step + 1, into outs[i] (or new flat arrays). Each
        shard gets one call (PushPullDenseBatch: the push, the consistency wait and the pull
        in one round trip) when its part fits one message; else its tensors stream.
        repeat: the same call again after it failed (BSP tables): a shard that took the
        push then (it answers "already pushed" or "already applied") is only pulled from."""
        step, worker = _step_and_worker(step, worker)
        if len(tables) != len(grads) or (outs is not None and len(outs) != len(tables)):
            raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{len(tables)} tables, {len(grads)} gradients"
                          + ("" if outs is None else f", {len(outs)} outputs"))
        specs = [self._spec_of_kind(t, worker) for t in tables]
        flats = [_float32(g, sp.size, f"table {sp.table_id}", "gradient")
                 for g, sp in zip(grads, specs)]
        for sp, g in zip(specs, flats):
            if self._native is None:  # the C++ client checks every tensor before it sends
                self._check_finite(sp, g)
        outs = [_output(None if outs is None else o, sp.size, f"table {sp.table_id}")
                for o, sp in zip(outs or [None] * len(specs), specs)]
        self._ensure_registered(worker)
        if self._native is not None and not repeat:
            self._native_call(self._native.push_pull_dense, worker, step,
                              [sp.table_id for sp in specs], flats, outs)
            return outs
        self._shards.each(lambda s: self._push_pull_shard(s, specs, flats, step, worker, outs,
                                                          repeat))
        return outs

    def _push_pull_shard(self, shard: int, specs: List[ps_pb2.TableSpec],
                         flats: List[np.ndarray], step: int, worker: int,
                         outs: List[np.ndarray], repeat: bool = False) -> None:
        ranges = [shard_range(sp.size, shard, self.num_shards) for sp in specs]

        def pushed_before(e: PsError) -> bool:  # a repeat's push this shard took already
            return repeat and _already_pushed(e, step)

        def pull_all() -> None:  # every table's part here, at step + 1
            for sp, (b, e), o in zip(specs, ranges, outs):
                self._pull_shard(shard, sp.table_id, step + 1, worker, b, e, o)

        if sum(e - b for b, e in ranges) * 4 > self.chunk_bytes:  # too big for one message
            for sp, (b, e), g in zip(specs, ranges, flats):
                try:
                    self._push_shard(shard, sp.table_id, step, worker, b, e, g)
                except PsError as err:
                    if not pushed_before(err):
                        raise
            pull_all()
            return
        # A table whose part here is empty still gets its (empty) chunk: its clock on this
        # shard moves with the others', or a later pull of it alone would wait for ever.
        batch = [(_wire.chunk_header(worker, step, sp.table_id, b, e - b, b),
                  memoryview(g[b:e]).cast("B"))
                 for sp, (b, e), g in zip(specs, ranges, flats)]
        try:
            chunks = self._shards.call(shard, lambda _: self._shards.head(
                shard).push_pull_batch(batch, timeout=self.timeout))
        except PsError as err:
            if not pushed_before(err):
                raise
            pull_all()
            return
        self._take_batch(shard, specs, ranges, chunks, outs)

    def _take_batch(self, shard: int, specs: List[ps_pb2.TableSpec],
                    ranges: List[Tuple[int, int]], chunks, outs: List[np.ndarray]) -> None:
        """A PushPullDenseBatch's answer, one chunk per table, into each table's output."""
        if len(chunks) != len(specs):
            raise PsError(grpc.StatusCode.INTERNAL, f"{self._shards.name(shard)} answered "
                          f"{len(chunks)} chunks for {len(specs)} tables", shard)
        for i, chunk in enumerate(chunks):
            b, e = ranges[i]
            if chunk.data.nbytes != (e - b) * 4:
                raise PsError(grpc.StatusCode.INTERNAL,
                              f"{self._shards.name(shard)} answered {chunk.data.nbytes} bytes "
                              f"for table {specs[i].table_id}, expected {(e - b) * 4}", shard)
            memoryview(outs[i].reshape(-1)[b:e]).cast("B")[:] = chunk.data

    def set_dense(self, table: Union[str, int], values: np.ndarray, step: int = 0) -> None:
        """Replaces the table's values (a model's initial parameters) as of `step` (BSP:
        pulls at `step` see them), keeping its optimizer state: ExportDense of each shard's
        state, its values replaced, ImportDense (all or nothing per shard). For setting up a
        table, not for one that workers push to at the same time."""
        spec = self._spec_of_kind(table, -1)
        flat = _float32(values, spec.size, f"table {spec.table_id}", "values")

        def one(shard: int) -> None:
            b, e = shard_range(spec.size, shard, self.num_shards)
            req = ps_pb2.ExportDenseRequest(table_id=spec.table_id, step=step)
            chunks = list(self._shards.call(shard, lambda stub: list(
                stub.ExportDense(req, timeout=self.timeout))))
            for c in chunks:
                n = len(c.values)
                c.step = step
                c.values[:] = flat[c.begin:c.begin + n]
            if b < e and sum(len(c.values) for c in chunks) != e - b:
                raise PsError(grpc.StatusCode.INTERNAL,
                              f"{self._shards.name(shard)} exported "
                              f"{sum(len(c.values) for c in chunks)} values of [{b}, {e})",
                              shard)
            self._shards.call(shard, lambda stub: stub.ImportDense(iter(chunks),
                                                                   timeout=self.timeout))

        self._shards.each(one)
