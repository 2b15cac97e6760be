"""The Python client of a sharded parameter server (proto/ps.proto, proto/coordinator.proto).

It mirrors the C++ PsClient (client/ps/):
  - a dense tensor of `size` float32 values is split into contiguous balanced ranges, one
    per shard (common/sharding.cc's DenseShardRange); slices larger than the chunk size
    travel as streams of bounded chunks (PushDenseStream/PullDenseStream), small ones unary;
    many tensors of one step go to each shard in one call (PushPullDenseBatch: the push and
    the pull of the next step in one round trip);
  - a sparse table's row `key` lives on shard Mix64(key) % num_shards (SparseShardOf);
  - every shard is called in parallel, each call with a deadline; every error is a PsError
    carrying the gRPC code, the server's message and the shard.
Each blocking call has an `_async` twin returning a concurrent.futures.Future.

The dense data calls (pull_dense, push_dense, push_pull_dense) go through the C++ client
itself when pscluster._native is built (python/native/native.cc; the .deb does not ship it
yet, and an installed client uses grpc-python): the
same requests on the numpy arrays' memory, with the GIL released, without grpc-python's
per-message copies. `Cluster(native=False)` or PSCLUSTER_NATIVE=0 keeps them on grpc-python.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import itertools
import os
import random
import re
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import grpc
import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from pscluster import _wire
from pscluster.security import Security
from pscluster.proto import coordinator_pb2, coordinator_pb2_grpc, ps_pb2, ps_pb2_grpc

try:  # the C++ data path (python/BUILD.bazel builds it beside the stubs)
    from pscluster import _native
except ImportError:
    _native = None

T = TypeVar("T")

# As the C++ client (PsClientOptions, dense.cc): chunks of 1 MiB, unary pulls up to 256 KiB,
# messages up to the server's default --max_chunk_bytes (4 MiB) plus headers.
DEFAULT_CHUNK_BYTES = 1 << 20
UNARY_PULL_BYTES = 256 << 10
MAX_MESSAGE_BYTES = (4 << 20) + (64 << 10)
# The keys and gradients one PushSparse may carry: ps_server's default --max_chunk_bytes.
SPARSE_PUSH_BYTES = 4 << 20
# gRPC's own answer when every handler thread of a shard is busy (common/grpc_status.h).
THREADPOOL_EXHAUSTED = "Server Threadpool Exhausted"
# What a shard started with --coordinator answers (UNAVAILABLE) until it has registered
# (ParameterServerService::CheckServing): it served no data call yet, so the call is made
# again within the client's timeout.
REGISTERING = "is registering with the coordinator"


def _registering(e: grpc.RpcError) -> bool:
    return e.code() == grpc.StatusCode.UNAVAILABLE and REGISTERING in (e.details() or "")


_REQUEST_COUNTER = itertools.count(1)
_CODES = {c.value[0]: c for c in grpc.StatusCode}
_SHARD_NAMED = re.compile(r"shard (\d+) \(")  # how the C++ client's errors begin
_NOT_REGISTERED = re.compile(r"worker_id (\d+) is not registered with shard")  # shard.cc

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


def _whole(value, name: str, lo: int, hi: int) -> int:
    """`value` as an int in [lo, hi] (the wire's range: Python's ints have none), else
    INVALID_ARGUMENT naming it."""
    if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
            or not lo <= int(value) <= hi):
        raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                      f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


# A table created by name takes an id from the name's hash in [2^31, 2^32) (ids given
# explicitly, as pscluster.torch's and ps_worker's, stay below), or, when a table of another
# name holds it, one of the next NAME_PROBES - 1.
NAME_PROBES = 16


def _name_id(name: str, probe: int) -> int:
    h = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return (1 << 31) + (h + probe) % (1 << 31)


def _check_timeout(timeout) -> None:
    if (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
            or not 0 < timeout < float("inf")):
        raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                      f"timeout must be a finite number of seconds > 0, got {timeout!r}")


def _step_and_worker(step, worker) -> Tuple[int, int]:
    return _whole(step, "step", 0, 2 ** 63 - 1), _whole(worker, "worker", 0, 2 ** 31 - 1)


def _already_pushed(e: PsError, step: int) -> bool:
    """A BSP shard's refusal of a push of `step` it has taken already (a repeat)."""
    return e.code == grpc.StatusCode.FAILED_PRECONDITION and re.search(
        rf"already pushed step {step}(?!\d)|(?<!\d)step {step} is already applied",
        e.message) is not None


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


