"""The plumbing under Cluster's shard calls: a channel to every replica of every shard, the
call metadata, the retries and failover of one call, and the fan-out of a call to every
shard. The C++ data path (pscluster._native) is opened here too, as the other transport.
"""
from __future__ import annotations

import concurrent.futures
import itertools
import os
import random
import re
import threading
import time
from typing import Callable, List, Optional, TypeVar

import grpc

from pscluster import _wire
from pscluster._errors import PsError
from pscluster.proto import ps_pb2, ps_pb2_grpc
from pscluster.security import Security

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
# gRPC's own answer when every handler thread of a shard is busy (common/grpc_status.h).
THREADPOOL_EXHAUSTED = "Server Threadpool Exhausted"
# What a shard started with --coordinator answers (UNAVAILABLE) until it has registered
# (ServingGate::CheckServing): it served no data call yet, so the call is made
# again within the client's timeout.
REGISTERING = "is registering with the coordinator"

_REQUEST_COUNTER = itertools.count(1)
_CODES = {c.value[0]: c for c in grpc.StatusCode}
_SHARD_NAMED = re.compile(r"shard (\d+) \(")  # how the C++ client's errors begin


def _registering(e: grpc.RpcError) -> bool:
    return e.code() == grpc.StatusCode.UNAVAILABLE and REGISTERING in (e.details() or "")


class ShardStub:
    """One ps_server's three services (ShardData, ShardAdmin, ShardReplication) over one
    channel, as one stub: their method names do not overlap, so stub.Stats(...) is the
    admin service's (as the C++ client's ShardStub, client/ps/shard_stub.h)."""

    def __init__(self, channel: grpc.Channel):
        self._stubs = (ps_pb2_grpc.ShardDataStub(channel), ps_pb2_grpc.ShardAdminStub(channel),
                       ps_pb2_grpc.ShardReplicationStub(channel))

    def __getattr__(self, name: str):
        for stub in self._stubs:
            if hasattr(stub, name):
                return getattr(stub, name)
        raise AttributeError(f"no shard service has a method {name}")


class _Replica:
    """The calls to one ps_server: its stub, and the bulk calls with DenseChunk coded by
    hand (_wire.py: one copy out, none in)."""

    def __init__(self, channel: grpc.Channel):
        method = "/pscluster.ps.ShardData/"
        self.stub = ShardStub(channel)
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


class _Metadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds this Cluster's ps-client-id to every call (the shards tell its calls from other
    clients' by it: a restore it asks for does not count its own), and the request id of
    the call in progress on this thread (_Shards.call) as the ps-request-id metadata: the
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


def _explain(error: grpc.RpcError) -> str:
    """The error's details, with what to do about the refusals a caller can act on."""
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
    return details


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


def _open_native(replica_addresses: List[List[str]], timeout: float, chunk_bytes: int,
                 security: Security, client_id: str):
    """The C++ client on the same replicas, credentials and client id as the channels."""
    s = security
    return _native.Client(
        replica_addresses, timeout, chunk_bytes, s.tls, s.ca or b"", s.cert or b"",
        s.key or b"", s.token or "", s.server_name or "", client_id)


def _native_error(e: Exception):
    """The C++ client's error as (grpc code, message, the shard it names or None)."""
    code, message = e.args
    named = _SHARD_NAMED.match(message)
    return (_CODES.get(code, grpc.StatusCode.UNKNOWN), message,
            int(named.group(1)) if named else None)


