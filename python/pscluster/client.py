"""The Python client: dense tables on a sharded parameter server (proto/ps.proto).

It mirrors the C++ PsClient (client/ps/): a dense tensor of `size` float32 values is split
into contiguous balanced ranges, one per shard (common/sharding.cc's DenseShardRange); every
shard is called in parallel, each with a deadline; slices larger than the chunk size travel
as streams of bounded chunks (PushDenseStream/PullDenseStream), small ones unary.
"""
from __future__ import annotations

import concurrent.futures
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import grpc
import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from proto import coordinator_pb2, coordinator_pb2_grpc, ps_pb2, ps_pb2_grpc

T = TypeVar("T")

# As the C++ client (PsClientOptions, dense.cc): chunks of 1 MiB, unary pulls up to 256 KiB,
# messages up to the server's default --max_chunk_bytes (4 MiB) plus headers.
DEFAULT_CHUNK_BYTES = 1 << 20
UNARY_PULL_BYTES = 256 << 10
MAX_MESSAGE_BYTES = (4 << 20) + (64 << 10)

_OPTIMIZERS = {k.lower(): v for k, v in ps_pb2.OptimizerConfig.Kind.items()}
_CONSISTENCY = {k.lower(): v for k, v in ps_pb2.ConsistencyConfig.Mode.items()}
_INITIALIZERS = {k.lower(): v for k, v in ps_pb2.InitializerConfig.Kind.items()}


class PsError(Exception):
    """A failed call: `code` is a grpc.StatusCode, `shard` the shard's index (None when the
    error is not one shard's: the coordinator, or a check made before anything was sent)."""

    def __init__(self, code: grpc.StatusCode, message: str, shard: Optional[int] = None):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.shard = shard


def shard_range(size: int, shard: int, num_shards: int) -> Tuple[int, int]:
    """[begin, end) of a dense tensor of `size` values that `shard` holds (DenseShardRange)."""
    return size * shard // num_shards, size * (shard + 1) // num_shards


def _enum(table: Dict[str, int], value: Union[str, int], what: str) -> int:
    if isinstance(value, str):
        if value.lower() not in table:
            raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"unknown {what} {value!r}; one of {sorted(table)}")
        return table[value.lower()]
    return int(value)