class _Replica:
    """The calls to one ps_server: its stub, and the bulk calls with DenseChunk coded by
    hand (_wire.py: one copy out, none in)."""

    def __init__(self, channel: grpc.Channel):
        method = "/pscluster.ps.ParameterServer/"
        self.stub = ps_pb2_grpc.ParameterServerStub(channel)
        self.push_unary = channel.unary_unary(
            method + "PushDense", request_serializer=_wire.encode_chunk,
            response_deserializer=ps_pb2.PushDenseResponse.FromString)
        self.push_stream = channel.stream_unary(
            method + "PushDenseStream", request_serializer=_wire.encode_chunk,
            response_deserializer=ps_pb2.PushDenseResponse.FromString)
        self.pull_unary = channel.unary_unary(
            method + "PullDense", request_serializer=ps_pb2.PullDenseRequest.SerializeToString,
            response_deserializer=_wire.decode_chunk)
        self.push_pull_batch = channel.unary_unary(
            method + "PushPullDenseBatch", request_serializer=_wire.encode_batch,
            response_deserializer=_wire.decode_batch)
        self.pull_stream = channel.unary_stream(
            method + "PullDenseStream",
            request_serializer=ps_pb2.PullDenseRequest.SerializeToString,
            response_deserializer=_wire.decode_chunk)


class _Current:
    """cluster._push_unary[shard] and the like: that call of the replica the shard's calls
    go to now (the head, as far as this client knows)."""

    def __init__(self, cluster: "Cluster", name: str):
        self._cluster, self._name = cluster, name

    def __getitem__(self, shard: int):
        c = self._cluster
        return getattr(c._replicas[shard][c._current[shard]], self._name)


class _Metadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds this Cluster's ps-client-id to every call (the shards tell its calls from other
    clients' by it: a restore it asks for does not count its own), and the request id of
    the call in progress on this thread (Cluster._call) as the ps-request-id metadata: the
    new head answers a retried update from the first call. (The keys are the C++ side's
    kClientIdKey and kRequestIdKey, common/call_metadata.h.)"""

    def __init__(self, local: threading.local, client_id: str):
        self._local = local
        self._client_id = ("ps-client-id", client_id)

    def _details(self, details):
        metadata = list(details.metadata or []) + [self._client_id]
        request_id = getattr(self._local, "request_id", None)
        if request_id:
            metadata.append(("ps-request-id", request_id))
        return details._replace(metadata=metadata) if hasattr(details, "_replace") else \
            _CallDetails(details, metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, d, metadata):
        self.method, self.timeout, self.metadata = d.method, d.timeout, metadata
        self.credentials = d.credentials
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)


def _check_addresses(shard_addresses: Sequence[str], timeout,
                     replicas: Optional[Sequence[Sequence[str]]]) -> None:
    """Cluster's arguments checked before any channel is opened."""
    if not shard_addresses or any(not a for a in shard_addresses):
        raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                      f"every shard needs an address; got {list(shard_addresses)}")
    _check_timeout(timeout)
    if replicas is not None and (len(replicas) != len(shard_addresses)
                                 or any(not r or not all(r) for r in replicas)):
        raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                      f"replicas must list every shard's replicas; got {list(replicas)}")


def _use_native(native: Optional[bool]) -> bool:
    """Whether a Cluster's dense calls go through the C++ client: by default when it is
    built and PSCLUSTER_NATIVE is not 0."""
    if native is None:
        native = _native is not None and os.environ.get("PSCLUSTER_NATIVE", "1") != "0"
    if native and _native is None:
        raise PsError(grpc.StatusCode.FAILED_PRECONDITION,
                      "native=True, but pscluster._native is not built (bazel build "
                      "//python:pscluster, or install the .deb)")
    return bool(native)


