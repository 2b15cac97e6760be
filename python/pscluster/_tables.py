"""Table administration, one of Cluster's parts: creating dense and sparse tables, finding
a table by name or id, and the specs the data calls check their arguments against.
"""
from __future__ import annotations

import hashlib
import threading
from typing import Dict, List, Union

import grpc
import numpy as np

from pscluster._errors import PsError, _enum, _whole
from pscluster._shards import _Shards
from pscluster.proto import ps_pb2

_OPTIMIZERS = {k.lower(): v for k, v in ps_pb2.OptimizerConfig.Kind.items()}
_CONSISTENCY = {k.lower(): v for k, v in ps_pb2.ConsistencyConfig.Mode.items()}
_INITIALIZERS = {k.lower(): v for k, v in ps_pb2.InitializerConfig.Kind.items()}

# A table created by name takes an id from the name's hash in [2^31, 2^32) (ids given
# explicitly, as pscluster.torch's and ps_worker's, stay below), or, when a table of another
# name holds it, one of the next NAME_PROBES - 1.
NAME_PROBES = 16


def _name_id(name: str, probe: int) -> int:
    h = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return (1 << 31) + (h + probe) % (1 << 31)


def _make_spec(table_id: int, name: str, kind: int, shape: dict, optimizer="sgd",
               learning_rate: float = 0.01, consistency="asp", staleness: int = 0,
               initializer="zeros", value: float = 0.0, scale: float = 0.0, seed: int = 0,
               skip_nonfinite: bool = False, **optimizer_fields) -> ps_pb2.TableSpec:
    """A TableSpec. optimizer: sgd, momentum, adagrad, adam, adamw, ftrl (or the enum);
    consistency: bsp, ssp (with staleness), asp; initializer: zeros, constant (value),
    uniform (U(-scale, scale)), normal (N(0, scale^2)), seeded by `seed`."""
    try:
        return ps_pb2.TableSpec(
            table_id=table_id, name=name, kind=kind, **shape,
            optimizer=ps_pb2.OptimizerConfig(
                kind=_enum(_OPTIMIZERS, optimizer, "optimizer"), learning_rate=learning_rate,
                **optimizer_fields),
            consistency=ps_pb2.ConsistencyConfig(
                mode=_enum(_CONSISTENCY, consistency, "consistency"), staleness=staleness),
            initializer=ps_pb2.InitializerConfig(
                kind=_enum(_INITIALIZERS, initializer, "initializer"), value=value,
                scale=scale, seed=seed),
            skip_nonfinite=skip_nonfinite)
    except (ValueError, TypeError) as e:  # an unknown OptimizerConfig field, a wrong type
        raise PsError(grpc.StatusCode.INVALID_ARGUMENT, f"table {name}: {e}") from None