class Cluster:
    """Channels to every shard of one cluster. Thread-safe; close() (or `with`) when done."""

    def __init__(self, shard_addresses: Sequence[str], timeout: float = 10.0,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 coordinator: Optional[str] = None):
        if not shard_addresses or any(not a for a in shard_addresses):
            raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"every shard needs an address; got {list(shard_addresses)}")
        self.addresses: List[str] = list(shard_addresses)
        self.timeout = timeout
        self.chunk_bytes = chunk_bytes
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        self._channels = [grpc.insecure_channel(a, options=options) for a in self.addresses]
        self._stubs = [ps_pb2_grpc.ParameterServerStub(c) for c in self._channels]
        self._coordinator_address = coordinator
        self._coordinator: Optional[coordinator_pb2_grpc.CoordinatorStub] = None
        self._coordinator_channel: Optional[grpc.Channel] = None
        if coordinator:
            self._coordinator_channel = grpc.insecure_channel(coordinator)
            self._coordinator = coordinator_pb2_grpc.CoordinatorStub(self._coordinator_channel)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(self.addresses))
        self._lock = threading.Lock()
        self._specs: Dict[int, ps_pb2.TableSpec] = {}
        self._names: Dict[str, int] = {}
        self._registered: set = set()

    @classmethod
    def from_shards(cls, shard_addresses: Sequence[str], timeout: float = 10.0,
                    **kwargs) -> "Cluster":
        """A cluster without a coordinator: the shards' addresses, by shard id."""
        return cls(shard_addresses, timeout=timeout, **kwargs)

    @property
    def num_shards(self) -> int:
        return len(self._stubs)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for c in self._channels:
            c.close()
        if self._coordinator_channel is not None:
            self._coordinator_channel.close()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- calls -------------------------------------------------------------------------

    def _name(self, shard: int) -> str:
        return f"shard {shard} ({self.addresses[shard]})"

    def _call(self, shard: int, fn: Callable[[ps_pb2_grpc.ParameterServerStub], T]) -> T:
        """fn(stub) on one shard; a gRPC error becomes a PsError naming the shard."""
        try:
            return fn(self._stubs[shard])
        except grpc.RpcError as e:
            raise PsError(e.code(), f"{self._name(shard)}: {e.details()}", shard) from None

    def _each(self, fn: Callable[[int], T]) -> List[T]:
        """fn(shard) on every shard in parallel; raises the first error in shard order."""
        futures = [self._pool.submit(fn, s) for s in range(self.num_shards)]
        results, first = [], None
        for f in futures:
            try:
                results.append(f.result())
            except Exception as e:  # noqa: BLE001 - re-raised below, after every shard ended
                results.append(None)
                first = first or e
        if first is not None:
            raise first
        return results

    def register_worker(self, worker: int = 0) -> None:
        """Registers `worker` with every shard (done on its first push or pull)."""
        req = ps_pb2.RegisterWorkerRequest(worker_id=worker)
        self._each(lambda s: self._call(
            s, lambda stub: stub.RegisterWorker(req, timeout=self.timeout)))
        with self._lock:
            self._registered.add(worker)

    def _ensure_registered(self, worker: int) -> None:
        with self._lock:
            if worker in self._registered:
                return
        self.register_worker(worker)

    # ---- tables ------------------------------------------------------------------------

    def create_dense(self, name_or_id: Union[str, int], size: int,
                     optimizer: Union[str, int] = "sgd", learning_rate: float = 0.01,
                     consistency: Union[str, int] = "asp", staleness: int = 0,
                     initializer: Union[str, int] = "zeros", value: float = 0.0,
                     scale: float = 0.0, seed: int = 0, table_id: Optional[int] = None,
                     skip_nonfinite: bool = False, worker: int = 0,
                     **optimizer_fields) -> int:
        """Creates a dense table of `size` float32 values on every shard (CreateTable;
        idempotent for an identical spec) and returns its table id. A str names the table
        (its id is `table_id`, else the next free one this client knows); an int is the id.
        `optimizer_fields` are OptimizerConfig's other fields (momentum, beta1, ...)."""
        if isinstance(name_or_id, str):
            name = name_or_id
            if table_id is None:
                with self._lock:
                    table_id = self._names.get(name, max(self._specs, default=0) + 1)
        else:
            table_id, name = int(name_or_id), str(name_or_id)
        if size <= 0:
            raise PsError(grpc.StatusCode.INVALID_ARGUMENT, f"table {name}: size must be > 0")
        spec = ps_pb2.TableSpec(
            table_id=table_id, name=name, kind=ps_pb2.TableSpec.DENSE, size=size,
            optimizer=ps_pb2.OptimizerConfig(
                kind=_enum(_OPTIMIZERS, optimizer, "optimizer"), learning_rate=learning_rate,
                **optimizer_fields),
            consistency=ps_pb2.ConsistencyConfig(
                mode=_enum(_CONSISTENCY, consistency, "consistency"), staleness=staleness),
            initializer=ps_pb2.InitializerConfig(
                kind=_enum(_INITIALIZERS, initializer, "initializer"), value=value,
                scale=scale, seed=seed),
            skip_nonfinite=skip_nonfinite)
        req = ps_pb2.CreateTableRequest(worker_id=worker, spec=spec)
        self._each(lambda s: self._call(
            s, lambda stub: stub.CreateTable(req, timeout=self.timeout)))
        with self._lock:
            self._specs[table_id] = spec
            self._names[name] = table_id
        return table_id

    def _table_id(self, table: Union[str, int]) -> int:
        if isinstance(table, str):
            with self._lock:
                if table not in self._names:
                    raise PsError(grpc.StatusCode.NOT_FOUND,
                                  f"no table named {table!r} created by this client")
                return self._names[table]
        return int(table)

    def spec(self, table: Union[str, int], worker: int = 0) -> ps_pb2.TableSpec:
        """The table's spec, cached, else asked of shard 0 (DescribeTable)."""
        table_id = self._table_id(table)
        with self._lock:
            if table_id in self._specs:
                return self._specs[table_id]
        req = ps_pb2.DescribeTableRequest(worker_id=worker, table_id=table_id)
        info = self._call(0, lambda stub: stub.DescribeTable(req, timeout=self.timeout))
        with self._lock:
            self._specs[table_id] = info.spec
        return info.spec

    def _dense_spec(self, table: Union[str, int], worker: int) -> ps_pb2.TableSpec:
        spec = self.spec(table, worker)
        if spec.kind != ps_pb2.TableSpec.DENSE:
            raise PsError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"table {spec.table_id} is not DENSE")
        return spec

    # ---- dense tensors -----------------------------------------------------------------

    def pull_dense(self, table: Union[str, int], step: int = 0, worker: int = 0) -> np.ndarray:
        """The whole tensor at `step`: a new float32 array of the table's size."""
        spec = self._dense_spec(table, worker)
        self._ensure_registered(worker)
        out = np.empty(spec.size, dtype=np.float32)
        self._each(lambda s: self._pull_shard(s, spec.table_id, step, worker,
                                              *shard_range(spec.size, s, self.num_shards), out))
        return out

    def _pull_shard(self, shard: int, table_id: int, step: int, worker: int, begin: int,
                    end: int, out: np.ndarray) -> None:
        if end == begin:
            return
        req = ps_pb2.PullDenseRequest(worker_id=worker, step=step, table_id=table_id,
                                      offset=begin, length=end - begin)
        view = out[begin:end].view(np.uint8)  # each chunk's bytes are copied straight here
        nbytes = (end - begin) * 4
        if nbytes <= min(self.chunk_bytes, UNARY_PULL_BYTES):
            chunk = self._call(shard, lambda stub: stub.PullDense(req, timeout=self.timeout))
            if len(chunk.data) != nbytes:
                raise PsError(grpc.StatusCode.INTERNAL,
                              f"{self._name(shard)} answered {len(chunk.data)} bytes, "
                              f"expected {nbytes}", shard)
            view[:] = np.frombuffer(chunk.data, dtype=np.uint8)
            return

        def stream(stub: ps_pb2_grpc.ParameterServerStub) -> int:
            got = 0
            for chunk in stub.PullDenseStream(req, timeout=self.timeout):
                n = len(chunk.data)
                if chunk.offset * 4 != begin * 4 + got or n > nbytes - got or n % 4:
                    raise PsError(grpc.StatusCode.INTERNAL,
                                  f"{self._name(shard)} sent a chunk at offset {chunk.offset} "
                                  f"with {n} bytes after {got // 4} of {end - begin} values",
                                  shard)
                view[got:got + n] = np.frombuffer(chunk.data, dtype=np.uint8)
                got += n
            return got

        got = self._call(shard, stream)
        if got != nbytes:
            raise PsError(grpc.StatusCode.DATA_LOSS,
                          f"{self._name(shard)} pull stream ended after {got // 4} of "
                          f"{end - begin} values", shard)

    def push_dense(self, table: Union[str, int], grad: np.ndarray, step: int = 0,
                   worker: int = 0) -> None:
        """Pushes the whole tensor's gradient for `step` (float32, the table's size; the
        server's optimizer applies it)."""
        spec = self._dense_spec(table, worker)
        grad = np.asarray(grad)
        if grad.dtype != np.float32:
            raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"table {spec.table_id}: the gradient must be float32, not {grad.dtype}")
        if grad.size != spec.size:
            raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"table {spec.table_id} holds {spec.size} values; the gradient has "
                          f"{grad.size}")
        flat = np.ascontiguousarray(grad).reshape(-1)
        if flat.dtype.byteorder == ">":
            flat = flat.astype("<f4")
        self._ensure_registered(worker)
        self._each(lambda s: self._push_shard(s, spec.table_id, step, worker,
                                              *shard_range(spec.size, s, self.num_shards), flat))

    def _push_shard(self, shard: int, table_id: int, step: int, worker: int, begin: int,
                    end: int, grad: np.ndarray) -> None:
        if end == begin:
            return
        per_chunk = max(1, self.chunk_bytes // 4)

        def chunk(offset: int, n: int) -> ps_pb2.DenseChunk:
            return ps_pb2.DenseChunk(worker_id=worker, step=step, table_id=table_id,
                                     offset=offset, total_length=end - begin, begin=begin,
                                     data=grad[offset:offset + n].tobytes())

        if end - begin <= per_chunk:
            self._call(shard, lambda stub: stub.PushDense(chunk(begin, end - begin),
                                                         timeout=self.timeout))
            return
        chunks = (chunk(o, min(per_chunk, end - o)) for o in range(begin, end, per_chunk))
        self._call(shard, lambda stub: stub.PushDenseStream(chunks, timeout=self.timeout))

    # ---- the coordinator ---------------------------------------------------------------

    def view(self) -> coordinator_pb2.ClusterView:
        """The coordinator's cluster view (GetView)."""
        if self._coordinator is None:
            raise PsError(grpc.StatusCode.FAILED_PRECONDITION,
                          "this cluster has no coordinator (Cluster.from_shards)")
        return _get_view(self._coordinator, self._coordinator_address, self.timeout)

    def status(self) -> dict:
        """The coordinator's view as a dict (field names as in coordinator.proto); without a
        coordinator, just the shard addresses."""
        if self._coordinator is None:
            return {"num_shards": self.num_shards, "shard_addresses": list(self.addresses)}
        return _to_dict(self.view())


def _to_dict(message: Message) -> dict:
    """Every field of `message` (defaults too) by its proto name; enums by name, 64-bit
    integers as ints (json_format would make them strings)."""
    out = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)

        def convert(v):
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                return _to_dict(v)
            if field.type == FieldDescriptor.TYPE_ENUM:
                return field.enum_type.values_by_number[v].name if v in \
                    field.enum_type.values_by_number else v
            return v

        if field.label == FieldDescriptor.LABEL_REPEATED:
            out[field.name] = [convert(v) for v in value]
        else:
            out[field.name] = convert(value)
    return out