class Cluster:
    """Channels to every shard of one cluster. Thread-safe; close() (or `with`) when done.
    `replicas` (chain-replicated shards, ps_coordinator --replicas > 1): each shard's
    replicas, head first; a call a replica does not take (UNAVAILABLE: dead, cut off, or not
    the head) goes on to the next, with the same request id. connect() fills it in."""

    def __init__(self, shard_addresses: Sequence[str], timeout: float = 10.0,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 coordinator: Optional[str] = None, security: Optional[Security] = None,
                 replicas: Optional[Sequence[Sequence[str]]] = None,
                 native: Optional[bool] = None):
        _check_addresses(shard_addresses, timeout, replicas)
        self.addresses: List[str] = list(shard_addresses)
        self.timeout = timeout
        self.chunk_bytes = chunk_bytes
        self.security = security or Security()
        self._replica_addresses: List[List[str]] = (
            [list(r) for r in replicas] if replicas is not None else [[a] for a in self.addresses])
        self._replicated = any(len(r) > 1 for r in self._replica_addresses)
        self._local = threading.local()
        # Sent with every call to the shards (_Metadata; the C++ client sends the same).
        self.client_id: str = os.urandom(16).hex()
        self._closed = False
        self._open_replicas()
        self._open_coordinator(coordinator)
        # Shard fan-out; the async calls run on their own pool so that they never wait for
        # a fan-out thread their own caller holds.
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=4 * len(self.addresses), thread_name_prefix="pscluster-shard")
        self._async_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=8, thread_name_prefix="pscluster-async")
        self._lock = threading.Lock()
        self._specs: Dict[int, ps_pb2.TableSpec] = {}
        self._names: Dict[str, int] = {}
        self._registered: set = set()
        self._forgotten: set = set()  # registered, then a shard forgot them (_forgot_worker)
        self._native = None
        if _use_native(native):
            self._open_native(timeout, chunk_bytes)

    def _open_replicas(self) -> None:
        """A channel to every replica of every shard, and the calls that follow each
        shard's head."""
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        self._channels = []
        self._replicas: List[List[_Replica]] = []
        for shard_replicas in self._replica_addresses:
            self._replicas.append([])
            for address in shard_replicas:
                channel = self.security.channel(address, options)
                self._channels.append(channel)
                channel = grpc.intercept_channel(channel,
                                                 _Metadata(self._local, self.client_id))
                self._replicas[-1].append(_Replica(channel))
        self._current = [0] * len(self._replicas)
        self._stubs = _Current(self, "stub")
        self._push_unary = _Current(self, "push_unary")
        self._push_stream = _Current(self, "push_stream")
        self._pull_unary = _Current(self, "pull_unary")
        self._push_pull_batch = _Current(self, "push_pull_batch")
        self._pull_stream = _Current(self, "pull_stream")

    def _open_coordinator(self, coordinator: Optional[str]) -> None:
        self._coordinator_address = coordinator
        self._coordinator: Optional[coordinator_pb2_grpc.CoordinatorStub] = None
        self._coordinator_channel: Optional[grpc.Channel] = None
        if coordinator:
            self._coordinator_channel = self.security.channel(coordinator)
            self._coordinator = coordinator_pb2_grpc.CoordinatorStub(self._coordinator_channel)

    def _open_native(self, timeout: float, chunk_bytes: int) -> None:
        s = self.security
        self._native = _native.Client(
            self._replica_addresses, timeout, chunk_bytes, s.tls, s.ca or b"",
            s.cert or b"", s.key or b"", s.token or "", s.server_name or "",
            self.client_id)

    @property
    def native(self) -> bool:
        """Whether the dense data calls go through the C++ client (pscluster._native)."""
        return self._native is not None

    def _native_call(self, fn: Callable[..., T], *args) -> T:
        """fn(*args) on the C++ client; its error becomes a PsError (the shard it names)."""
        self._check_open()
        try:
            return fn(*args)
        except _native.Error as e:
            code, message = e.args
            named = _SHARD_NAMED.match(message)
            code = _CODES.get(code, grpc.StatusCode.UNKNOWN)
            raise PsError(code, self._forgot_worker(code, message),
                          int(named.group(1)) if named else None) from None

    @classmethod
    def from_shards(cls, shard_addresses: Sequence[str], timeout: float = 10.0,
                    **kwargs) -> "Cluster":
        """A cluster without a coordinator: the shards' addresses, by shard id."""
        return cls(shard_addresses, timeout=timeout, **kwargs)

    @property
    def num_shards(self) -> int:
        return len(self._replicas)

    def _check_open(self) -> None:
        if self._closed:
            raise PsError(grpc.StatusCode.FAILED_PRECONDITION,
                          "this Cluster is closed: connect again to use the cluster")

    def close(self) -> None:
        """Ends every call path (the C++ one too): later calls raise PsError. Idempotent."""
        self._closed = True
        self._native = None  # the C++ client and its channels go with it
        self._async_pool.shutdown(wait=True)
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
        return f"shard {shard} ({self._replica_addresses[shard][self._current[shard]]})"

    def _call(self, shard: int, fn: Callable[[ps_pb2_grpc.ParameterServerStub], T]) -> T:
        """fn(stub) on one shard; a gRPC error becomes a PsError naming the shard. A call the
        shard refused because every handler thread was busy (it changed nothing) is made
        again after a backoff, 1 ms doubling to 100 ms, for up to the timeout, as the C++
        client does: a push to several shards then lands on all of them, not some. So is a
        call refused by a shard that has just started and is still registering with the
        coordinator (it served nothing yet): a script that reads a view the moment it is
        complete may reach a shard a moment before it serves."""
        self._check_open()
        backoff, end = 0.001, time.monotonic() + self.timeout
        n = len(self._replicas[shard])
        if self._replicated:  # one id for every attempt (_RequestIds sends it)
            self._local.request_id = f"py-{id(self):x}-{next(_REQUEST_COUNTER)}"
        try:
            while True:
                at = self._current[shard]
                try:
                    return fn(self._stubs[shard])
                except grpc.RpcError as e:
                    failover = n > 1 and e.code() == grpc.StatusCode.UNAVAILABLE
                    refused = (e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                               and e.details() == THREADPOOL_EXHAUSTED) or _registering(e)
                    if not ((refused or failover) and time.monotonic() + backoff < end):
                        error = e
                        break
                    if failover:
                        with self._lock:
                            if self._current[shard] == at:  # not moved on by another call
                                self._current[shard] = (at + 1) % n
                # Jittered as the C++ client's (common/backoff.h): clients that lost the same
                # shard do not retry in lockstep.
                time.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(2 * backoff, 0.02 if n > 1 else 0.1)
        finally:
            self._local.request_id = None
        details = error.details()
        if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and details == THREADPOOL_EXHAUSTED:
            details += (" (every handler thread is busy, so the call was refused before any "
                        "handler ran and changed nothing: retry after a backoff, or give the "
                        "shard more --threads or add shards)")
        elif (error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
              and "message larger than max" in details):
            details += (" (gRPC's own limit on one message: a shard takes up to its "
                        "--max_chunk_bytes plus 64 KiB, this client sends up to "
                        f"{MAX_MESSAGE_BYTES} bytes; send less per call, or a smaller "
                        "chunk_bytes)")
        details = self._forgot_worker(error.code(), details)
        raise PsError(error.code(), f"{self._name(shard)}: {details}", shard) from None

    def _forgot_worker(self, code: grpc.StatusCode, message: str) -> str:
        """A shard that does not know a worker this Cluster registered (a restore rolled
        it back to a snapshot from before, or another client unregistered it): the next
        call of the worker registers it again (nothing re-sent here: a push may have landed
        on the other shards). The message, saying so (each shard's error of that call)."""
        forgot = _NOT_REGISTERED.search(message)
        if code != grpc.StatusCode.FAILED_PRECONDITION or not forgot:
            return message
        worker = int(forgot.group(1))
        with self._lock:
            if worker not in self._registered and worker not in self._forgotten:
                return message
            self._registered.discard(worker)
            self._forgotten.add(worker)
        return (message + " (the shard forgot it: a restore to a snapshot from before it "
                "registered, or another client unregistered it; this Cluster registers it "
                "again on its next call)")

    def _each(self, fn: Callable[[int], T]) -> List[T]:
        """fn(shard) on every shard in parallel (shard 0 in the calling thread, as the C++
        client does: no hand-off with one shard); raises the first error in shard order."""
        self._check_open()
        futures = [self._pool.submit(fn, s) for s in range(1, self.num_shards)]
        results, first = [], None
        try:
            results.append(fn(0))
        except Exception as e:  # noqa: BLE001 - re-raised below, after every shard ended
            results.append(None)
            first = e
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
            self._forgotten.discard(worker)

    def _ensure_registered(self, worker: int) -> None:
        with self._lock:
            if worker in self._registered:
                return
        self.register_worker(worker)

    # ---- tables ------------------------------------------------------------------------

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
                      worker: int = 0, **spec) -> int:
        """Creates a sparse table of rows of `dim` float32 values keyed by uint64 (keys <
        `key_space`, 0 = any), rows made on first touch by the initializer, and returns its
        id. `spec` as for create_dense."""
        if dim <= 0:
            raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"table {name_or_id}: dim must be > 0, got {dim}")
        return self._create(name_or_id, ps_pb2.TableSpec.SPARSE, worker, spec, dim=dim,
                            key_space=key_space)

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
        self._call(0, lambda stub: stub.CreateTable(req, timeout=self.timeout))
        self._each(lambda s: None if s == 0 else self._call(
            s, lambda stub: stub.CreateTable(req, timeout=self.timeout)))
        with self._lock:
            self._specs[table_id] = spec
            self._names[name] = table_id
        return table_id

    def _spec_at(self, table_id: int) -> ps_pb2.TableSpec:
        """Shard 0's spec of `table_id` (an empty one when there is none)."""
        req = ps_pb2.DescribeTableRequest(worker_id=0, table_id=table_id)
        try:
            return self._call(0, lambda stub: stub.DescribeTable(
                req, timeout=self.timeout)).spec
        except PsError as e:
            if e.code != grpc.StatusCode.NOT_FOUND:
                raise
            return ps_pb2.TableSpec()

    def describe(self, table: Union[str, int], worker: int = 0) -> List[ps_pb2.TableInfo]:
        """Every shard's TableInfo of the table (its range or rows, BSP's applied steps)."""
        req = ps_pb2.DescribeTableRequest(worker_id=worker, table_id=self._table_id(table))
        return self._each(lambda s: self._call(
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
        info = self._call(0, lambda stub: stub.DescribeTable(req, timeout=self.timeout))
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

    # ---- dense tensors -----------------------------------------------------------------

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
        self._each(lambda s: self._pull_shard(s, spec.table_id, step, worker,
                                              *shard_range(spec.size, s, self.num_shards), out))
        return out

    def _pull_shard(self, shard: int, table_id: int, step: int, worker: int, begin: int,
                    end: int, out: np.ndarray) -> None:
        req = ps_pb2.PullDenseRequest(worker_id=worker, step=step, table_id=table_id,
                                      offset=begin, length=end - begin,
                                      chunk_bytes=self.chunk_bytes)
        view = memoryview(out.reshape(-1)[begin:end]).cast("B")  # each chunk lands here
        nbytes = (end - begin) * 4
        if nbytes <= min(self.chunk_bytes, UNARY_PULL_BYTES):
            chunk = self._call(shard, lambda _: self._pull_unary[shard](req,
                                                                        timeout=self.timeout))
            if chunk.data.nbytes != nbytes:
                raise PsError(grpc.StatusCode.INTERNAL,
                              f"{self._name(shard)} answered {chunk.data.nbytes} bytes, "
                              f"expected {nbytes}", shard)
            view[:] = chunk.data
            return

        def stream(_) -> int:
            got = 0
            for chunk in self._pull_stream[shard](req, timeout=self.timeout):
                n = chunk.data.nbytes
                if chunk.offset * 4 != begin * 4 + got or n > nbytes - got or n % 4:
                    raise PsError(grpc.StatusCode.INTERNAL,
                                  f"{self._name(shard)} sent a chunk at offset {chunk.offset} "
                                  f"with {n} bytes after {got // 4} of {end - begin} values",
                                  shard)
                view[got:got + n] = chunk.data
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
        step, worker = _step_and_worker(step, worker)
        spec = self._spec_of_kind(table, worker)
        flat = _float32(grad, spec.size, f"table {spec.table_id}", "gradient")
        if self._native is None:  # the C++ client checks as it sends
            self._check_finite(spec, flat)
        self._ensure_registered(worker)
        if self._native is not None:
            self._native_call(self._native.push_dense, worker, spec.table_id, step, flat)
            return
        self._each(lambda s: self._push_shard(s, spec.table_id, step, worker,
                                              *shard_range(spec.size, s, self.num_shards), flat))

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
            self._call(shard, lambda _: self._push_unary[shard](chunk(begin, end - begin),
                                                                timeout=self.timeout))
            return
        chunks = (chunk(o, min(per_chunk, end - o)) for o in range(begin, end, per_chunk))
        self._call(shard, lambda _: self._push_stream[shard](chunks, timeout=self.timeout))

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
        self._each(lambda s: self._push_pull_shard(s, specs, flats, step, worker, outs, repeat))
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
            chunks = self._call(shard, lambda _: self._push_pull_batch[shard](
                batch, timeout=self.timeout))
        except PsError as err:
            if not pushed_before(err):
                raise
            pull_all()
            return
        if len(chunks) != len(batch):
            raise PsError(grpc.StatusCode.INTERNAL, f"{self._name(shard)} answered "
                          f"{len(chunks)} chunks for {len(batch)} tables", shard)
        for i, chunk in enumerate(chunks):
            b, e = ranges[i]
            if chunk.data.nbytes != (e - b) * 4:
                raise PsError(grpc.StatusCode.INTERNAL,
                              f"{self._name(shard)} answered {chunk.data.nbytes} bytes for "
                              f"table {specs[i].table_id}, expected {(e - b) * 4}", shard)
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
            chunks = list(self._call(shard, lambda stub: list(
                stub.ExportDense(req, timeout=self.timeout))))
            for c in chunks:
                n = len(c.values)
                c.step = step
                c.values[:] = flat[c.begin:c.begin + n]
            if b < e and sum(len(c.values) for c in chunks) != e - b:
                raise PsError(grpc.StatusCode.INTERNAL,
                              f"{self._name(shard)} exported {sum(len(c.values) for c in chunks)}"
                              f" values of [{b}, {e})", shard)
            self._call(shard, lambda stub: stub.ImportDense(iter(chunks), timeout=self.timeout))

        self._each(one)

    # ---- sparse rows -------------------------------------------------------------------

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
                resp = self._call(shard, lambda stub: stub.PullSparse(req, timeout=self.timeout))
                if len(resp.values) != part.size * spec.dim * 4:
                    raise PsError(grpc.StatusCode.INTERNAL,
                                  f"{self._name(shard)} answered {len(resp.values)} bytes for "
                                  f"{part.size} rows of {spec.dim}", shard)
                rows[part] = np.frombuffer(resp.values, np.float32).reshape(part.size, spec.dim)

        self._each(one)
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
                    self._call(s, lambda stub: stub.PushSparse(
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
            self._each(one)
        except PsError as e:
            # A shard's own refusal (its row limit) comes after the others applied theirs.
            done = [s for s in range(self.num_shards) if applied[s]]
            if not done:
                raise
            raise PsError(e.code, f"{e.message}; shard(s) {', '.join(map(str, done))} applied "
                          "their keys of this push (a sparse push is not atomic across "
                          "shards): push the other shards' keys again for this step once they "
                          "can take them, or restore a checkpoint", e.shard) from None

    # ---- futures -----------------------------------------------------------------------

    def submit(self, fn: Callable[..., T], *args, **kwargs) -> "concurrent.futures.Future[T]":
        """fn(*args, **kwargs) on the client's async pool (a Future; .result() raises the
        call's PsError)."""
        self._check_open()
        return self._async_pool.submit(fn, *args, **kwargs)

    def pull_dense_async(self, *args, **kwargs) -> "concurrent.futures.Future[np.ndarray]":
        return self.submit(self.pull_dense, *args, **kwargs)

    def push_dense_async(self, *args, **kwargs) -> "concurrent.futures.Future[None]":
        return self.submit(self.push_dense, *args, **kwargs)

    def push_pull_dense_async(self, *args, **kwargs
                              ) -> "concurrent.futures.Future[List[np.ndarray]]":
        return self.submit(self.push_pull_dense, *args, **kwargs)

    def pull_sparse_async(self, *args, **kwargs) -> "concurrent.futures.Future[np.ndarray]":
        return self.submit(self.pull_sparse, *args, **kwargs)

    def push_sparse_async(self, *args, **kwargs) -> "concurrent.futures.Future[None]":
        return self.submit(self.push_sparse, *args, **kwargs)

    # ---- clocks and snapshots ----------------------------------------------------------

    def stats(self) -> List[ps_pb2.StatsResponse]:
        """Every shard's Stats: its tables' counters and the workers' clocks."""
        req = ps_pb2.StatsRequest()
        return self._each(lambda s: self._call(s, lambda stub: stub.Stats(req,
                                                                         timeout=self.timeout)))

    def clock(self, worker: int = 0) -> int:
        """The steps `worker` has pushed (max step + 1 over every table), on the shard that
        has seen fewest: the step it resumes at. 0 before its first push. A worker that
        is not registered (never was, or unregistered) has no clock: PsError NOT_FOUND."""
        clocks = []
        for shard, st in enumerate(self.stats()):
            clock = next((c.clock for c in st.workers if c.worker_id == worker), None)
            if clock is None:
                raise PsError(grpc.StatusCode.NOT_FOUND,
                              f"{self._name(shard)}: worker {worker} is not registered (it "
                              f"never was, or it unregistered): register_worker({worker}) "
                              "first", shard)
            clocks.append(clock)
        return min(clocks)

    def unregister_worker(self, worker: int) -> None:
        """`worker` leaves for good: BSP steps stop waiting for it."""
        req = ps_pb2.UnregisterWorkerRequest(worker_id=worker)
        self._each(lambda s: self._call(
            s, lambda stub: stub.UnregisterWorker(req, timeout=self.timeout)))
        with self._lock:
            self._registered.discard(worker)

    def wait_for_workers(self, count: int, timeout: Optional[float] = None) -> List[int]:
        """Waits (bounded: `timeout`, default the client's) until `count` workers have
        registered with every shard, so that the first BSP step waits for all of them;
        returns the registered ids. The shards have no blocking call for this: it polls
        Stats, backing off from 5 to 100 ms, so a worker that registers and leaves again
        (unregister_worker) between two polls is not seen: leave only after every worker
        has started."""
        def registered() -> Tuple[bool, List[List[int]]]:
            seen = [sorted(c.worker_id for c in st.workers) for st in self.stats()]
            return all(len(ids) >= count for ids in seen), seen

        done, seen = self._poll(registered, timeout)
        if not done:
            raise PsError(grpc.StatusCode.DEADLINE_EXCEEDED,
                          f"waited for {count} workers to register; the shards have "
                          f"{seen} (start the others, or check their logs)")
        return seen[0]

    def _poll(self, check: Callable[[], Tuple[bool, T]],
              timeout: Optional[float]) -> Tuple[bool, T]:
        """check() until it says done or `timeout` (default the client's) runs out, backing
        off from 5 to 100 ms between tries: (done, what the last try saw)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        delay = 0.005
        while True:
            done, seen = check()
            if done or time.monotonic() + delay > deadline:
                return done, seen
            time.sleep(delay * random.uniform(0.5, 1.0))  # jitter, as in _call
            delay = min(2 * delay, 0.1)

    def snapshots(self) -> List[List[ps_pb2.SnapshotInfo]]:
        """Every shard's snapshots (ListSnapshots), ascending step."""
        req = ps_pb2.ListSnapshotsRequest()
        return [list(r.snapshots) for r in self._each(lambda s: self._call(
            s, lambda stub: stub.ListSnapshots(req, timeout=self.timeout)))]

    def restore(self, step: int, force: bool = False, timeout: Optional[float] = None) -> None:
        """Every shard back to its snapshot of `step` (a checkpoint: see checkpoints()),
        which becomes the newest: the coordinator drops the later checkpoints and the shards
        their snapshots, so checkpoints taken from here on are this run's. Refused while
        ps_worker processes are alive, or other clients (another process's Cluster) push
        or pull as a worker, or did within the coordinator's heartbeat timeout, unless
        `force`; this Cluster's own calls do not count (the shards tell them by its
        client_id). With replicated shards it returns once every chain has all its replicas
        again (wait_for_chains). Without a coordinator (Cluster.from_shards), the shards
        alone roll back and keep their later snapshots. The workers this Cluster registered
        are registered again before it returns (a snapshot from before one registered does
        not know it). `timeout`: of the shards' reading the snapshot back (default: the
        client's, at least 10 minutes); one that runs out says which shards rolled back."""
        step = _whole(step, "step", 0, 2 ** 63 - 1)
        timeout = max(self.timeout, 600.0) if timeout is None else timeout
        if self._coordinator is None:
            req = ps_pb2.RestoreRequest(step=step)
            self._each(lambda s: self._call(s, lambda stub: stub.Restore(
                req, timeout=timeout)))
        else:
            self._coord("RestoreCheckpoint", coordinator_pb2.RestoreCheckpointRequest(
                step=step, force=force, client_id=self.client_id), timeout)
            # Replicated shards: each head is alone until its backups have copied the
            # restored state (its death then would lose the shard): back once they have.
            self.wait_for_chains()
        with self._lock:
            own = sorted(self._registered)
        for worker in own:  # a no-op where the snapshot knows the worker
            self.register_worker(worker)

    # ---- the coordinator ---------------------------------------------------------------

    def _coord(self, method: str, request: Message, timeout: Optional[float] = None):
        self._check_open()
        if self._coordinator is None:
            raise PsError(grpc.StatusCode.FAILED_PRECONDITION,
                          "this cluster has no coordinator (Cluster.from_shards)")
        return _coordinator_call(self._coordinator, self._coordinator_address, method, request,
                                 self.timeout if timeout is None else timeout)

    def wait_for_chains(self, timeout: Optional[float] = None) -> bool:
        """Replicated shards (ps_coordinator --replicas > 1): waits (bounded: `timeout`,
        default the client's) until every live replica of every shard is in its chain
        again, as after set_dense or restore, which leave the head alone while the others
        copy its state back: until then the head's death loses the shard (a replica that
        died is not waited for). True when they are; False (said on stderr) when the time
        ran out, or at once without a coordinator."""
        if self._coordinator is None:
            return False

        def whole() -> Tuple[bool, List[int]]:
            v = self.view()
            chains = {c.shard: set(c.replicas) for c in v.chains}
            short = sorted({m.id for m in v.members
                            if m.role == coordinator_pb2.SHARD and m.alive
                            and m.id in chains and m.replica not in chains[m.id]})
            return not short, short

        done, short = self._poll(whole, timeout)
        if not done:
            print(f"pscluster: the chains of shard(s) {short} have not all their live "
                  "replicas again: a head lost now loses its shard", file=sys.stderr, flush=True)
        return done

    def shard_incarnations(self) -> Optional[Dict[int, int]]:
        """Each unreplicated shard's incarnation in the coordinator's view (it grows when the
        shard registers again: a restart, with its snapshot's state or none); None without a
        coordinator or with replicated shards, whose chains carry the state over."""
        if self._coordinator is None:
            return None
        v = self.view()
        if v.replicas > 1:
            return None
        return {m.id: m.incarnation for m in v.members if m.role == coordinator_pb2.SHARD}

    def view(self) -> coordinator_pb2.ClusterView:
        """The coordinator's cluster view (GetView)."""
        return self._coord("GetView", coordinator_pb2.GetViewRequest())

    def status(self) -> dict:
        """The coordinator's view as a dict (field names as in coordinator.proto); without a
        coordinator, just the shard addresses."""
        if self._coordinator is None:
            return {"num_shards": self.num_shards, "shard_addresses": list(self.addresses)}
        return _to_dict(self.view())

    def checkpoint(self, metric: Optional[float] = None,
                   timeout: Optional[float] = None) -> dict:
        """A cluster checkpoint now (the coordinator snapshots every shard at the step the
        tables reached and answers once every snapshot is durable): {step, metric, ...}.
        Checkpoints are named by step: while the tables have not passed the newest one's
        step, that one is answered with earlier=True (said on stderr), and what changed
        since at that step (ASP pushes of earlier steps, new tables) is not in it."""
        req = coordinator_pb2.CheckpointRequest(has_metric=metric is not None,
                                                metric=metric or 0.0)
        record = self._coord("Checkpoint", req, timeout)
        if record.earlier:
            print(f"pscluster: no new checkpoint: the tables have not passed step "
                  f"{record.step}, the newest checkpoint's (what changed since at that step "
                  "is not in it; train past it, then checkpoint)", file=sys.stderr, flush=True)
        return _to_dict(record)

    def checkpoints(self) -> List[dict]:
        """The complete cluster checkpoints, ascending step."""
        return [_to_dict(c) for c in self.view().checkpoints]

    def switch_mode(self, mode: str, at_step: int = 0) -> dict:
        """Schedules a live switch of every worker's training mode (ps, allreduce, fsdp,
        pipeline) at `at_step` (0: the next step boundary no worker has reached)."""
        modes = {k.lower(): v for k, v in coordinator_pb2.TrainingMode.items()}
        req = coordinator_pb2.SwitchModeRequest(
            mode=_enum(modes, mode, "mode"), at_step=_whole(at_step, "at_step", 0, 2 ** 63 - 1))
        return _to_dict(self._coord("SwitchMode", req))


def _mix64(x: np.ndarray) -> np.ndarray:
    """common/sharding.cc's Mix64 (splitmix64's finaliser), elementwise on uint64."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _float32(array, size: int, what: str, name: str) -> np.ndarray:
    """`array` as a flat little-endian float32 array of `size` values (no copy when it is
    one already); a PsError (INVALID_ARGUMENT) naming what is wrong otherwise."""
    array = np.asarray(array)
    if array.dtype != np.float32:
        raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                      f"{what}: the {name} must be float32, not {array.dtype}")
    if array.size != size:
        raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                      f"{what} holds {size} values; the {name} has {array.size}")
    flat = np.ascontiguousarray(array).reshape(-1)
    return flat.astype("<f4") if flat.dtype.byteorder == ">" else flat


def _output(out: Optional[np.ndarray], size: int, what: str) -> np.ndarray:
    if out is None:
        return np.empty(size, dtype=np.float32)
    if (not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.size != size
            or not out.flags.c_contiguous or not out.flags.writeable):
        raise PsError(grpc.StatusCode.INVALID_ARGUMENT,
                      f"{what}: the output must be a writable C-contiguous float32 array of "
                      f"{size} values")
    return out


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


def _coordinator_call(stub: coordinator_pb2_grpc.CoordinatorStub, address: str, method: str,
                      request: Message, timeout: float):
    """stub.method(request); a gRPC error becomes a PsError naming the coordinator."""
    try:
        return getattr(stub, method)(request, timeout=timeout)
    except grpc.RpcError as e:
        details = e.details()
        if e.code() == grpc.StatusCode.UNIMPLEMENTED and not details:
            details = ("the server there does not serve this call: is it a ps_coordinator's "
                       "address (not a ps_server's)?")
        raise PsError(e.code(), f"coordinator ({address}): {details}") from None


def connect(coordinator_address: str, timeout: float = 10.0,
            wait_until_complete: bool = False, *, tls_ca: Optional[str] = None,
            tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
            token: Optional[str] = None, token_file: Optional[str] = None,
            server_name: Optional[str] = None, **kwargs) -> Cluster:
    """A Cluster from the coordinator's view: one channel per shard of its shard map.
    With wait_until_complete, first waits (bounded by `timeout`) until every shard has
    registered. TLS and token arguments: pscluster.security (each defaults to its
    PSCLUSTER_* environment variable)."""
    _check_timeout(timeout)
    try:
        security = Security.load(tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key,
                                 token=token, token_file=token_file, server_name=server_name)
    except ValueError as e:
        raise PsError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
    channel = security.channel(coordinator_address)
    try:
        view = _coordinator_call(
            coordinator_pb2_grpc.CoordinatorStub(channel), coordinator_address, "GetView",
            coordinator_pb2.GetViewRequest(wait_until_complete=wait_until_complete), timeout)
    finally:
        channel.close()
    missing = [i for i, a in enumerate(view.shard_addresses) if not a]
    if not view.shard_addresses or missing:
        raise PsError(grpc.StatusCode.UNAVAILABLE,
                      f"coordinator ({coordinator_address}): shards {missing} of "
                      f"{view.num_shards} have not registered")
    replicas = ([list(c.addresses) for c in view.chains]
                if view.replicas > 1 and len(view.chains) == len(view.shard_addresses) else None)
    return Cluster(list(view.shard_addresses), timeout=timeout,
                   coordinator=coordinator_address, security=security, replicas=replicas,
                   **kwargs)