class _TableCalls:
    """Offers create_dense, create_sparse, describe, applied_step and spec. Needs the host's
    _shards (a _Shards), timeout, _lock, and _specs and _names: the specs and name-to-id map
    this client has seen, which spare the data calls a DescribeTable each."""

    _shards: _Shards
    timeout: float
    _lock: threading.Lock
    _specs: Dict[int, ps_pb2.TableSpec]
    _names: Dict[str, int]

    def create_dense(self, name_or_id: Union[str, int], size: int, *,
                     worker: int = 0, **spec) -> int:
        """Creates a dense table of `size` float32 values, split across the shards, and
        returns its id. `spec`: see _make_spec (optimizer, learning_rate, consistency,
        staleness, initializer, value, scale, seed, table_id, skip_nonfinite, and
        OptimizerConfig's other fields: momentum, beta1, ...)."""
        if size <= 0:
            raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"table {name_or_id}: size must be > 0, got {size}")
        return self._create(name_or_id, ps_pb2.TableSpec.DENSE, worker, spec, size=size)

    def create_sparse(self, name_or_id: Union[str, int], dim: int, *, key_space: int = 0,
                      admit_after_pushes: int = 0, evict_after_steps: int = 0,
                      admission_counters: int = 0, worker: int = 0, **spec) -> int:
        """Creates a sparse table of rows of `dim` float32 values keyed by uint64 (keys <
        `key_space`, 0 = any), rows made on first touch by the initializer, and returns its
        id. An id gets a row once `admit_after_pushes` pushes carried it; a row no update
        touched for `evict_after_steps` steps is dropped (SparseRowPolicy in ps.proto).
        `spec` as for create_dense."""
        if dim <= 0:
            raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"table {name_or_id}: dim must be > 0, got {dim}")
        rows = ps_pb2.SparseRowPolicy(admit_after_pushes=admit_after_pushes,
                                      evict_after_steps=evict_after_steps,
                                      admission_counters=admission_counters)
        return self._create(name_or_id, ps_pb2.TableSpec.SPARSE, worker, spec, dim=dim,
                            key_space=key_space, rows=rows)

    def _create(self, name_or_id: Union[str, int], kind: int, worker: int, options: dict,
                **shape) -> int:
        """CreateTable on every shard (idempotent for an identical spec). A name is the
        cluster's: its id comes from its hash (_name_id), so every client that creates or
        uses it finds the same one; a table of another name there (a collision): the next
        one, up to NAME_PROBES."""
        table_id = options.pop("table_id", None)
        if table_id is not None:
            table_id = _whole(table_id, "table_id", 0, 2 ** 32 - 1)
        if not isinstance(name_or_id, str):
            table_id = _whole(name_or_id, "table id", 0, 2 ** 32 - 1)
            name_or_id = str(name_or_id)
        if table_id is not None or name_or_id in self._names:
            return self._create_as(self._names.get(name_or_id, table_id), name_or_id, kind,
                                   worker, options, shape)
        # The id a name takes comes from its hash: every client finds the same one without
        # asking anyone. Another name there already (a collision): the next one.
        for probe in range(NAME_PROBES):
            table_id = _name_id(name_or_id, probe)
            try:
                return self._create_as(table_id, name_or_id, kind, worker, options, shape)
            except PsError as e:
                if e.code != grpc.StatusCode.ALREADY_EXISTS or self._spec_at(table_id).name in (
                        name_or_id, ""):
                    raise
        raise PsError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      f"table {name_or_id!r}: the {NAME_PROBES} ids its name may take hold "
                      "tables of other names; give it a table_id")

    def _create_as(self, table_id: int, name: str, kind: int, worker: int, options: dict,
                   shape: dict) -> int:
        spec = _make_spec(table_id, name, kind, shape, **options)
        req = ps_pb2.CreateTableRequest(worker_id=worker, spec=spec)
        # Shard 0 first: of two clients creating one id with different specs at once, the
        # one shard 0 refuses stops there, and no shard is left holding the other's spec.
        self._shards.call(0, lambda stub: stub.CreateTable(req, timeout=self.timeout))
        self._shards.each(lambda s: None if s == 0 else self._shards.call(
            s, lambda stub: stub.CreateTable(req, timeout=self.timeout)))
        with self._lock:
            self._specs[table_id] = spec
            self._names[name] = table_id
        return table_id

    def _spec_at(self, table_id: int) -> ps_pb2.TableSpec:
        """Shard 0's spec of `table_id` (an empty one when there is none)."""
        req = ps_pb2.DescribeTableRequest(worker_id=0, table_id=table_id)
        try:
            return self._shards.call(0, lambda stub: stub.DescribeTable(
                req, timeout=self.timeout)).spec
        except PsError as e:
            if e.code != grpc.StatusCode.NOT_FOUND:
                raise
            return ps_pb2.TableSpec()

    def describe(self, table: Union[str, int], worker: int = 0) -> List[ps_pb2.TableInfo]:
        """Every shard's TableInfo of the table (its range or rows, BSP's applied steps)."""
        req = ps_pb2.DescribeTableRequest(worker_id=worker, table_id=self._table_id(table))
        return self._shards.each(lambda s: self._shards.call(
            s, lambda stub: stub.DescribeTable(req, timeout=self.timeout)))

    def applied_step(self, table: Union[str, int]) -> int:
        """BSP: the steps every shard has fully applied to the table (the step to pull).
        SSP/ASP (pushes applied as they arrive): the steps every worker has pushed."""
        return min(info.applied_steps for info in self.describe(table))

    def _table_id(self, table: Union[str, int]) -> int:
        if isinstance(table, str):
            with self._lock:
                if table in self._names:
                    return self._names[table]
            spec = None  # one another client created: at the id its name took
            for probe in range(NAME_PROBES):
                found = self._spec_at(_name_id(table, probe))
                if found.name in (table, ""):
                    spec = found if found.name else None
                    break
            if spec is None:
                raise PsError(grpc.StatusCode.NOT_FOUND,
                              f"no table named {table!r} on the shards; create it first")
            with self._lock:
                self._specs[spec.table_id] = spec
                self._names[table] = spec.table_id
            return spec.table_id
        return _whole(table, "table id", 0, 2 ** 32 - 1)

    def spec(self, table: Union[str, int], worker: int = 0) -> ps_pb2.TableSpec:
        """The table's spec, cached, else asked of shard 0 (DescribeTable)."""
        table_id = self._table_id(table)
        with self._lock:
            if table_id in self._specs:
                return self._specs[table_id]
        req = ps_pb2.DescribeTableRequest(worker_id=worker, table_id=table_id)
        info = self._shards.call(0, lambda stub: stub.DescribeTable(req, timeout=self.timeout))
        with self._lock:
            self._specs[table_id] = info.spec
        return info.spec

    @staticmethod
    def _check_finite(spec: ps_pb2.TableSpec, values: np.ndarray) -> None:
        """Refuses NaN/Inf before anything is sent (each shard checks only its own part, so
        a push that one shard refused would be applied by the others). Tables with
        skip_nonfinite are left to the shards. The float64 sum of float32 values is finite
        exactly when every value is, and costs one pass."""
        if spec.skip_nonfinite or np.isfinite(values.sum(dtype=np.float64)):
            return
        bad = np.flatnonzero(~np.isfinite(values.reshape(-1)))
        raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                      f"table {spec.table_id}: the gradient holds {bad.size} NaN/Inf values "
                      f"(the first at index {int(bad[0])}); nothing was sent")

    def _spec_of_kind(self, table: Union[str, int], worker: int,
                      kind: int = ps_pb2.TableSpec.DENSE) -> ps_pb2.TableSpec:
        spec = self.spec(table, worker)
        if spec.kind != kind:
            raise PsError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"table {spec.table_id} is {ps_pb2.TableSpec.Kind.Name(spec.kind)}, "
                          f"not {ps_pb2.TableSpec.Kind.Name(kind)}")
        return spec