class _Shards:
    """Every shard's replicas and the head each shard's calls go to now. call() makes one
    call on a shard, with its retries and failover; each() makes a call on every shard at
    once. `on_error(code, message)` may add to a failed call's message (Cluster says there
    that a shard forgot a worker). Thread-safe."""

    def __init__(self, replica_addresses: List[List[str]], timeout: float,
                 security: Security, client_id: str,
                 on_error: Callable[[grpc.StatusCode, str], str]):
        self.replica_addresses = replica_addresses
        self.timeout = timeout
        self._on_error = on_error
        self._replicated = any(len(r) > 1 for r in replica_addresses)
        self._local = threading.local()
        self._lock = threading.Lock()
        self.closed = False
        self._open(security, client_id)
        # The fan-out's own pool: Cluster's async calls run on another, so that they never
        # wait for a fan-out thread their own caller holds.
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=4 * len(replica_addresses), thread_name_prefix="pscluster-shard")

    def _open(self, security: Security, client_id: str) -> None:
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        self._channels = []
        self._replicas: List[List[_Replica]] = []
        for shard_replicas in self.replica_addresses:
            self._replicas.append([])
            for address in shard_replicas:
                channel = security.channel(address, options)
                self._channels.append(channel)
                channel = grpc.intercept_channel(channel, _Metadata(self._local, client_id))
                self._replicas[-1].append(_Replica(channel))
        self._current = [0] * len(self._replicas)

    def __len__(self) -> int:
        return len(self._replicas)

    def head(self, shard: int) -> _Replica:
        """The replica `shard`'s calls go to now (its head, as far as this client knows)."""
        return self._replicas[shard][self._current[shard]]

    @property
    def stubs(self) -> List[ShardStub]:
        return [self.head(s).stub for s in range(len(self))]

    def name(self, shard: int) -> str:
        return f"shard {shard} ({self.replica_addresses[shard][self._current[shard]]})"

    def check_open(self) -> None:
        if self.closed:
            raise PsError(grpc.StatusCode.FAILED_PRECONDITION,
                          "this Cluster is closed: connect again to use the cluster")

    def close(self) -> None:
        self.closed = True
        self._pool.shutdown(wait=True)
        for c in self._channels:
            c.close()

    def call(self, shard: int, fn: Callable[[ShardStub], T]) -> T:
        """fn(stub) on one shard; a gRPC error becomes a PsError naming the shard. A call the
        shard refused because every handler thread was busy (it changed nothing) is made
        again after a backoff, 1 ms doubling to 100 ms, for up to the timeout, as the C++
        client does: a push to several shards then lands on all of them, not some. So is a
        call refused by a shard that has just started and is still registering with the
        coordinator (it served nothing yet): a script that reads a view the moment it is
        complete may reach a shard a moment before it serves."""
        self.check_open()
        if self._replicated:  # one id for every attempt (_Metadata sends it)
            self._local.request_id = f"py-{id(self):x}-{next(_REQUEST_COUNTER)}"
        try:
            result, error = self._attempts(shard, fn)
        finally:
            self._local.request_id = None
        if error is None:
            return result
        details = self._on_error(error.code(), _explain(error))
        raise PsError(error.code(), f"{self.name(shard)}: {details}", shard) from None

    def _attempts(self, shard: int, fn: Callable[[ShardStub], T]):
        """(fn's result, None), or (None, the last gRPC error) once it is not worth retrying
        or the timeout would run out."""
        backoff, end = 0.001, time.monotonic() + self.timeout
        n = len(self._replicas[shard])
        while True:
            at = self._current[shard]
            try:
                return fn(self.head(shard).stub), None
            except grpc.RpcError as e:
                failover = n > 1 and e.code() == grpc.StatusCode.UNAVAILABLE
                refused = (e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                           and e.details() == THREADPOOL_EXHAUSTED) or _registering(e)
                if not ((refused or failover) and time.monotonic() + backoff < end):
                    return None, e
                if failover:
                    with self._lock:
                        if self._current[shard] == at:  # not moved on by another call
                            self._current[shard] = (at + 1) % n
            # Jittered as the C++ client's (common/backoff.h): clients that lost the same
            # shard do not retry in lockstep.
            time.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(2 * backoff, 0.02 if n > 1 else 0.1)

    def each(self, fn: Callable[[int], T]) -> List[T]:
        """fn(shard) on every shard in parallel (shard 0 in the calling thread, as the C++
        client does: no hand-off with one shard); raises the first error in shard order."""
        self.check_open()
        futures = [self._pool.submit(fn, s) for s in range(1, len(self))]
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