def _get_view(stub: coordinator_pb2_grpc.CoordinatorStub, address: str, timeout: float,
              wait_until_complete: bool = False) -> coordinator_pb2.ClusterView:
    try:
        return stub.GetView(coordinator_pb2.GetViewRequest(
            wait_until_complete=wait_until_complete), timeout=timeout)
    except grpc.RpcError as e:
        raise PsError(e.code(), f"coordinator ({address}): {e.details()}") from None


def connect(coordinator_address: str, timeout: float = 10.0,
            wait_until_complete: bool = False, **kwargs) -> Cluster:
    """A Cluster from the coordinator's view: one channel per shard of its shard map.
    With wait_until_complete, first waits (bounded by `timeout`) until every shard has
    registered."""
    channel = grpc.insecure_channel(coordinator_address)
    try:
        view = _get_view(coordinator_pb2_grpc.CoordinatorStub(channel), coordinator_address,
                         timeout, wait_until_complete)
    finally:
        channel.close()
    missing = [i for i, a in enumerate(view.shard_addresses) if not a]
    if not view.shard_addresses or missing:
        raise PsError(grpc.StatusCode.UNAVAILABLE,
                      f"coordinator ({coordinator_address}): shards {missing} of "
                      f"{view.num_shards} have not registered")
    return Cluster(list(view.shard_addresses), timeout=timeout,
                   coordinator=coordinator_address, **kwargs)
