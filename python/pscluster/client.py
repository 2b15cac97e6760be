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
# The calls live in one module per part (Cluster's bases below); this one builds a Cluster,
# ends it, and re-exports the names other modules and tests import from pscluster.client.
from __future__ import annotations

import concurrent.futures
import os
import random
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

import grpc
import numpy as np  # noqa: F401 - the async calls' annotations name it

from pscluster._checkpoints import _CheckpointCalls
from pscluster._coordinator import _CoordinatorCalls, _CoordinatorChannel, _coordinator_call
from pscluster._dense import _DenseCalls, shard_range
from pscluster._errors import PsError, _check_timeout
from pscluster._shards import DEFAULT_CHUNK_BYTES, _open_native, _Shards, _use_native
from pscluster._sparse import _SparseCalls
from pscluster._tables import _TableCalls
from pscluster._workers import _WorkerCalls
from pscluster.proto import coordinator_pb2, coordinator_pb2_grpc, ps_pb2
from pscluster.security import Security

# Imported from here before the split: pscluster.torch takes _already_pushed, and scripts
# may read the limits.
from pscluster._errors import _already_pushed  # noqa: F401
from pscluster._shards import (MAX_MESSAGE_BYTES, THREADPOOL_EXHAUSTED,  # noqa: F401
                               UNARY_PULL_BYTES)
from pscluster._sparse import SPARSE_PUSH_BYTES  # noqa: F401
from pscluster._tables import NAME_PROBES  # noqa: F401

__all__ = ["Cluster", "PsError", "connect", "shard_range"]

T = TypeVar("T")


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


class Cluster(_TableCalls, _DenseCalls, _SparseCalls, _WorkerCalls, _CheckpointCalls,
              _CoordinatorCalls):
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
        replica_addresses = ([list(r) for r in replicas] if replicas is not None
                             else [[a] for a in self.addresses])
        # Sent with every call to the shards (_shards._Metadata; the C++ client sends the same).
        self.client_id: str = os.urandom(16).hex()
        # Guards the tables' and the workers' bookkeeping below.
        self._lock = threading.Lock()
        self._specs: Dict[int, ps_pb2.TableSpec] = {}
        self._names: Dict[str, int] = {}
        self._registered: set = set()
        self._forgotten: set = set()  # registered, then a shard forgot them (_forgot_worker)
        self._shards = _Shards(replica_addresses, timeout, self.security, self.client_id,
                               self._forgot_worker)
        self._coordinator = (_CoordinatorChannel(coordinator, self.security)
                             if coordinator else None)
        # The async calls' own pool: a fan-out thread their caller holds never blocks them.
        self._async_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=8, thread_name_prefix="pscluster-async")
        self._native = None
        if _use_native(native):
            self._native = _open_native(replica_addresses, timeout, chunk_bytes,
                                        self.security, self.client_id)

    @classmethod
    def from_shards(cls, shard_addresses: Sequence[str], timeout: float = 10.0,
                    **kwargs) -> "Cluster":
        """A cluster without a coordinator: the shards' addresses, by shard id."""
        return cls(shard_addresses, timeout=timeout, **kwargs)

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    def close(self) -> None:
        """Ends every call path (the C++ one too): later calls raise PsError. Idempotent."""
        self._shards.closed = True
        self._native = None  # the C++ client and its channels go with it
        self._async_pool.shutdown(wait=True)
        self._shards.close()
        if self._coordinator is not None:
            self._coordinator.close()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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
            time.sleep(delay * random.uniform(0.5, 1.0))  # jitter, as in _Shards.call
            delay = min(2 * delay, 0.1)

    # ---- futures -----------------------------------------------------------------------

    def submit(self, fn: Callable[..., T], *args, **kwargs) -> "concurrent.futures.Future[T]":
        """fn(*args, **kwargs) on the client's async pool (a Future; .result() raises the
        call's PsError)."""
        self._shards.check_open()
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
